package ops

import (
	"context"
	"errors"
	"fmt"
	"hash"
	"hash/fnv"
	"sync/atomic"

	"github.com/chewxy/hm"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/transport"
)

// ErrNotDifferentiable is wrapped by the error of the SymDiff of a
// collective whose reduction has no gradient here (Max, Min, Prod).
// gorgonia.Grad does not pass it on matchably (see IsNotDifferentiable,
// which recognises its error).
var ErrNotDifferentiable = errors.New("ops: collective has no gradient for this reduction")

// nextID numbers op instances so that every instance hashes differently.
var nextID atomic.Uint64

type kind uint8

const (
	kindAllReduce kind = iota
	kindAllGather
	kindReduceScatter
	kindBroadcast
	kindReduce
)

func (k kind) String() string {
	switch k {
	case kindAllReduce:
		return "AllReduce"
	case kindAllGather:
		return "AllGather"
	case kindReduceScatter:
		return "ReduceScatter"
	case kindBroadcast:
		return "Broadcast"
	case kindReduce:
		return "Reduce"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// AllReduce returns a node whose value is the reduction (op) over all ranks of
// x's value; every rank gets the same result. x is a Float32 or Float64 tensor
// or scalar. For Sum and Mean the gradient of x is the same all-reduce of the
// output's gradient; Max, Min and Prod have no gradient.
func AllReduce(g *dist.ProcessGroup, x *gorgonia.Node, op dist.ReduceOp) (*gorgonia.Node, error) {
	return apply(g, x, kindAllReduce, op, 0, 0)
}

// AllGather returns the concatenation along axis 0 of every rank's x, in rank
// order: a (d0, d1, ...) input gives a (WorldSize*d0, d1, ...) output. x must
// have at least one dimension. The gradient of x is this rank's block of the
// output gradient summed over ranks (a reduce-scatter).
func AllGather(g *dist.ProcessGroup, x *gorgonia.Node) (*gorgonia.Node, error) {
	return apply(g, x, kindAllGather, dist.Sum, 0, 0)
}

// ReduceScatter reduces x over all ranks and gives rank r the r-th of
// WorldSize equal blocks along axis 0: a (d0, d1, ...) input gives a
// (d0/WorldSize, d1, ...) output; d0 must be a multiple of the world size.
// For Sum the gradient of x is the all-gather of the output gradient (scaled
// by 1/WorldSize for Mean); other reductions have no gradient.
func ReduceScatter(g *dist.ProcessGroup, x *gorgonia.Node, op dist.ReduceOp) (*gorgonia.Node, error) {
	return apply(g, x, kindReduceScatter, op, 0, 0)
}

// Broadcast returns root's value of x on every rank. The input of non-root
// ranks only gives the shape and type. The gradient of root's x is the sum of
// every rank's output gradient; the gradient of a non-root x is zero.
func Broadcast(g *dist.ProcessGroup, x *gorgonia.Node, root int) (*gorgonia.Node, error) {
	return apply(g, x, kindBroadcast, dist.Sum, root, 0)
}

// Reduce returns, on root, the reduction (op) over all ranks of x's value, and
// zeros of x's shape on every other rank. For Sum the gradient of every rank's
// x is root's output gradient (a broadcast; scaled by 1/WorldSize for Mean);
// other reductions have no gradient.
func Reduce(g *dist.ProcessGroup, x *gorgonia.Node, op dist.ReduceOp, root int) (*gorgonia.Node, error) {
	return apply(g, x, kindReduce, op, root, 0)
}

// apply validates the arguments and adds the collective node to x's graph.
// scale, if non-zero, multiplies the result (used by the gradients of Mean).
func apply(g *dist.ProcessGroup, x *gorgonia.Node, k kind, red dist.ReduceOp, root int, scale float64) (*gorgonia.Node, error) {
	if g == nil {
		return nil, fmt.Errorf("ops: %v: nil process group: %w", k, dist.ErrInvalidArgument)
	}
	if x == nil {
		return nil, fmt.Errorf("ops: %v: nil input node: %w", k, dist.ErrInvalidArgument)
	}
	if dt := x.Dtype(); dt != tensor.Float32 && dt != tensor.Float64 {
		return nil, fmt.Errorf("ops: %v of %v: %w", k, dt, dist.ErrUnsupportedDType)
	}
	n := g.WorldSize()
	switch k {
	case kindAllGather, kindReduceScatter:
		if x.Dims() == 0 {
			return nil, fmt.Errorf("ops: %v needs a tensor with at least one dimension, got a scalar: %w", k, dist.ErrInvalidArgument)
		}
		if s := x.Shape(); k == kindReduceScatter && len(s) > 0 && s[0]%n != 0 {
			return nil, fmt.Errorf("ops: %v: first dimension %d of shape %v is not a multiple of the world size %d: %w",
				k, s[0], s, n, dist.ErrInvalidArgument)
		}
	case kindBroadcast, kindReduce:
		if err := transport.CheckRank(root, n); err != nil {
			return nil, fmt.Errorf("ops: %v root: %w", k, err)
		}
	}
	op := &collectiveOp{kind: k, g: g, reduce: red, root: root, scale: scale, id: nextID.Add(1)}
	y, err := gorgonia.ApplyOp(op, x)
	if err != nil {
		return nil, fmt.Errorf("ops: %v: %w", k, err)
	}
	return y, nil
}

// collectiveOp is one collective node's operation.
type collectiveOp struct {
	kind   kind
	g      *dist.ProcessGroup
	reduce dist.ReduceOp // AllReduce, ReduceScatter, Reduce
	root   int           // Broadcast, Reduce
	scale  float64       // if non-zero, multiplies the result
	id     uint64        // unique per instance
}

var _ gorgonia.SDOp = (*collectiveOp)(nil)

// Arity implements gorgonia.Op.
func (op *collectiveOp) Arity() int { return 1 }

// Type implements gorgonia.Op: a → a (the number of dimensions is kept).
func (op *collectiveOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	return hm.NewFnType(a, a)
}

// InferShape implements gorgonia.Op.
func (op *collectiveOp) InferShape(inputs ...gorgonia.DimSizer) (tensor.Shape, error) {
	if len(inputs) != 1 {
		return nil, fmt.Errorf("ops: %v: want 1 input shape, got %d: %w", op, len(inputs), dist.ErrInvalidArgument)
	}
	s, ok := inputs[0].(tensor.Shape)
	if !ok {
		return nil, fmt.Errorf("ops: %v: input shape is a %T, not a tensor.Shape: %w", op, inputs[0], dist.ErrInvalidArgument)
	}
	return op.outShape(s)
}

func (op *collectiveOp) outShape(in tensor.Shape) (tensor.Shape, error) {
	s := in.Clone()
	n := op.g.WorldSize()
	switch op.kind {
	case kindAllGather:
		if len(s) == 0 {
			return nil, fmt.Errorf("ops: %v of a scalar: %w", op, dist.ErrInvalidArgument)
		}
		s[0] *= n
	case kindReduceScatter:
		if len(s) == 0 || s[0]%n != 0 {
			return nil, fmt.Errorf("ops: %v: shape %v does not split into %d blocks along axis 0: %w", op, in, n, dist.ErrInvalidArgument)
		}
		s[0] /= n
	}
	return s, nil
}

// Do implements gorgonia.Op. It runs the collective synchronously on a copy
// of the input; the returned value is newly allocated and owned by the caller.
func (op *collectiveOp) Do(inputs ...gorgonia.Value) (gorgonia.Value, error) {
	if len(inputs) != 1 {
		return nil, fmt.Errorf("ops: %v: want 1 input, got %d: %w", op, len(inputs), dist.ErrInvalidArgument)
	}
	ctx := context.Background() // the group applies its default timeout
	switch in := inputs[0].(type) {
	case *gorgonia.F64:
		buf := []float64{float64(*in)}
		if err := run(ctx, op, buf, buf); err != nil {
			return nil, err
		}
		return gorgonia.NewF64(buf[0]), nil
	case *gorgonia.F32:
		buf := []float32{float32(*in)}
		if err := run(ctx, op, buf, buf); err != nil {
			return nil, err
		}
		return gorgonia.NewF32(buf[0]), nil
	case tensor.Tensor:
		if in.RequiresIterator() {
			if d, ok := in.(*tensor.Dense); ok {
				in = d.Materialize()
			}
		}
		shape, err := op.outShape(in.Shape())
		if err != nil {
			return nil, err
		}
		out := tensor.New(tensor.WithShape(shape...), tensor.Of(in.Dtype()))
		switch src := in.Data().(type) {
		case []float64:
			err = run(ctx, op, out.Data().([]float64), src)
		case []float32:
			err = run(ctx, op, out.Data().([]float32), src)
		default:
			err = fmt.Errorf("ops: %v of %v: %w", op, in.Dtype(), dist.ErrUnsupportedDType)
		}
		if err != nil {
			return nil, err
		}
		return out, nil
	default:
		return nil, fmt.Errorf("ops: %v of a %T: %w", op, in, dist.ErrUnsupportedDType)
	}
}

// float is the element types the ops run on.
type float interface{ float32 | float64 }

// buffer returns x as the collectives take it.
func buffer[T float](x []T) dist.Buffer {
	switch v := any(x).(type) {
	case []float32:
		return dist.F32(v)
	case []float64:
		return dist.F64(v)
	}
	panic("ops: unreachable")
}

// run computes op's collective of src into dst (which may be src for the
// in-place collectives). src is only read: every in-place collective works
// on dst, never on the caller's input register.
func run[T float](ctx context.Context, op *collectiveOp, dst, src []T) error {
	g := op.g
	d, s := buffer(dst), buffer(src)
	var err error
	switch op.kind {
	case kindAllReduce:
		copy(dst, src)
		err = g.AllReduce(ctx, d, op.reduce)
	case kindAllGather:
		err = g.AllGather(ctx, d, s)
	case kindReduceScatter:
		err = g.ReduceScatter(ctx, d, s, op.reduce)
	case kindBroadcast:
		copy(dst, src)
		err = g.Broadcast(ctx, d, op.root)
	case kindReduce:
		copy(dst, src)
		err = g.Reduce(ctx, d, op.reduce, op.root)
		if err == nil && g.Rank() != op.root {
			clear(dst)
		}
	}
	if err != nil {
		return fmt.Errorf("ops: %v: %w", op, err)
	}
	if op.scale != 0 {
		s := T(op.scale)
		for i := range dst {
			dst[i] *= s
		}
	}
	return nil
}

// ReturnsPtr implements gorgonia.Op: the result is a new value.
func (op *collectiveOp) ReturnsPtr() bool { return false }

// CallsExtern implements gorgonia.Op.
func (op *collectiveOp) CallsExtern() bool { return false }

// OverwritesInput implements gorgonia.Op: the input is never written.
func (op *collectiveOp) OverwritesInput() int { return -1 }

// WriteHash implements gorgonia.Op. The instance id makes every op unique.
func (op *collectiveOp) WriteHash(h hash.Hash) {
	fmt.Fprintf(h, "gdist.%v{%v,root=%d,scale=%g}#%d", op.kind, op.reduce, op.root, op.scale, op.id)
}

// Hashcode implements gorgonia.Op.
func (op *collectiveOp) Hashcode() uint32 {
	h := fnv.New32a()
	op.WriteHash(h)
	return h.Sum32()
}

// String implements gorgonia.Op.
func (op *collectiveOp) String() string {
	switch op.kind {
	case kindAllGather:
		return fmt.Sprintf("%v#%d", op.kind, op.id)
	case kindBroadcast:
		return fmt.Sprintf("%v(root=%d)#%d", op.kind, op.root, op.id)
	case kindReduce:
		return fmt.Sprintf("%v(%v,root=%d)#%d", op.kind, op.reduce, op.root, op.id)
	}
	return fmt.Sprintf("%v(%v)#%d", op.kind, op.reduce, op.id)
}

// DiffWRT implements gorgonia.SDOp.
func (op *collectiveOp) DiffWRT(inputs int) []bool { return []bool{true} }

// SymDiff implements gorgonia.SDOp: it adds the adjoint collective of grad
// (see the package documentation) to the graph.
func (op *collectiveOp) SymDiff(inputs gorgonia.Nodes, output, grad *gorgonia.Node) (gorgonia.Nodes, error) {
	if len(inputs) != 1 {
		return nil, fmt.Errorf("ops: %v: want 1 input, got %d: %w", op, len(inputs), dist.ErrInvalidArgument)
	}
	mean := 1 / float64(op.g.WorldSize())
	scaled := func(s float64) float64 { // combine with this op's own scale
		if op.scale != 0 {
			return s * op.scale
		}
		return s
	}
	var (
		gx  *gorgonia.Node
		err error
	)
	if !op.differentiable() {
		return nil, op.notDifferentiable()
	}
	switch op.kind {
	case kindAllReduce:
		gx, err = apply(op.g, grad, kindAllReduce, op.reduce, 0, op.scale)
	case kindAllGather:
		gx, err = apply(op.g, grad, kindReduceScatter, dist.Sum, 0, op.scale)
	case kindReduceScatter:
		if op.reduce == dist.Mean {
			gx, err = apply(op.g, grad, kindAllGather, dist.Sum, 0, scaled(mean))
		} else {
			gx, err = apply(op.g, grad, kindAllGather, dist.Sum, 0, op.scale)
		}
	case kindBroadcast:
		gx, err = apply(op.g, grad, kindReduce, dist.Sum, op.root, op.scale)
	case kindReduce:
		if op.reduce == dist.Mean {
			gx, err = apply(op.g, grad, kindBroadcast, dist.Sum, op.root, scaled(mean))
		} else {
			gx, err = apply(op.g, grad, kindBroadcast, dist.Sum, op.root, op.scale)
		}
	}
	if err != nil {
		return nil, err
	}
	return gorgonia.Nodes{gx}, nil
}

// differentiable reports whether op has a gradient: AllGather and
// Broadcast always, the reductions only for Sum and Mean.
func (op *collectiveOp) differentiable() bool {
	switch op.kind {
	case kindAllGather, kindBroadcast:
		return true
	}
	return op.reduce == dist.Sum || op.reduce == dist.Mean
}

func (op *collectiveOp) notDifferentiable() error {
	return fmt.Errorf("ops: %v: %w", op, ErrNotDifferentiable)
}

// IsNotDifferentiable reports whether err says that a graph was
// differentiated through a collective that has no gradient (Max, Min or
// Prod; see ErrNotDifferentiable).
//
// gorgonia.Grad and gorgonia.Backpropagate return a gorgonia.SymDiffError
// when an op's SymDiff fails, and that error keeps the op's error without
// unwrapping to it, so errors.Is(err, ErrNotDifferentiable) is false on
// what they return. IsNotDifferentiable also recognises that case: a
// SymDiffError (possibly wrapped) whose failing node is one of this
// package's collectives without a gradient. On errors from this package,
// for example an op's own SymDiff, it is errors.Is(err,
// ErrNotDifferentiable).
func IsNotDifferentiable(err error) bool {
	if errors.Is(err, ErrNotDifferentiable) {
		return true
	}
	var sde gorgonia.SymDiffError
	if !errors.As(err, &sde) || sde.Node() == nil || sde.Grad() == nil {
		// Grad() is set only when the node's SymDiff itself failed.
		return false
	}
	op, ok := sde.Node().Op().(*collectiveOp)
	return ok && !op.differentiable()
}
