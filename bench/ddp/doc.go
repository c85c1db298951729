// Command ddp benchmarks gdist's DistributedDataParallel wrapper with ranks
// as separate OS processes over loopback TCP (or shared memory, -transport).
//
// It re-executes itself once per rank (the job travels in the
// GDIST_BENCH_JOB environment variable, with the torchrun-style RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT and GDIST_TOKEN), so a single
// `go run ./bench/ddp` runs everything. Every rank trains an mlp.Model on
// synthetic data with hooks at the point of use (mlp.Model.ForwardHooked
// with DDP.Hook) and an Adam solver wrapped by DDP.Solver, and reports the
// timed steps: wall time, forward+backward time, the DDP's communication
// time and exposed (waited-for) communication time, and the CPU time the
// process used.
//
// Part (a), scaling: the MNIST MLP 784-256-128-10, float32, batch 64 per
// rank, GOMAXPROCS=1 per rank, as plain Gorgonia on one process, as DDP on
// one rank and as DDP on two ranks; it prints samples/s and the scaling
// efficiency thr(2)/(2*thr(1)). Configurations are run -reps times,
// interleaved, and the median run is reported. In the same run it measures a
// raw-socket baseline between the two rank processes: 8-byte ping-pong
// latency, one-way streaming rate, and the time of the exchange a 2-rank ring
// all-reduce of the gradients performs (two rounds of half the bytes each
// way), against which the DDP's all-reduce time is given as a ratio.
// -transport picks the transport of the 2-rank runs, a comma-separated list
// of GDIST_TRANSPORT values, the ranks joining with gdist.InitFromEnv: tcp
// (the default), shm (shared memory between the ranks of this host; Linux)
// and auto (shared memory where it sets up, gdist.InitFromEnv's default):
// each is one more configuration, interleaved with the others in every repetition,
// with its own efficiency lines naming the transport and how rank 0 reached
// its peer (also in each rank's JSON result), so TCP and shared memory
// compare within a run.
//
// Part (b), overlap: a deep model (-layers layers of -width x -width, one
// layer per bucket, batch 128 per rank) on a slow link, simulated by a
// bandwidth limiter around the TCP transport (a token bucket on each rank's
// outgoing sends; one table per -link speed, 400 and 1000 MB/s by default),
// with overlap on (hooks at the point of use), off (ddp.WithOverlap(false))
// and with all hooks created up front (ddp.Hooked), which trains identically
// but cannot overlap. It prints communication and exposed communication per
// step and the ratio of exposed time with overlap on and off. These ranks
// run with GOMAXPROCS=2 (-overlap-procs): with one P, the goroutines that
// move a bucket (the group's worker, the TCP reader, timers) only run when
// the backward pass's goroutine is preempted, and communication crawls.
//
// On a machine with few cores, two ranks with GOMAXPROCS=1 use two of them;
// other load on the machine shows as a cpu % well below 100 and makes the
// figures noisy, which is why runs are repeated and interleaved.
//
// # Usage
//
//	go run ./bench/ddp                      # both parts
//	go run ./bench/ddp -part scaling -steps 400 -reps 5
//	go run ./bench/ddp -part scaling -reps 5 -transport tcp,shm
//	go run ./bench/ddp -part overlap -link 200 -overlap-steps 20
//	go run ./bench/ddp -cpuprofile /tmp/prof # pprof files per rank and run
//
// Run with -h for every flag.
package main
