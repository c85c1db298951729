// Replica checks: data-parallel replicas must end with identical
// parameters. Every rank summarises its parameters in a Checksum (exact
// float64 sums and an FNV-1a hash of the bits) and SameReplicas all-reduces
// the checksums with Max and with Min and compares the two bit for bit:
//
//	c, err := ddp.ChecksumOf(model.Learnables())
//	if err != nil { ... }
//	same, err := ddp.SameReplicas(ctx, pg, c) // every rank gets the same answer
//	if err != nil { ... }
//	if !same {
//		// the replicas diverged
//	}

package ddp

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash"
	"hash/fnv"
	"math"

	"gorgonia.org/gorgonia"

	"github.com/gdist/gdist/dist"
)

// Checksum summarises a model's parameters: exact sums and a hash of the
// bits, so equal checksums mean (all but certainly) identical parameters.
type Checksum struct {
	Sum, SumSq float64 // of every element, in float64
	Hash       uint64  // FNV-1a of the elements' bits, in order
}

// Accumulator builds a Checksum from parameter values fed to it in order.
// The zero value is ready to use and hashes each element in its own width
// (4 bytes for float32, 8 for float64, little-endian).
type Accumulator struct {
	// Widen hashes float32 elements as the 8 bytes of their float64
	// conversion, so that a float32 and a float64 model with the same
	// values hash alike.
	Widen bool

	sum, sumSq float64
	h          hash.Hash64
	buf        [8]byte
}

func (a *Accumulator) hash() hash.Hash64 {
	if a.h == nil {
		a.h = fnv.New64a()
	}
	return a.h
}

// Float32s adds v (read only; not retained).
func (a *Accumulator) Float32s(v []float32) {
	h := a.hash()
	for _, x := range v {
		f := float64(x)
		a.sum += f
		a.sumSq += f * f
		if a.Widen {
			binary.LittleEndian.PutUint64(a.buf[:], math.Float64bits(f))
			h.Write(a.buf[:])
		} else {
			binary.LittleEndian.PutUint32(a.buf[:4], math.Float32bits(x))
			h.Write(a.buf[:4])
		}
	}
}

// Float64s adds v (read only; not retained).
func (a *Accumulator) Float64s(v []float64) {
	h := a.hash()
	for _, x := range v {
		a.sum += x
		a.sumSq += x * x
		binary.LittleEndian.PutUint64(a.buf[:], math.Float64bits(x))
		h.Write(a.buf[:])
	}
}

// Add adds data, a []float32 or a []float64 (such as a tensor's Data());
// any other type is an error.
func (a *Accumulator) Add(data any) error {
	switch d := data.(type) {
	case []float32:
		a.Float32s(d)
	case []float64:
		a.Float64s(d)
	default:
		return fmt.Errorf("ddp: cannot checksum %T", data)
	}
	return nil
}

// Checksum returns the checksum of everything added so far.
func (a *Accumulator) Checksum() Checksum {
	return Checksum{Sum: a.sum, SumSq: a.sumSq, Hash: a.hash().Sum64()}
}

// ChecksumFloat32s returns the checksum of params, in order, each element hashed
// as its 4 bytes. It reads params and does not retain them.
func ChecksumFloat32s(params [][]float32) Checksum {
	var a Accumulator
	for _, p := range params {
		a.Float32s(p)
	}
	return a.Checksum()
}

// ChecksumFloat64s returns the checksum of params, in order. It reads params and
// does not retain them.
func ChecksumFloat64s(params [][]float64) Checksum {
	var a Accumulator
	for _, p := range params {
		a.Float64s(p)
	}
	return a.Checksum()
}

// ChecksumOf returns the checksum of the values of nodes (Float32 or Float64
// tensors), in order, each element hashed in its own width.
func ChecksumOf(nodes []*gorgonia.Node) (Checksum, error) {
	var a Accumulator
	for _, n := range nodes {
		v := n.Value()
		if v == nil {
			return Checksum{}, fmt.Errorf("ddp: node %s has no value", n.Name())
		}
		if err := a.Add(v.Data()); err != nil {
			return Checksum{}, fmt.Errorf("ddp: node %s: %w", n.Name(), err)
		}
	}
	return a.Checksum(), nil
}

// Same reports whether every rank of pg has checksum c: it all-reduces the
// checksum with Max and with Min and compares the two bit for bit. Every
// rank gets the same answer; every rank must call it.
func SameReplicas(ctx context.Context, pg *dist.ProcessGroup, c Checksum) (bool, error) {
	// The hash travels as two exact 32-bit halves.
	vals := []float64{c.Sum, c.SumSq, float64(c.Hash >> 32), float64(c.Hash & 0xffffffff)}
	hi := append([]float64(nil), vals...)
	lo := append([]float64(nil), vals...)
	if err := pg.AllReduce(ctx, dist.F64(hi), dist.Max); err != nil {
		return false, fmt.Errorf("ddp: comparing parameters: %w", err)
	}
	if err := pg.AllReduce(ctx, dist.F64(lo), dist.Min); err != nil {
		return false, fmt.Errorf("ddp: comparing parameters: %w", err)
	}
	for i := range vals {
		if math.Float64bits(hi[i]) != math.Float64bits(lo[i]) {
			return false, nil
		}
	}
	return true, nil
}
