package tp

import (
	"context"
	"fmt"
	"hash"
	"hash/fnv"
	"sync/atomic"

	"github.com/chewxy/hm"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
)

// ErrInvalidArgument is matched by the errors of bad arguments. It is the
// value every gdist package exports under this name.
var ErrInvalidArgument = dist.ErrInvalidArgument

// region is what a regionOp does forward (Megatron-LM's mappings.py).
type region uint8

const (
	regionCopy    region = iota // f: identity forward, all-reduce backward
	regionReduce                // g: all-reduce forward, identity backward
	regionGather                // all-gather along the last axis forward, split backward
	regionScatter               // split along the last axis forward, all-gather backward
)

func (r region) String() string {
	switch r {
	case regionCopy:
		return "Copy"
	case regionReduce:
		return "Reduce"
	case regionGather:
		return "Gather"
	case regionScatter:
		return "Scatter"
	}
	return fmt.Sprintf("region(%d)", uint8(r))
}

var nextID atomic.Uint64

// Copy returns x unchanged; in the backward pass the gradient of x is the
// sum over the group of the output's gradients (Megatron's f,
// copy_to_tensor_model_parallel_region). Put it before a column-parallel
// layer, whose input every member holds whole.
func Copy(g *dist.ProcessGroup, x *gorgonia.Node) (*gorgonia.Node, error) {
	return applyRegion(g, x, regionCopy)
}

// Reduce returns the sum of x over the group; in the backward pass the
// gradient of x is the output's gradient (Megatron's g,
// reduce_from_tensor_model_parallel_region). Put it after a row-parallel
// layer, whose output each member holds a partial sum of.
func Reduce(g *dist.ProcessGroup, x *gorgonia.Node) (*gorgonia.Node, error) {
	return applyRegion(g, x, regionReduce)
}

// Gather concatenates every member's x along the last axis, in member
// order: a [..., c] input gives [..., n*c]. The gradient of x is this
// member's columns of the output's gradient (Megatron's
// gather_from_tensor_model_parallel_region).
func Gather(g *dist.ProcessGroup, x *gorgonia.Node) (*gorgonia.Node, error) {
	return applyRegion(g, x, regionGather)
}

// Scatter returns this member's part of x along the last axis, which must
// split evenly over the group: a [..., n*c] input gives [..., c]. The
// gradient of x is the concatenation of every member's output gradient
// (Megatron's scatter_to_tensor_model_parallel_region).
func Scatter(g *dist.ProcessGroup, x *gorgonia.Node) (*gorgonia.Node, error) {
	return applyRegion(g, x, regionScatter)
}

func applyRegion(g *dist.ProcessGroup, x *gorgonia.Node, r region) (*gorgonia.Node, error) {
	if g == nil || x == nil {
		return nil, fmt.Errorf("tp: %v: nil group or node: %w", r, ErrInvalidArgument)
	}
	if dt := x.Dtype(); dt != tensor.Float32 && dt != tensor.Float64 {
		return nil, fmt.Errorf("tp: %v of %v: %w", r, dt, dist.ErrUnsupportedDType)
	}
	op := &regionOp{kind: r, g: g, id: nextID.Add(1)}
	if _, err := op.outShape(x.Shape()); err != nil {
		return nil, err
	}
	y, err := gorgonia.ApplyOp(op, x)
	if err != nil {
		return nil, fmt.Errorf("tp: %v: %w", r, err)
	}
	return y, nil
}

// regionOp is one of Megatron's four mappings on a group.
type regionOp struct {
	kind region
	g    *dist.ProcessGroup
	id   uint64
}

var _ gorgonia.SDOp = (*regionOp)(nil)

func (op *regionOp) Arity() int { return 1 }

func (op *regionOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	return hm.NewFnType(a, a)
}

func (op *regionOp) InferShape(in ...gorgonia.DimSizer) (tensor.Shape, error) {
	s, ok := in[0].(tensor.Shape)
	if !ok {
		return nil, fmt.Errorf("tp: %v: input shape %v: %w", op.kind, in[0], ErrInvalidArgument)
	}
	return op.outShape(s)
}

