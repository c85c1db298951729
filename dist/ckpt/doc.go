// Package ckpt is distributed checkpointing on top of train/checkpoint:
// saving a job's training state every N steps or T seconds without stalling
// training for longer than a copy of the state, resuming every rank from
// the same step, and checking that the ranks hold the same state before
// the first step.
//
// Call New on every rank with the checkpoint directory, then Resume (a
// collective) before the first step, Verify, and Step after every step.
//
// # Usage
//
// Every rank runs:
//
//	m, err := ckpt.New(pg, "ckpt", ckpt.WithEvery(100), ckpt.WithKeep(3))
//	if err != nil { ... }
//	defer m.Close()
//	r, err := m.Resume(ctx) // a collective
//	if err != nil { ... }   // ErrNoCommonStep, or a group error
//	start := int64(0)
//	if !r.Fresh() {
//		// restore parameters (r.File.Tensor(name)), the solver
//		// (optim.FromCheckpoint(r.State.Optimizer)), the sampler
//		// (UnmarshalBinary(r.State.Sampler)) and the RNG (r.State.RNG)
//		start = r.Step
//	}
//	if err := m.Verify(ctx, live()); err != nil { ... } // *MismatchError
//	for step := start + 1; step <= steps; step++ {
//		// train one step
//		if _, err := m.Step(ctx, step, live); err != nil { ... }
//	}
//	if err := m.Close(); err != nil { ... } // the last write
//
// where live returns a *checkpoint.State of the model's parameters, the
// solver's state (optim's State().Checkpoint()), step, epoch, sampler
// position and RNG state. Pipeline stages add ckpt.WithStage(k) and pass
// only their own layers.
//
// # Saving
//
// Saves come every WithEvery steps, or (WithInterval) when a time has
// passed on rank 0's clock, which then tells the others with a one-float
// broadcast per step, or whenever Save is called.
//
// A data-parallel job (every rank holds the same model) has one writer,
// rank 0, which saves DIR/ckpt-<step>.gdc through a checkpoint.Async: Save
// copies the state and returns, the write (atomic, verified after writing,
// pruned to the newest K that verify; damaged files are set aside as
// *.corrupt and never count) runs on the writer's goroutine. Resuming over
// files none of which verifies is a *DamagedError unless
// WithStartFreshOverDamaged says otherwise, and a checkpoint of another
// world size or layout is a *LayoutError — except, WithWorldChange, a
// data-parallel checkpoint resumed by a data-parallel job of another world
// size: it holds the whole state, Resumed.SavedWorld says who saved it,
// and the program carries the sampler's position over
// (train/data's DistributedSampler.Resume). A pipeline job
// (WithStage) has one writer per stage, each saving only its own layers to
// DIR/stage<k>/ckpt-<step>.gdc.
//
// WithRankRNG is for data-parallel ranks that each draw their own random
// numbers (their own batches): Save sends every rank's RNG state to rank 0,
// which stores them in the checkpoint's metadata, and Resume hands each
// rank its own.
//
// # Resuming
//
// Resume is a collective: each rank lists its directory and the ranks agree,
// by all-reduces, on the newest step for which every rank has a checkpoint
// that verifies completely, passing over torn or corrupt files — so a
// stage whose newest file is torn makes every stage resume from the previous
// step, and no rank ever resumes from a step the others do not. If some
// rank has a checkpoint but no step is common to all, Resume fails
// (ErrNoCommonStep) rather than starting part of the job afresh.
//
// Every rank loads the checkpoint itself, so DIR must be readable by every
// rank: on several hosts, a shared file system or a volume every pod
// mounts. A rank that cannot see rank 0's files finds no common step.
//
// Verify all-gathers a digest of each rank's live state (step, epoch,
// sampler position, parameters, optimizer state, RNG state: FNV-1a hashes
// of every element's bits) and fails on every rank with a *MismatchError
// naming the part and the ranks that differ from rank 0.
//
// # Sharded checkpoints
//
// A job whose ranks each hold part of the state — ZeRO (dist/ddp's
// WithZeRO) or fully sharded parameters (dist/fsdp) — cannot have one rank
// write it. SaveSharded (a collective) has every rank write its own pieces
// of the parameters and of the optimizer's slots to DIR/ckpt-<step>/rank-<r>.gdc,
// and rank 0, once all have, write the index (train/checkpoint's sharded
// format, as torch's DCP saves). ResumeSharded loads the newest complete
// one into a job of any world size and any layout — DDP, ZeRO-1, ZeRO-2 or
// fully sharded: each rank reads, from each file, only the chunks that
// overlap what it holds, and the optimizer's state for the pieces its
// solver steps. A plain DDP job saves and resumes sharded checkpoints too
// (its ranks write equal shares), so every layout converts to every other.
//
//	d, err := ddp.Wrap(ctx, pg, params, ddp.WithZeRO(2))    // or f, err := fsdp.Wrap(ctx, pg, units)
//	adam, err := optim.NewAdam()                           // the solver d.Solver(adam) steps
//	r, err := ckpt.ResumeSharded(ctx, d, adam, dir, logger) // a collective
//	if !r.Fresh() {
//		// r.Step, r.State (config, epoch, sampler position, metadata,
//		// this rank's RNG if the world size is the one that saved),
//		// r.World and r.Layout of the job that saved
//	}
//	...
//	err = ckpt.SaveSharded(ctx, d, adam, dir, &checkpoint.State{Step: step, Epoch: epoch, Sampler: pos}, 3)
//
// The wrapper (a Sharded) says which parts of the parameters it holds and
// which its solver steps; a checkpoint whose parameters are not the job's
// (missing, another dtype or shape) or whose optimizer is another kind
// fails with an *IncompatibleError naming the part, on every rank. A change
// of world size or layout is logged. FullState gathers the whole state
// onto every rank, as one process would hold it: to write a single-process
// checkpoint from a sharded job, or to compare.
//
// # Design
//
// Every rank reads the file rather than rank 0 reading it and broadcasting
// the state: on one host or a shared file system that costs no network
// transfer and no extra memory on rank 0, and Verify catches a rank that
// loaded something else.
package ckpt
