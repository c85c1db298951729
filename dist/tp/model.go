package tp

import (
	"context"
	"fmt"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/models/transformer"
	"github.com/gdist/gdist/train/checkpoint"
)

// comm implements transformer.Comm over a group.
type comm struct{ g *dist.ProcessGroup }

func (c comm) Copy(x *gorgonia.Node) (*gorgonia.Node, error)   { return Copy(c.g, x) }
func (c comm) Reduce(x *gorgonia.Node) (*gorgonia.Node, error) { return Reduce(c.g, x) }

// Comm returns Megatron's f and g over g, for transformer.TensorParallel.
func Comm(g *dist.ProcessGroup) transformer.Comm { return comm{g} }

// Placement returns the transformer.StageOption that makes a stage or a
// decoder this member's part of a model split over g.
func Placement(g *dist.ProcessGroup) transformer.StageOption {
	return transformer.WithTensorParallel(transformer.TensorParallel{Rank: g.Rank(), Size: g.WorldSize(), Comm: comm{g}})
}

// NewStage adds this member's part of layers from..to of cfg, split over
// the tensor-parallel group g (see transformer.TensorParallel), to gr, for
// a fixed batch: attention heads, MLP units and vocabulary split, one
// all-reduce forward and one backward per attention and per MLP. Every
// member of g calls it with the same arguments. The stage satisfies
// pipeline.Stage: its input is this member's part of the one-hot tokens
// (first stage) or the whole hidden states, its output the whole hidden
// states or this member's part of the logits (last stage), to be consumed
// by CrossEntropy (LossFunc).
func NewStage(gr *gorgonia.ExprGraph, g *dist.ProcessGroup, cfg transformer.Config, from, to, batch int) (*transformer.Stage, error) {
	if g == nil {
		return nil, fmt.Errorf("tp: NewStage: nil group: %w", ErrInvalidArgument)
	}
	return transformer.NewStage(gr, cfg, from, to, batch, Placement(g))
}

// NewDecoder builds this member's part of a KV-cache decoder for layers
// from..to of cfg over g (see transformer.NewDecoder): every member runs
// the same passes, each attention and MLP all-reducing its rows. opts may
// add transformer.WithBuildLock.
func NewDecoder(g *dist.ProcessGroup, cfg transformer.Config, from, to, slots int, opts ...transformer.StageOption) (*transformer.Decoder, error) {
	if g == nil {
		return nil, fmt.Errorf("tp: NewDecoder: nil group: %w", ErrInvalidArgument)
	}
	return transformer.NewDecoder(cfg, from, to, slots, append([]transformer.StageOption{Placement(g)}, opts...)...)
}

// LossFunc returns CrossEntropy over g as a loss of the shape
// pipeline.WithLoss takes: out is a last stage's part of the logits,
// target the same part of the one-hot targets (pipeline.WithTargetShape
// with the stage's OutputShape).
func LossFunc(g *dist.ProcessGroup) func(out, target *gorgonia.Node) (*gorgonia.Node, error) {
	return func(out, target *gorgonia.Node) (*gorgonia.Node, error) { return CrossEntropy(g, out, target) }
}