func (op *regionOp) outShape(in tensor.Shape) (tensor.Shape, error) {
	s := in.Clone()
	n := op.g.WorldSize()
	switch op.kind {
	case regionGather, regionScatter:
		if len(s) == 0 {
			return nil, fmt.Errorf("tp: %v of a scalar: %w", op.kind, ErrInvalidArgument)
		}
		last := len(s) - 1
		if op.kind == regionGather {
			s[last] *= n
		} else {
			if s[last]%n != 0 {
				return nil, fmt.Errorf("tp: Scatter: last dimension of %v does not split over %d members: %w", in, n, ErrInvalidArgument)
			}
			s[last] /= n
		}
	}
	return s, nil
}

func (op *regionOp) Do(in ...gorgonia.Value) (gorgonia.Value, error) {
	x, ok := in[0].(*tensor.Dense)
	if !ok {
		return nil, fmt.Errorf("tp: %v of a %T: %w", op.kind, in[0], dist.ErrUnsupportedDType)
	}
	if x.RequiresIterator() {
		x = x.Materialize().(*tensor.Dense)
	}
	shape, err := op.outShape(x.Shape())
	if err != nil {
		return nil, err
	}
	switch src := x.Data().(type) {
	case []float64:
		return regionDo(op, src, x.Shape(), shape)
	case []float32:
		return regionDo(op, src, x.Shape(), shape)
	}
	return nil, fmt.Errorf("tp: %v of %v: %w", op.kind, x.Dtype(), dist.ErrUnsupportedDType)
}

type float interface{ ~float32 | ~float64 }

func buffer[T float](x []T) dist.Buffer {
	switch v := any(x).(type) {
	case []float32:
		return dist.F32(v)
	case []float64:
		return dist.F64(v)
	}
	panic("tp: unreachable")
}

// regionDo runs op on src (never written) into a new tensor.
func regionDo[T float](op *regionOp, src []T, in, out tensor.Shape) (*tensor.Dense, error) {
	ctx := context.Background() // the group applies its default timeout
	dst := make([]T, out.TotalSize())
	n, me := op.g.WorldSize(), op.g.Rank()
	switch op.kind {
	case regionCopy:
		copy(dst, src)
	case regionReduce:
		copy(dst, src)
		if err := op.g.AllReduce(ctx, buffer(dst), dist.Sum); err != nil {
			return nil, fmt.Errorf("tp: %v: %w", op.kind, err)
		}
	case regionGather:
		c := in[len(in)-1]
		rows := len(src) / max(c, 1)
		all := make([]T, n*len(src)) // member r's block at [r*len(src), ...)
		if err := op.g.AllGather(ctx, buffer(all), buffer(src)); err != nil {
			return nil, fmt.Errorf("tp: %v: %w", op.kind, err)
		}
		for r := range n {
			for i := range rows {
				copy(dst[i*n*c+r*c:i*n*c+(r+1)*c], all[r*len(src)+i*c:r*len(src)+(i+1)*c])
			}
		}
	case regionScatter:
		c := out[len(out)-1]
		rows := len(dst) / max(c, 1)
		for i := range rows {
			copy(dst[i*c:(i+1)*c], src[i*n*c+me*c:i*n*c+(me+1)*c])
		}
	}
	return tensor.New(tensor.WithShape(out...), tensor.WithBacking(dst)), nil
}

func (op *regionOp) ReturnsPtr() bool     { return false }
func (op *regionOp) CallsExtern() bool    { return false }
func (op *regionOp) OverwritesInput() int { return -1 }

func (op *regionOp) WriteHash(h hash.Hash) { fmt.Fprintf(h, "gdist.tp.%v#%d", op.kind, op.id) }

func (op *regionOp) Hashcode() uint32 {
	h := fnv.New32a()
	op.WriteHash(h)
	return h.Sum32()
}

func (op *regionOp) String() string { return fmt.Sprintf("tp.%v#%d", op.kind, op.id) }

func (op *regionOp) DiffWRT(int) []bool { return []bool{true} }

// SymDiff adds the conjugate mapping of grad: Copy <-> Reduce, Gather <->
// Scatter.
func (op *regionOp) SymDiff(inputs gorgonia.Nodes, output, grad *gorgonia.Node) (gorgonia.Nodes, error) {
	var adj region
	switch op.kind {
	case regionCopy:
		adj = regionReduce
	case regionReduce:
		return gorgonia.Nodes{grad}, nil
	case regionGather:
		adj = regionScatter
	case regionScatter:
		adj = regionGather
	}
	gx, err := applyRegion(op.g, grad, adj)
	if err != nil {
		return nil, err
	}
	return gorgonia.Nodes{gx}, nil
}
