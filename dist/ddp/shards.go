package ddp

// What a sharded checkpoint (dist/ckpt's SaveSharded and ResumeSharded)
// needs to know of a DDP: which parts of the parameters its solver steps,
// which it writes and which it holds.

import (
	"fmt"

	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist/internal/shard"
	"github.com/gdist/gdist/train/checkpoint"
)

// Sharding names the DDP's mode as sharded checkpoints record it: "ddp",
// "zero1" or "zero2".
func (d *DDP) Sharding() string {
	if d.cfg.zero > 0 {
		return fmt.Sprintf("zero%d", d.cfg.zero)
	}
	return "ddp"
}

// Segments returns the parts of the parameters that the values the Solver
// hands its inner solver cover, in that order: the inner solver's state for
// its i-th value is the state of the i-th part. In plain DDP that is every
// parameter whole; under ZeRO, this rank's pieces. The slice is new.
func (d *DDP) Segments() []checkpoint.Segment {
	if d.cfg.zero == 0 {
		return d.HeldSegments()
	}
	out := make([]checkpoint.Segment, len(d.segs))
	for k, s := range d.segs {
		out[k] = checkpoint.Segment{Name: d.params[s.Param].Name(), Off: s.ParamOff, Len: s.Len}
	}
	return out
}

// SaveSegments returns the parts of the parameters (and of their optimizer
// state) that this rank writes in a sharded checkpoint: its pieces under
// ZeRO, and in plain DDP the pieces ZeRO would give it, so that the ranks
// write a checkpoint in equal shares. Every element is written by one rank.
func (d *DDP) SaveSegments() []checkpoint.Segment {
	if d.cfg.zero > 0 {
		return d.Segments()
	}
	var out []checkpoint.Segment
	for _, b := range d.bkts {
		var spans []shard.Span
		for _, i := range b.params {
			s := d.slots[i]
			spans = append(spans, shard.Span{Param: i, Off: s.off, Len: s.n})
		}
		for _, s := range shard.Segments(spans, shard.Piece(b.n, d.pg.WorldSize()), d.pg.Rank()) {
			out = append(out, checkpoint.Segment{Name: d.params[s.Param].Name(), Off: s.ParamOff, Len: s.Len})
		}
	}
	return out
}

// HeldSegments returns the parts of the parameters whose values this rank
// holds: every parameter whole (in plain DDP and ZeRO alike).
func (d *DDP) HeldSegments() []checkpoint.Segment {
	out := make([]checkpoint.Segment, len(d.params))
	for i, p := range d.params {
		out[i] = checkpoint.Segment{Name: p.Name(), Len: shard.Numel(p)}
	}
	return out
}

// SegmentValues returns the values of a part of a parameter this rank
// holds (one of HeldSegments or a part of one): a slice of the parameter's
// own tensor, f32 or f64 after its dtype.
func (d *DDP) SegmentValues(s checkpoint.Segment) ([]float32, []float64, error) {
	for _, p := range d.params {
		if p.Name() != s.Name {
			continue
		}
		f32, f64, err := shard.Floats(p.Value())
		if err != nil {
			return nil, nil, fmt.Errorf("ddp: parameter %s: %w", p.Name(), err)
		}
		if s.Off < 0 || s.Len < 0 || s.Off+s.Len > len(f32)+len(f64) {
			return nil, nil, fmt.Errorf("ddp: parameter %s has no elements [%d, %d): %w", s.Name, s.Off, s.Off+s.Len, ErrNotParam)
		}
		if p.Dtype() == tensor.Float32 {
			return f32[s.Off : s.Off+s.Len], nil, nil
		}
		return nil, f64[s.Off : s.Off+s.Len], nil
	}
	return nil, nil, fmt.Errorf("ddp: no parameter %q: %w", s.Name, ErrNotParam)
}