// GatherWeights joins every member's part of a model's parameters into
// whole tensors on every member of g (transformer.Unshard of the parts):
// gathering on save, so that a tensor-parallel model saves the
// single-process model's checkpoint. parts are this member's tensors, the
// same names in the same order on every member (Stage.Weights). A
// collective: one all-gather of the part sizes, then one uneven all-gather
// per split tensor. The result is new.
func GatherWeights(ctx context.Context, g *dist.ProcessGroup, parts []checkpoint.Named) ([]checkpoint.Named, error) {
	n, me := g.WorldSize(), g.Rank()
	axes := make([]int, len(parts))
	lens := make([]float64, len(parts)) // this member's length along each split axis
	for i, p := range parts {
		axis, err := transformer.ShardAxis(p.Name)
		if err != nil {
			return nil, err
		}
		axes[i] = axis
		if axis != transformer.Replicated {
			lens[i] = float64(p.Tensor.Shape()[axis])
		}
	}
	all := make([]float64, n*len(parts))
	if err := g.AllGather(ctx, dist.F64(all), dist.F64(lens)); err != nil {
		return nil, fmt.Errorf("tp: gathering weights: %w", err)
	}
	byMember := make([][]checkpoint.Named, n)
	for r := range byMember {
		byMember[r] = make([]checkpoint.Named, len(parts))
	}
	for i, p := range parts {
		d, ok := p.Tensor.(*tensor.Dense)
		if !ok {
			return nil, fmt.Errorf("tp: %q is a %T: %w", p.Name, p.Tensor, ErrInvalidArgument)
		}
		if d.IsView() {
			d = d.Materialize().(*tensor.Dense)
		}
		if axes[i] == transformer.Replicated {
			for r := range n {
				byMember[r][i] = checkpoint.Named{Name: p.Name, Tensor: d}
			}
			continue
		}
		shape := d.Shape()
		other := shape.TotalSize() / shape[axes[i]]
		counts := make([]int, n)
		total := 0
		for r := range n {
			counts[r] = int(all[r*len(parts)+i]) * other
			total += counts[r]
		}
		if counts[me] != shape.TotalSize() {
			return nil, fmt.Errorf("tp: %q: members disagree on the part sizes: %w", p.Name, ErrInvalidArgument)
		}
		var err error
		switch src := d.Data().(type) {
		case []float64:
			err = gatherParts(ctx, g, byMember, i, p.Name, src, shape, axes[i], counts, total)
		case []float32:
			err = gatherParts(ctx, g, byMember, i, p.Name, src, shape, axes[i], counts, total)
		default:
			err = fmt.Errorf("tp: %q holds %T: %w", p.Name, src, dist.ErrUnsupportedDType)
		}
		if err != nil {
			return nil, err
		}
	}
	return transformer.Unshard(byMember)
}

// gatherParts all-gathers src (this member's part of tensor i) and stores
// every member's part, as a tensor, in byMember[r][i].
func gatherParts[T float](ctx context.Context, g *dist.ProcessGroup, byMember [][]checkpoint.Named, i int, name string,
	src []T, shape tensor.Shape, axis int, counts []int, total int) error {
	dst := make([]T, total)
	if err := g.AllGatherV(ctx, buffer(dst), buffer(src), counts); err != nil {
		return fmt.Errorf("tp: gathering %q: %w", name, err)
	}
	at := 0
	for r, c := range counts {
		s := shape.Clone()
		s[axis] = c / (shape.TotalSize() / shape[axis])
		byMember[r][i] = checkpoint.Named{Name: name, Tensor: tensor.New(tensor.WithShape(s...), tensor.WithBacking(dst[at:at+c]))}
		at += c
	}
	return nil
}

// GatherLogits returns the whole logits of rows on every member of g,
// rows x vocab values in float64, from each member's part (rows x part,
// the parts in member order): an uneven all-gather, then a transposition
// of the blocks. Generation needs the whole distribution of the next token
// to sample it; training never gathers (CrossEntropy).
func GatherLogits(ctx context.Context, g *dist.ProcessGroup, part *tensor.Dense, vocab int) ([]float64, error) {
	rows, w := part.Shape()[0], part.Shape()[1]
	n := g.WorldSize()
	counts := make([]int, n)
	for r := range n {
		lo, hi := transformer.Partition(vocab, n, r)
		counts[r] = rows * (hi - lo)
	}
	if counts[g.Rank()] != rows*w {
		return nil, fmt.Errorf("tp: logits part %v of a vocabulary of %d over %d members: %w", part.Shape(), vocab, n, ErrInvalidArgument)
	}
	src := make([]float64, rows*w)
	switch d := part.Data().(type) {
	case []float64:
		copy(src, d[:rows*w])
	case []float32:
		for i, v := range d[:rows*w] {
			src[i] = float64(v)
		}
	}
	all := make([]float64, rows*vocab)
	if err := g.AllGatherV(ctx, dist.F64(all), dist.F64(src), counts); err != nil {
		return nil, fmt.Errorf("tp: gathering logits: %w", err)
	}
	out := make([]float64, rows*vocab)
	at := 0
	for r := range n {
		lo, hi := transformer.Partition(vocab, n, r)
		pw := hi - lo
		for i := range rows {
			copy(out[i*vocab+lo:i*vocab+hi], all[at+i*pw:at+(i+1)*pw])
		}
		at += rows * pw
	}
	return out, nil
}
