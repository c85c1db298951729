package ckpt

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash"
	"hash/fnv"
	"maps"
	"math"
	"slices"

	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/train/checkpoint"
)

// Digest summarises the parts of a State that Verify compares: the step
// and epoch as they are, the other parts as FNV-1a hashes of a canonical
// encoding (names, dtypes, shapes and the bits of every element).
type Digest struct {
	Step, Epoch int64
	Sampler     uint64 // of the sampler position bytes
	Params      uint64 // of the parameters, in order
	Optimizer   uint64 // of kind, iteration, scalars, strings and slots (0 without one)
	RNG         uint64 // of the RNG state bytes
}

// The parts of a Digest, as MismatchError names them.
const (
	PartStep      = "step"
	PartEpoch     = "epoch"
	PartSampler   = "sampler position"
	PartParams    = "parameters"
	PartOptimizer = "optimizer state"
	PartRNG       = "RNG state"
)

// DigestOf returns st's digest. Tensors must be dense float32, float64,
// int32 or int64 (as checkpoint stores them).
func DigestOf(st *checkpoint.State) (Digest, error) {
	if st == nil {
		return Digest{}, fmt.Errorf("ckpt: %w: nil state", ErrInvalidArgument)
	}
	d := Digest{Step: st.Step, Epoch: st.Epoch, Sampler: hashBytes(st.Sampler), RNG: hashBytes(st.RNG)}
	h := newHasher()
	if err := h.tensors(st.Params); err != nil {
		return Digest{}, err
	}
	d.Params = h.Sum64()
	if o := st.Optimizer; o != nil {
		h := newHasher()
		h.str(o.Kind)
		h.u64(uint64(o.Iter))
		for _, k := range slices.Sorted(maps.Keys(o.Scalars)) {
			h.str(k)
			h.u64(math.Float64bits(o.Scalars[k]))
		}
		for _, k := range slices.Sorted(maps.Keys(o.Strings)) {
			h.str(k)
			h.str(o.Strings[k])
		}
		if err := h.tensors(o.Slots); err != nil {
			return Digest{}, err
		}
		d.Optimizer = h.Sum64() | 1 // never 0, which means "none"
	}
	return d, nil
}

func hashBytes(b []byte) uint64 {
	h := fnv.New64a()
	h.Write(b)
	return h.Sum64()
}

type hasher struct {
	hash.Hash64
	buf []byte
}

func newHasher() *hasher { return &hasher{Hash64: fnv.New64a()} }

func (h *hasher) u64(v uint64) {
	h.buf = binary.LittleEndian.AppendUint64(h.buf[:0], v)
	h.Write(h.buf)
}

func (h *hasher) str(s string) {
	h.u64(uint64(len(s)))
	h.Write([]byte(s))
}

func (h *hasher) tensors(ts []checkpoint.Named) error {
	h.u64(uint64(len(ts)))
	for _, nt := range ts {
		h.str(nt.Name)
		if nt.Tensor == nil {
			return fmt.Errorf("ckpt: %w: tensor %q is nil", ErrInvalidArgument, nt.Name)
		}
		shape := nt.Tensor.Shape()
		h.u64(uint64(len(shape)))
		for _, n := range shape {
			h.u64(uint64(n))
		}
		h.str(nt.Tensor.Dtype().String())
		b := h.buf[:0]
		switch v := nt.Tensor.Data().(type) {
		case []float32:
			for _, x := range v {
				b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
			}
		case []float64:
			for _, x := range v {
				b = binary.LittleEndian.AppendUint64(b, math.Float64bits(x))
			}
		case []int32:
			for _, x := range v {
				b = binary.LittleEndian.AppendUint32(b, uint32(x))
			}
		case []int64:
			for _, x := range v {
				b = binary.LittleEndian.AppendUint64(b, uint64(x))
			}
		case float32:
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
		case float64:
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
		default:
			return fmt.Errorf("ckpt: %w: tensor %q holds %T", ErrInvalidArgument, nt.Name, v)
		}
		if d, ok := nt.Tensor.(*tensor.Dense); ok && !d.IsNativelyAccessible() {
			return fmt.Errorf("ckpt: %w: tensor %q is not natively accessible", ErrInvalidArgument, nt.Name)
		}
		h.Write(b)
		h.buf = b
	}
	return nil
}

