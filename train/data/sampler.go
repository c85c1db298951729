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
// Besides Indices(epoch), a sampler has a position, "epoch e, next index
// i", that Next advances and that MarshalBinary and UnmarshalBinary save
// and restore, so a resumed run visits exactly the indices an
// uninterrupted one would have. Every rank of a data-parallel job is at the
// same position, so the state saved by one rank restores any rank. Resume
// restores it into a job of another world size: the rest of the epoch is
// dealt among the new ranks.
//
// Rank, World and N only read the configuration and are safe for
// concurrent use; the methods that move or read the position (Len,
// Indices, SetEpoch, Seek, Next, Epoch, Pos, Remaining, MarshalBinary,
// UnmarshalBinary, Resume) are not.
type DistributedSampler struct {
	n, rank, world int
	seed           int64
	shuffle        bool
	dropLast       bool

	epoch, next int
	// start > 0: the current epoch is dealt to this world from entry start
	// of its ordering on (the epoch was resumed from a job of another
	// world size; see Resume).
	start      int
	cache      []int // this rank's indices for cacheEpoch (and start)
	cacheEpoch int
	cacheStart int
	cached     bool
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

// Len returns how many indices a rank gets in the current epoch:
// floor(n/world) with drop-last, ceil(n/world) without — or, in an epoch
// resumed from a job of another world size (Resume), the same of the
// entries that job had not visited.
func (s *DistributedSampler) Len() int { return s.lenFrom(s.start) }

// lenFrom is how many indices a rank gets when the epoch's entries from
// start on are dealt.
func (s *DistributedSampler) lenFrom(start int) int {
	m := max(s.n-start, 0)
	if s.dropLast {
		return m / s.world
	}
	return (m + s.world - 1) / s.world
}

// Indices returns this rank's indices for epoch, in the order to visit
// them, whatever the sampler's position within the epoch. The caller owns
// the result.
func (s *DistributedSampler) Indices(epoch int) []int {
	start := 0
	if epoch == s.epoch {
		start = s.start
	}
	return s.indicesFrom(epoch, start)
}

// indicesFrom deals entries start.. of epoch's ordering: rank r takes the
// remainder's entries r, r+world, ..., past its end repeating it from its
// start.
func (s *DistributedSampler) indicesFrom(epoch, start int) []int {
	out := make([]int, s.lenFrom(start))
	if len(out) == 0 {
		return out
	}
	var order []int
	if s.shuffle {
		order = rand.New(rand.NewPCG(uint64(s.seed), uint64(epoch))).Perm(s.n)
	}
	m := s.n - start
	for i := range out {
		j := start + (s.rank+i*s.world)%m // past n: the padding repeats from the start
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
		s.epoch, s.next, s.start = e, 0, 0
	}
}

// Seek moves to epoch e, index next (0 <= next <= Len()); next == Len()
// means the epoch is done. Seeking within the current epoch keeps how it is
// dealt (see Resume).
func (s *DistributedSampler) Seek(e, next int) error {
	if next < 0 || next > s.Len() {
		return fmt.Errorf("data: %w: position %d in an epoch of %d", ErrInvalidArgument, next, s.Len())
	}
	if e != s.epoch {
		s.start = 0
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
	if !s.cached || s.cacheEpoch != s.epoch || s.cacheStart != s.start {
		s.cache, s.cacheEpoch, s.cacheStart, s.cached = s.Indices(s.epoch), s.epoch, s.start, true
	}
	k = min(k, len(s.cache)-s.next)
	out := append([]int(nil), s.cache[s.next:s.next+k]...)
	s.next += k
	return out
}

// The binary state: magic "GDS" and a version byte, then little-endian
// u64 n, u32 world, u32 rank, u64 seed, u8 flags (1 shuffle, 2 drop-last),
// u64 epoch, u64 next; version 2 adds u64 start (an epoch dealt from that
// entry on, see Resume). A state with start 0 is written as version 1.
const (
	stateVersion  = 1
	stateSize     = 4 + 8 + 4 + 4 + 8 + 1 + 8 + 8
	stateVersion2 = 2
	stateSize2    = stateSize + 8
	flagShuffle   = 1
	flagDropLast  = 2
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
// (encoding.BinaryMarshaler). The state is 45 bytes (53 in an epoch
// resumed from another world size).
func (s *DistributedSampler) MarshalBinary() ([]byte, error) {
	le := binary.LittleEndian
	b := make([]byte, 0, stateSize2)
	v := byte(stateVersion)
	if s.start > 0 {
		v = stateVersion2
	}
	b = append(b, 'G', 'D', 'S', v)
	b = le.AppendUint64(b, uint64(s.n))
	b = le.AppendUint32(b, uint32(s.world))
	b = le.AppendUint32(b, uint32(s.rank))
	b = le.AppendUint64(b, uint64(s.seed))
	b = append(b, s.flags())
	b = le.AppendUint64(b, uint64(int64(s.epoch)))
	b = le.AppendUint64(b, uint64(s.next))
	if s.start > 0 {
		b = le.AppendUint64(b, uint64(s.start))
	}
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
	c, err := decodeState(b)
	if err != nil {
		return err
	}
	if s.world != 0 { // made by New: the configuration must match
		if err := s.sameConfig(&c, true); err != nil {
			return err
		}
		c.rank = s.rank
		c.cache, c.cacheEpoch, c.cacheStart, c.cached = s.cache, s.cacheEpoch, s.cacheStart, s.cached
	}
	*s = c
	return nil
}

// Resume restores a position saved by MarshalBinary into a sampler made by
// New, as UnmarshalBinary does, but also from a sampler of another world
// size (n, seed, shuffle and drop-last must match; else ErrMismatch): the
// entries of the current epoch's ordering that the saving job had not
// visited — its ranks had taken entries [0, start+next*world) between
// them — are dealt out afresh among this sampler's world, as an epoch is
// dealt (rank r takes the remainder's entries r, r+world, ...; padded by
// repeating the remainder from its start, or cut with drop-last). Later
// epochs are whole epochs of the new world size. So a job that loses or
// gains ranks mid-epoch visits each remaining index of the epoch once
// (and, as always, pads). Resume returns the world size that saved, for
// the caller to log a change. On error the sampler is unchanged.
func (s *DistributedSampler) Resume(b []byte) (savedWorld int, err error) {
	c, err := decodeState(b)
	if err != nil {
		return 0, err
	}
	if s.world == 0 {
		return 0, fmt.Errorf("%w: Resume on a sampler not made by New", ErrInvalidArgument)
	}
	if err := s.sameConfig(&c, false); err != nil {
		return 0, err
	}
	savedWorld = c.world
	epoch, start := c.epoch, c.start+c.next*c.world
	if c.world == s.world {
		start = c.start
	}
	r := DistributedSampler{n: s.n, rank: s.rank, world: s.world, seed: s.seed, shuffle: s.shuffle, dropLast: s.dropLast,
		epoch: epoch, start: min(start, s.n)}
	if c.world == s.world {
		r.next = c.next
	}
	*s = r
	return savedWorld, nil
}

// sameConfig checks that c was saved by a sampler of s's configuration
// (with withWorld, also of its world size).
func (s *DistributedSampler) sameConfig(c *DistributedSampler, withWorld bool) error {
	if c.n != s.n || (withWorld && c.world != s.world) || c.seed != s.seed || c.flags() != s.flags() {
		return fmt.Errorf("%w: saved n=%d world=%d seed=%d flags=%#x, this sampler n=%d world=%d seed=%d flags=%#x",
			ErrMismatch, c.n, c.world, c.seed, c.flags(), s.n, s.world, s.seed, s.flags())
	}
	return nil
}

// decodeState parses a state written by MarshalBinary.
func decodeState(b []byte) (DistributedSampler, error) {
	le := binary.LittleEndian
	if (len(b) != stateSize && len(b) != stateSize2) || b[0] != 'G' || b[1] != 'D' || b[2] != 'S' {
		return DistributedSampler{}, fmt.Errorf("%w: %d bytes", ErrBadState, len(b))
	}
	if v := b[3]; (v != stateVersion || len(b) != stateSize) && (v != stateVersion2 || len(b) != stateSize2) {
		return DistributedSampler{}, fmt.Errorf("%w: version %d in %d bytes", ErrBadState, v, len(b))
	}
	n, world, rank := le.Uint64(b[4:]), le.Uint32(b[12:]), le.Uint32(b[16:])
	seed, flags := int64(le.Uint64(b[20:])), b[28]
	epoch, next := int64(le.Uint64(b[29:])), le.Uint64(b[37:])
	var start uint64
	if b[3] == stateVersion2 {
		start = le.Uint64(b[45:])
		if start == 0 || start > n {
			return DistributedSampler{}, fmt.Errorf("%w: start %d of %d", ErrBadState, start, n)
		}
	}
	if n > 1<<62 || world < 1 || world > 1<<30 || rank >= world || flags&^(flagShuffle|flagDropLast) != 0 {
		return DistributedSampler{}, fmt.Errorf("%w: n=%d world=%d rank=%d flags=%#x", ErrBadState, n, world, rank, flags)
	}
	c := DistributedSampler{n: int(n), rank: int(rank), world: int(world), seed: seed,
		shuffle: flags&flagShuffle != 0, dropLast: flags&flagDropLast != 0, start: int(start)}
	if next > uint64(c.Len()) || int64(int(epoch)) != epoch {
		return DistributedSampler{}, fmt.Errorf("%w: position epoch %d, index %d in an epoch of %d", ErrBadState, epoch, next, c.Len())
	}
	c.epoch, c.next = int(epoch), int(next)
	return c, nil
}
