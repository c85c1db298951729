package pipeline

// Setup: each stage builds its graphs, then the stages exchange descriptors
// (shapes, dtypes, schedule settings) and check that they fit together.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
)

const (
	descMagic   = 0x4c504447 // "GDPL"
	descVersion = 3
)

// descriptor is what each stage tells every other at setup: its settings
// and the tensors each of its chunks takes and produces. (A stage that
// fails to set up fails the group instead; version 1 could carry that
// failure as text; version 3 added the chunks.)
type descriptor struct {
	stage, nstages int
	micro          int
	schedule       Schedule
	chunks         int
	ranks          []int
	in, out        []Desc // per chunk
}

func dtypeCode(dt tensor.Dtype) byte {
	switch dt {
	case tensor.Float32:
		return 1
	case tensor.Float64:
		return 2
	}
	return 0
}

func codeDtype(c byte) (tensor.Dtype, bool) {
	switch c {
	case 1:
		return tensor.Float32, true
	case 2:
		return tensor.Float64, true
	}
	return tensor.Dtype{}, false
}

func (d *descriptor) encode() []byte {
	b := binary.LittleEndian.AppendUint32(nil, descMagic)
	b = binary.LittleEndian.AppendUint16(b, descVersion)
	b = binary.LittleEndian.AppendUint32(b, uint32(d.stage))
	b = binary.LittleEndian.AppendUint32(b, uint32(d.nstages))
	b = binary.LittleEndian.AppendUint32(b, uint32(d.micro))
	b = append(b, byte(d.schedule), byte(d.chunks))
	for _, r := range d.ranks {
		b = binary.LittleEndian.AppendUint32(b, uint32(r))
	}
	for k := range d.chunks {
		for _, x := range []Desc{d.in[k], d.out[k]} {
			b = append(b, dtypeCode(x.Dtype), byte(len(x.Shape)))
			for _, s := range x.Shape {
				b = binary.LittleEndian.AppendUint64(b, uint64(s))
			}
		}
	}
	return b
}

var errBadDescriptor = errors.New("malformed pipeline descriptor")

func decodeDescriptor(b []byte) (*descriptor, error) {
	r := reader{b: b}
	if r.u32() != descMagic || r.u16() != descVersion {
		return nil, errBadDescriptor
	}
	d := &descriptor{stage: int(r.u32()), nstages: int(r.u32()), micro: int(r.u32()), schedule: Schedule(r.u8()), chunks: int(r.u8())}
	if r.err || d.nstages < 1 || d.nstages > dist.MaxWorldSize || d.chunks < 1 {
		return nil, errBadDescriptor
	}
	d.ranks = make([]int, d.nstages)
	for i := range d.ranks {
		d.ranks[i] = int(r.u32())
	}
	d.in, d.out = make([]Desc, d.chunks), make([]Desc, d.chunks)
	for k := range d.chunks {
		for _, x := range []*Desc{&d.in[k], &d.out[k]} {
			dt, ok := codeDtype(r.u8())
			n := int(r.u8())
			if !ok || n > 16 {
				return nil, errBadDescriptor
			}
			x.Dtype = dt
			x.Shape = make(tensor.Shape, n)
			for i := range x.Shape {
				x.Shape[i] = int(r.u64())
			}
		}
	}
	if r.err || len(r.b) != 0 {
		return nil, errBadDescriptor
	}
	return d, nil
}

// reader decodes little-endian fields, remembering a short read.
type reader struct {
	b   []byte
	err bool
}

func (r *reader) take(n int) []byte {
	if len(r.b) < n {
		r.err = true
		r.b = nil
		return make([]byte, n)
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}
func (r *reader) u8() byte    { return r.take(1)[0] }
func (r *reader) u16() uint16 { return binary.LittleEndian.Uint16(r.take(2)) }
func (r *reader) u32() uint32 { return binary.LittleEndian.Uint32(r.take(4)) }
func (r *reader) u64() uint64 { return binary.LittleEndian.Uint64(r.take(8)) }

// handshake sends this stage's descriptor to every other stage, receives
// theirs and checks them all, in stage order, so that every stage reports
// the same first disagreement.
func (p *Pipeline) handshake(ctx context.Context) error {
	own := &descriptor{stage: p.stage, nstages: p.nstages, micro: p.cfg.micro, schedule: p.cfg.schedule,
		chunks: p.lay.v, ranks: p.ranks}
	for _, ch := range p.chunks {
		own.in, own.out = append(own.in, ch.in), append(own.out, ch.out)
	}
	msg := own.encode()
	tag := p.cfg.tagBase + tagSetup
	// A stage that fails to set up fails the group: the sends and receives
	// below then fail with the group's error, naming it.
	var firstErr error
	keep := func(err error) {
		if firstErr == nil {
			firstErr = err
		}
	}
	for _, r := range p.ranks {
		if r == p.g.Rank() {
			continue
		}
		if err := p.g.Send(ctx, r, tag, msg); err != nil {
			keep(fmt.Errorf("pipeline: setup: %w", err))
		}
	}
	descs := make([]*descriptor, p.nstages)
	descs[p.stage] = own
	for i, r := range p.ranks {
		if r == p.g.Rank() {
			continue
		}
		b, err := p.g.Recv(ctx, r, tag)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("pipeline: setup: %w", err)
			}
			keep(fmt.Errorf("pipeline: setup: %w", err))
			continue
		}
		d, err := decodeDescriptor(b)
		switch {
		case err != nil:
			keep(&dist.PeerError{Rank: r, Op: "pipeline setup", Err: fmt.Errorf("%w: %w", dist.ErrProtocol, err)})
		case d.stage != i:
			// The peer thinks it is another stage: its rank list differs.
			keep(fmt.Errorf("%w: rank %d is stage %d here but says it is stage %d (ranks %v vs %v)",
				ErrConfigMismatch, r, i, d.stage, p.ranks, d.ranks))
		default:
			descs[i] = d
		}
	}
	if firstErr != nil {
		return firstErr
	}
	d0 := descs[0]
	for i, d := range descs[1:] {
		i++
		switch {
		case !slices.Equal(d.ranks, d0.ranks):
			return fmt.Errorf("%w: stage 0 (rank %d) has stage ranks %v, stage %d (rank %d) has %v",
				ErrConfigMismatch, p.ranks[0], d0.ranks, i, p.ranks[i], d.ranks)
		case d.micro != d0.micro:
			return fmt.Errorf("%w: stage 0 (rank %d) uses %d micro-batches, stage %d (rank %d) uses %d",
				ErrConfigMismatch, p.ranks[0], d0.micro, i, p.ranks[i], d.micro)
		case d.schedule != d0.schedule:
			return fmt.Errorf("%w: stage 0 (rank %d) uses schedule %v, stage %d (rank %d) uses %v",
				ErrConfigMismatch, p.ranks[0], d0.schedule, i, p.ranks[i], d.schedule)
		case d.chunks != d0.chunks:
			return fmt.Errorf("%w: stage 0 (rank %d) holds %d virtual stages, stage %d (rank %d) holds %d",
				ErrConfigMismatch, p.ranks[0], d0.chunks, i, p.ranks[i], d.chunks)
		}
	}
	// Every pair of neighbouring virtual stages, in order.
	for vs := range p.lay.stages() - 1 {
		d, k := p.lay.at(vs)
		nd, nk := p.lay.at(vs + 1)
		if out, in := descs[d].out[k], descs[nd].in[nk]; !out.Equal(in) {
			return &StageMismatchError{Stage: vs, Rank: p.ranks[d], NextRank: p.ranks[nd], Output: out, Input: in}
		}
	}
	return nil
}
