// Package data feeds data sets to data-parallel training. Its
// DistributedSampler gives each rank of a job its share of every epoch, with
// PyTorch's DistributedSampler semantics (a per-epoch shuffle from a seed,
// SetEpoch, drop-last or pad, disjoint shards) and a position that can be
// saved in a checkpoint and restored, so that a resumed run visits exactly
// the indices the interrupted one had left.
//
// The package is plain Go: it knows nothing of gdist's dist packages or of
// any data format; it deals in indices 0..n-1.
//
// # Usage
//
//	s, err := data.New(train.N, rank, world, data.WithSeed(seed), data.WithDropLast(true))
//	if err != nil { ... }
//	if st := ckpt.Sampler; st != nil { // resuming: where the saved run was
//		if err := s.UnmarshalBinary(st); err != nil { ... }
//	}
//	for epoch := s.Epoch(); epoch < epochs; epoch++ {
//		s.SetEpoch(epoch) // keeps a restored position, else starts the epoch
//		for {
//			idx := s.Next(batch)
//			if len(idx) < batch {
//				break // the epoch is done (a partial batch is dropped)
//			}
//			// train on the items idx
//			if saveNow {
//				pos, _ := s.MarshalBinary() // "epoch e, next index i"
//				// store pos in the checkpoint (checkpoint.State.Sampler)
//			}
//		}
//	}
//
// Indices(epoch) returns a whole epoch's indices without touching the
// position, for loops that do their own batching.
package data
