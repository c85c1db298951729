// Command transformer trains a small character-level transformer
// (models/transformer) on Newton's Opticks, which ships with every Go
// toolchain ($(go env GOROOT)/src/testdata/Isaac.Newton-Opticks.txt), and
// generates text with it — data-parallel training and pipeline-parallel
// generation when run under gdistrun.
//
// # Usage
//
// From the repository root:
//
//	go run ./examples/transformer train -duration 3m -out out/opticks.gdc -plot out/loss.png
//	go run ./examples/transformer generate -ckpt out/opticks.gdc -prompt "Light is" -n 200
//
//	go run ./cmd/gdistrun -n 2 -- go run ./examples/transformer train -duration 3m -out out/opticks.gdc
//	go run ./cmd/gdistrun -n 2 -- go run ./examples/transformer generate -ckpt out/opticks.gdc -prompt "Light is" -n 200
//
// # train
//
// train holds out the last -val-frac (10%) of the text, trains the model
// (by default transformer.DefaultConfig: context 64, width 64, 4 heads, 2
// blocks) with train/optim's Adam (-lr 3e-3, gradients clipped at 1; bit
// for bit Gorgonia's AdamSolver, with a state that can be saved) on batches of -batch
// (16) random windows, validates every -eval-every (100) steps on
// -eval-windows (64) fixed windows of the held-out tail, and stops after
// -steps steps or -duration (3m) — or at the next step after Ctrl-C, still
// saving. Progress goes to stderr (a bar on a terminal, a line every tenth
// of the run otherwise), validation lines and, at the end, the loss curve
// to stdout. Rank 0 writes the checkpoint (-out, default out/opticks.gdc;
// out/ is gitignored) and, with -plot, a PNG of the curves.
//
// Under gdistrun -n N each rank samples its own batches (seeded by -seed
// and its rank), and package ddp averages the gradients before every Adam
// step, so the ranks stay identical (checked at the end) and a step trains
// on N·batch windows. The DDP wraps the model's parameters before the
// forward pass is built (transformer.NewStage, ddp.Wrap, then
// transformer.NewTrainerFor with WithHook(d.Hook)), so every use of a
// parameter goes through its DDP hook and each gradient bucket (-bucket-kb,
// 256 KiB: two for the default model) is all-reduced as soon as backprop has
// produced it, overlapping the rest of the backward pass. At the end rank 0
// prints how long the all-reduces were in flight per step and how much of
// that the step still waited for after backprop. The ranks agree every
// step, through the all-reduce that averages the logged loss, on whether to
// stop.
//
// With -pipeline (under gdistrun -n N, N >= 2) the model's layers are split
// evenly into N stages instead, one per rank (package pipeline, GPipe with
// -micro-batches micro-batches per step): each rank holds and updates only
// its own layers, every stage draws the same global batch of -batch
// windows, and there is no validation (no rank holds the whole model) and
// no -out file. At the end rank 0 prints every stage's parameter hash.
//
// With -shard zero1, zero2 or full the data-parallel ranks split the
// training state (package ddp's ZeRO, package fsdp with one unit per
// layer; the validation and the saved model gathered from the pieces),
// training bitwise as DDP on two ranks; -ckpt-dir then saves sharded
// checkpoints, each rank its part and its batch generator's state, which
// resume on any number of ranks and in any mode (each rank's batch stream
// restarting from its seed when the number of ranks changed).
//
// With -ckpt-dir DIR training saves a checkpoint (package dist/ckpt) every
// -ckpt-every (100) steps and at the end — parameters, Adam's moments and
// iteration count, the step and the batch generator's state — stalling only
// for a copy of the state (the write runs on another goroutine). Under DDP
// rank 0 writes DIR/ckpt-<step>.gdc with every rank's generator state in
// it; with -pipeline each stage writes its own layers to
// DIR/stage<k>/ckpt-<step>.gdc. When DIR holds checkpoints, training
// resumes from the newest step every rank (every stage) has intact, passing
// over torn files, after checking that the ranks agree on the state; the
// result is bit for bit that of a run never interrupted (-duration counts
// from the resume). Under gdistrun -max-restarts N a killed rank costs at
// most -ckpt-every steps:
//
//	go run ./cmd/gdistrun -max-restarts 3 -n 2 -- go run ./examples/transformer train -steps 3000 -ckpt-dir out/tf-ckpt
//	go run ./cmd/gdistrun -max-restarts 3 -n 2 -- go run ./examples/transformer train -pipeline -steps 3000 -ckpt-dir out/tf-pipe
//
// # generate
//
// generate continues -prompt by -n characters, sampling at -temperature
// (0: greedy) with a generator seeded by -seed, and prints the text to
// stdout and the speed to stderr. On one process it runs
// transformer.Predictor with transformer.Generate. Under gdistrun -n N it is
// an N-stage pipeline (package pipeline): the model's layers (0 embedding,
// 1..L blocks, L+1 head) are split into N contiguous stages (-split sets the
// first layer of stages 1..N-1; the default splits evenly), rank r reads
// the checkpoint header (transformer.LoadConfig), then only its stage's
// tensors (transformer.LoadLayers), and runs them; hidden states flow rank
// 0 -> 1 -> ... -> N-1, and the last rank samples each token and sends it
// back to rank 0 for the next step. The text is
// identical to the one-process text for the same checkpoint, prompt and
// seed (the tests check it for 2 and 3 stages in one process and for 2 OS
// processes over TCP). A model with a tied head (embedding and head sharing
// a matrix) cannot be split that way and generates on one process only.
//
// # safetensors
//
// A model leaves the Go world and comes back as safetensors, the format
// torch and Hugging Face share, its parameters named as Hugging Face's
// GPT-2 names them (models/transformer documents the table): train -out
// and generate -ckpt take a .safetensors file as well as a gdist
// checkpoint, and convert turns one into the other:
//
//	go run ./examples/transformer convert -in out/opticks.gdc -out out/opticks.safetensors
//	go run ./examples/transformer generate -ckpt out/opticks.safetensors -prompt "Light is"
//	go run ./examples/transformer convert -in gpt2-like.safetensors -heads 12 -out out/model.gdc
//
// -heads is needed only for a file that does not record gdist's
// configuration in its metadata (one written elsewhere).
package main
