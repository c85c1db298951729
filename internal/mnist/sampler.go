package mnist

import (
	"fmt"
	"math/rand/v2"
)

// Sampler splits the indices 0..n-1 of a data set among the ranks of a
// data-parallel job, like torch.utils.data.DistributedSampler with
// drop_last=True: each epoch every rank draws the same permutation (seeded
// by seed and the epoch), keeps only its first world*floor(n/world) entries,
// and takes every world-th one starting at its rank. So every rank gets
// exactly floor(n/world) indices, the shards of one epoch are disjoint, and
// the n mod world indices left over differ from epoch to epoch.
//
// A Sampler is immutable and safe for concurrent use.
type Sampler struct {
	n, rank, world int
	seed           int64
	shuffle        bool
}

// NewSampler returns the sampler of rank (0 <= rank < world) for a data set
// of n items. With shuffle false, epochs are not permuted and rank r gets
// r, r+world, r+2*world, ... Every rank must pass the same n, world, seed and
// shuffle. Bad arguments give an error matching ErrInvalidArgument.
func NewSampler(n, rank, world int, seed int64, shuffle bool) (*Sampler, error) {
	if n < 0 || world < 1 || rank < 0 || rank >= world {
		return nil, fmt.Errorf("%w: sampler with n=%d, rank=%d, world=%d", ErrInvalidArgument, n, rank, world)
	}
	return &Sampler{n: n, rank: rank, world: world, seed: seed, shuffle: shuffle}, nil
}

// Len returns how many indices Indices returns: floor(n/world).
func (s *Sampler) Len() int { return s.n / s.world }

// Indices returns this rank's indices for epoch, in the order to visit
// them. The result is a new slice the caller owns. The permutation comes
// from rand.New(rand.NewPCG(uint64(seed), uint64(epoch))).Perm(n).
func (s *Sampler) Indices(epoch int) []int {
	out := make([]int, s.Len())
	if !s.shuffle {
		for i := range out {
			out[i] = s.rank + i*s.world
		}
		return out
	}
	perm := rand.New(rand.NewPCG(uint64(s.seed), uint64(epoch))).Perm(s.n)
	for i := range out {
		out[i] = perm[s.rank+i*s.world]
	}
	return out
}