// MismatchError reports that Rank's state differs from rank 0's in Part.
// Every rank gets the same error.
type MismatchError struct {
	Part      string // one of the Part constants
	Rank      int    // the lowest rank that differs from rank 0
	Want, Got string // rank 0's value and Rank's (a step, or a hash)
	Ranks     []int  // every rank that differs from rank 0 in Part
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("ckpt: %s of rank %d differs from rank 0's: rank 0 has %s, rank %d %s (ranks differing: %v)",
		e.Part, e.Rank, e.Want, e.Rank, e.Got, e.Ranks)
}

// Unwrap returns ErrMismatch.
func (e *MismatchError) Unwrap() error { return ErrMismatch }

// digestLen is the number of float64s a Digest travels as: step and epoch
// exactly, each hash as two 32-bit halves.
const digestLen = 10

func (d Digest) floats() []float64 {
	half := func(h uint64) (float64, float64) { return float64(h >> 32), float64(h & 0xFFFFFFFF) }
	v := []float64{float64(d.Step), float64(d.Epoch), 0, 0, 0, 0, 0, 0, 0, 0}
	v[2], v[3] = half(d.Sampler)
	v[4], v[5] = half(d.Params)
	v[6], v[7] = half(d.Optimizer)
	v[8], v[9] = half(d.RNG)
	return v
}

func digestFrom(v []float64) Digest {
	whole := func(hi, lo float64) uint64 { return uint64(hi)<<32 | uint64(lo) }
	return Digest{Step: int64(v[0]), Epoch: int64(v[1]), Sampler: whole(v[2], v[3]),
		Params: whole(v[4], v[5]), Optimizer: whole(v[6], v[7]), RNG: whole(v[8], v[9])}
}

// Verify checks, a collective, that every rank holds the same state as
// rank 0 before training goes on: st is this rank's live state (its model's
// parameters, its solver's state, its step, epoch, sampler position and RNG
// state). A data-parallel job compares every part but, under WithRankRNG,
// the RNG state; pipeline stages (WithStage), which hold different layers,
// compare the step and epoch. A difference is a *MismatchError (matching
// ErrMismatch) naming the part and the ranks, returned on every rank.
func (m *Manager) Verify(ctx context.Context, st *checkpoint.State) error {
	if m.closed {
		return ErrClosed
	}
	d, err := DigestOf(st)
	if err != nil {
		return err
	}
	all, err := m.gatherDigests(ctx, d)
	if err != nil {
		return err
	}
	type part struct {
		name string
		get  func(Digest) string
	}
	hexOf := func(h uint64) string { return fmt.Sprintf("%016x", h) }
	parts := []part{
		{PartStep, func(d Digest) string { return fmt.Sprint(d.Step) }},
		{PartEpoch, func(d Digest) string { return fmt.Sprint(d.Epoch) }},
	}
	if m.o.stage < 0 {
		parts = append(parts,
			part{PartParams, func(d Digest) string { return hexOf(d.Params) }},
			part{PartOptimizer, func(d Digest) string { return hexOf(d.Optimizer) }},
			part{PartSampler, func(d Digest) string { return hexOf(d.Sampler) }})
		if !m.o.rankRNG {
			parts = append(parts, part{PartRNG, func(d Digest) string { return hexOf(d.RNG) }})
		}
	}
	for _, p := range parts {
		var e *MismatchError
		want := p.get(all[0])
		for r := 1; r < len(all); r++ {
			if got := p.get(all[r]); got != want {
				if e == nil {
					e = &MismatchError{Part: p.name, Rank: r, Want: want, Got: got}
				}
				e.Ranks = append(e.Ranks, r)
			}
		}
		if e != nil {
			return e
		}
	}
	return nil
}

// gatherDigests all-gathers every rank's digest, rank r's at index r.
func (m *Manager) gatherDigests(ctx context.Context, d Digest) ([]Digest, error) {
	n := m.pg.WorldSize()
	dst := make([]float64, n*digestLen)
	if err := m.pg.AllGather(ctx, dist.F64(dst), dist.F64(d.floats())); err != nil {
		return nil, fmt.Errorf("ckpt: exchanging state digests: %w", err)
	}
	all := make([]Digest, n)
	for r := range all {
		all[r] = digestFrom(dst[r*digestLen : (r+1)*digestLen])
	}
	return all, nil
}
