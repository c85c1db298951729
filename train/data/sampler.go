package data

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/gdist/gdist/internal/errs"
	"github.com/gdist/gdist/internal/options"
)

// Errors returned by this package. Match them with errors.Is.
var (
	// ErrInvalidArgument is matched by the errors of an invalid argument or
	// option. It is the value every gdist package exports under this name
	// (errs.ErrInvalidArgument).
	ErrInvalidArgument = errs.ErrInvalidArgument
	// ErrBadState means bytes given to UnmarshalBinary are not a sampler
	// state (wrong length, magic or version, or a position out of range).
	ErrBadState = errors.New("data: malformed sampler state")
	// ErrMismatch means a sampler state was saved by a sampler of another
	// configuration (data set size, world size, seed, shuffle or drop-last),
	// so its position means something else here.
	ErrMismatch = errors.New("data: sampler state from another configuration")
)

// DistributedSampler splits the indices 0..n-1 of a data set among the
// ranks of a data-parallel job, with the semantics of PyTorch's
// torch.utils.data.DistributedSampler:
//
//   - Every epoch, every rank draws the same ordering of 0..n-1: a
//     permutation from rand.New(rand.NewPCG(uint64(seed), uint64(epoch))).Perm(n)
//     when shuffling (the default), or 0..n-1 in order.
//   - With drop-last, the ordering is cut to world*floor(n/world) entries;
//     without it (the default), it is padded to world*ceil(n/world) entries
//     by repeating it from its start, so every rank gets the same count.
//   - Rank r takes the entries r, r+world, r+2*world, ... So the shards of
//     an epoch are disjoint (with drop-last; padding repeats at most
//     world-1 indices) and together cover the data set.
//
// The shuffle is PCG's, not torch's generator: the indices differ from
// torch's, the rules are the same.
//
// Besides the pure Indices(epoch), a sampler has a position, "epoch e,
// next index i", that Next advances and that MarshalBinary and
// UnmarshalBinary save and restore, so a resumed run visits exactly the
// indices an uninterrupted one would have. Every rank of a data-parallel
// job is at the same position, so the state saved by one rank restores any
// rank.
//
// Len, Indices, Rank, World and N only read the configuration and are safe
// for concurrent use; the methods that move or read the position (SetEpoch,
// Seek, Next, Epoch, Pos, Remaining, MarshalBinary, UnmarshalBinary) are not.
type DistributedSampler struct {
	n, rank, world int
	seed           int64
	shuffle        bool
	dropLast       bool

	epoch, next int
	cache       []int // this rank's indices for cacheEpoch
	cacheEpoch  int
	cached      bool
}

// Option configures New. Options are validated by New.
type Option func(*config) error

type config struct {
	seed              int64
	shuffle, dropLast bool
}

// WithShuffle sets whether each epoch is a fresh permutation (default true).
func WithShuffle(shuffle bool) Option {
	return func(o *config) error { o.shuffle = shuffle; return nil }
}

// WithSeed sets the shuffle's seed (default 0). Every rank must use the same.
func WithSeed(seed int64) Option {
	return func(o *config) error { o.seed = seed; return nil }
}

// WithDropLast makes every rank get floor(n/world) indices, dropping the
// n mod world left over (default false: every rank gets ceil(n/world),
// padding by repetition).
func WithDropLast(dropLast bool) Option {
	return func(o *config) error { o.dropLast = dropLast; return nil }
}

// New returns the sampler of rank (0 <= rank < world) for a data set of n
// items (n >= 0), at epoch 0, index 0. Every rank must pass the same n,
// world and options. Bad arguments give an error matching ErrInvalidArgument.
func New(n, rank, world int, opts ...Option) (*DistributedSampler, error) {
	if n < 0 || world < 1 || rank < 0 || rank >= world {
		return nil, fmt.Errorf("data: %w: sampler with n=%d, rank=%d, world=%d", ErrInvalidArgument, n, rank, world)
	}
	o := config{shuffle: true}
	if err := options.Apply(&o, opts, "data", ErrInvalidArgument); err != nil {
		return nil, err
	}
	return &DistributedSampler{n: n, rank: rank, world: world, seed: o.seed, shuffle: o.shuffle, dropLast: o.dropLast}, nil
}

// N returns the size of the data set.
func (s *DistributedSampler) N() int { return s.n }

// Rank returns the rank the sampler serves.
func (s *DistributedSampler) Rank() int { return s.rank }

// World returns the number of ranks.
func (s *DistributedSampler) World() int { return s.world }

// Len returns how many indices a rank gets per epoch: floor(n/world) with
// drop-last, ceil(n/world) without.
func (s *DistributedSampler) Len() int {
	if s.dropLast {
		return s.n / s.world
	}
	return (s.n + s.world - 1) / s.world
}

// Indices returns this rank's indices for epoch, in the order to visit
// them, whatever the sampler's position. The caller owns the result.
func (s *DistributedSampler) Indices(epoch int) []int {
	out := make([]int, s.Len())
	if len(out) == 0 {
		return out
	}
	var order []int
	if s.shuffle {
		order = rand.New(rand.NewPCG(uint64(s.seed), uint64(epoch))).Perm(s.n)
	}
	for i := range out {
		j := (s.rank + i*s.world) % s.n // past n: the padding repeats from the start
		if order != nil {
			j = order[j]
		}
		out[i] = j
	}
	return out
}

// SetEpoch moves to the start of epoch e, as torch's set_epoch does before
// each epoch; if the sampler is already at epoch e, its position is kept,
// so that a loop calling SetEpoch(e) on a restored sampler resumes where it
// was. Use Seek to restart an epoch.
func (s *DistributedSampler) SetEpoch(e int) {
	if e != s.epoch {
		s.epoch, s.next = e, 0
	}
}

// Seek moves to epoch e, index next (0 <= next <= Len()); next == Len()
// means the epoch is done.
func (s *DistributedSampler) Seek(e, next int) error {
	if next < 0 || next > s.Len() {
		return fmt.Errorf("data: %w: position %d in an epoch of %d", ErrInvalidArgument, next, s.Len())
	}
	s.epoch, s.next = e, next
	return nil
}

// Epoch returns the current epoch.
func (s *DistributedSampler) Epoch() int { return s.epoch }

// Pos returns the position: the current epoch and the index (into this
// epoch's Indices) that Next returns first.
func (s *DistributedSampler) Pos() (epoch, next int) { return s.epoch, s.next }

// Remaining returns how many indices of the current epoch Next has not yet
// returned.
func (s *DistributedSampler) Remaining() int { return s.Len() - s.next }

// Next returns the next min(k, Remaining()) indices of the current epoch
// and advances past them; at the end of the epoch it returns an empty
// slice. It does not move to the next epoch (SetEpoch does). The result is
// a new slice the caller owns.
func (s *DistributedSampler) Next(k int) []int {
	if k < 0 {
		k = 0
	}
	if !s.cached || s.cacheEpoch != s.epoch {
		s.cache, s.cacheEpoch, s.cached = s.Indices(s.epoch), s.epoch, true
	}
	k = min(k, len(s.cache)-s.next)
	out := append([]int(nil), s.cache[s.next:s.next+k]...)
	s.next += k
	return out
}

// The binary state: magic "GDS" and a version byte, then little-endian
// u64 n, u32 world, u32 rank, u64 seed, u8 flags (1 shuffle, 2 drop-last),
// u64 epoch, u64 next.
const (
	stateVersion = 1
	stateSize    = 4 + 8 + 4 + 4 + 8 + 1 + 8 + 8
	flagShuffle  = 1
	flagDropLast = 2
)

func (s *DistributedSampler) flags() uint8 {
	var f uint8
	if s.shuffle {
		f |= flagShuffle
	}
	if s.dropLast {
		f |= flagDropLast
	}
	return f
}

// MarshalBinary encodes the sampler's configuration and position
// (encoding.BinaryMarshaler). The state is 45 bytes.
func (s *DistributedSampler) MarshalBinary() ([]byte, error) {
	le := binary.LittleEndian
	b := make([]byte, 0, stateSize)
	b = append(b, 'G', 'D', 'S', stateVersion)
	b = le.AppendUint64(b, uint64(s.n))
	b = le.AppendUint32(b, uint32(s.world))
	b = le.AppendUint32(b, uint32(s.rank))
	b = le.AppendUint64(b, uint64(s.seed))
	b = append(b, s.flags())
	b = le.AppendUint64(b, uint64(int64(s.epoch)))
	b = le.AppendUint64(b, uint64(s.next))
	return b, nil
}

// UnmarshalBinary restores a position saved by MarshalBinary
// (encoding.BinaryUnmarshaler). On a sampler made by New, the saved
// configuration must match (n, world, seed, shuffle and drop-last; else
// ErrMismatch) and only the position is restored: the rank stays, so one
// rank's saved state restores every rank. On a zero DistributedSampler,
// the whole sampler is restored, rank included. Malformed input gives
// ErrBadState; on error the sampler is unchanged.
func (s *DistributedSampler) UnmarshalBinary(b []byte) error {
	le := binary.LittleEndian
	if len(b) != stateSize || b[0] != 'G' || b[1] != 'D' || b[2] != 'S' {
		return fmt.Errorf("%w: %d bytes", ErrBadState, len(b))
	}
	if b[3] != stateVersion {
		return fmt.Errorf("%w: version %d", ErrBadState, b[3])
	}
	n, world, rank := le.Uint64(b[4:]), le.Uint32(b[12:]), le.Uint32(b[16:])
	seed, flags := int64(le.Uint64(b[20:])), b[28]
	epoch, next := int64(le.Uint64(b[29:])), le.Uint64(b[37:])
	if n > 1<<62 || world < 1 || world > 1<<30 || rank >= world || flags&^(flagShuffle|flagDropLast) != 0 {
		return fmt.Errorf("%w: n=%d world=%d rank=%d flags=%#x", ErrBadState, n, world, rank, flags)
	}
	c := DistributedSampler{n: int(n), rank: int(rank), world: int(world), seed: seed,
		shuffle: flags&flagShuffle != 0, dropLast: flags&flagDropLast != 0}
	if next > uint64(c.Len()) || int64(int(epoch)) != epoch {
		return fmt.Errorf("%w: position epoch %d, index %d in an epoch of %d", ErrBadState, epoch, next, c.Len())
	}
	if s.world != 0 { // made by New: the configuration must match
		if c.n != s.n || c.world != s.world || c.seed != s.seed || c.flags() != s.flags() {
			return fmt.Errorf("%w: saved n=%d world=%d seed=%d flags=%#x, this sampler n=%d world=%d seed=%d flags=%#x",
				ErrMismatch, c.n, c.world, c.seed, c.flags(), s.n, s.world, s.seed, s.flags())
		}
		c.rank = s.rank
		c.cache, c.cacheEpoch, c.cached = s.cache, s.cacheEpoch, s.cached
	}
	c.epoch, c.next = int(epoch), int(next)
	*s = c
	return nil
}
