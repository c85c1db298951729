package ops

import (
	"context"
	"errors"
	"fmt"
	"hash"
	"hash/fnv"
	"slices"
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
	kindAllToAll
	kindAllToAllV
	kindGather
	kindScatter
	kindAllGatherV
	kindReduceScatterV // the gradient of AllGatherV; not exported
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
	case kindAllToAll:
		return "AllToAll"
	case kindAllToAllV:
		return "AllToAllV"
	case kindGather:
		return "Gather"
	case kindScatter:
		return "Scatter"
	case kindAllGatherV:
		return "AllGatherV"
	case kindReduceScatterV:
		return "ReduceScatterV"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// hasRoot reports whether the collective has a root member.
func (k kind) hasRoot() bool {
	switch k {
	case kindBroadcast, kindReduce, kindGather, kindScatter:
		return true
	}
	return false
}

// keepsShape reports whether the collective's output has its input's
// shape, scalars included; the others work on axis 0 of a tensor.
func (k kind) keepsShape() bool {
	switch k {
	case kindAllReduce, kindBroadcast, kindReduce:
		return true
	}
	return false
}

// AllReduce returns a node whose value is the reduction (op) over all ranks of
// x's value; every rank gets the same result. x is a Float32 or Float64 tensor
// or scalar. For Sum and Mean the gradient of x is the same all-reduce of the
// output's gradient; Max, Min and Prod have no gradient.
func AllReduce(g *dist.ProcessGroup, x *gorgonia.Node, op dist.ReduceOp) (*gorgonia.Node, error) {
	return apply(x, collectiveOp{kind: kindAllReduce, g: g, reduce: op})
}

// AllGather returns the concatenation along axis 0 of every rank's x, in rank
// order: a (d0, d1, ...) input gives a (WorldSize*d0, d1, ...) output. x must
// have at least one dimension. The gradient of x is this rank's block of the
// output gradient summed over ranks (a reduce-scatter).
func AllGather(g *dist.ProcessGroup, x *gorgonia.Node) (*gorgonia.Node, error) {
	return apply(x, collectiveOp{kind: kindAllGather, g: g})
}

// ReduceScatter reduces x over all ranks and gives rank r the r-th of
// WorldSize equal blocks along axis 0: a (d0, d1, ...) input gives a
// (d0/WorldSize, d1, ...) output; d0 must be a multiple of the world size.
// For Sum the gradient of x is the all-gather of the output gradient (scaled
// by 1/WorldSize for Mean); other reductions have no gradient.
func ReduceScatter(g *dist.ProcessGroup, x *gorgonia.Node, op dist.ReduceOp) (*gorgonia.Node, error) {
	return apply(x, collectiveOp{kind: kindReduceScatter, g: g, reduce: op})
}

// Broadcast returns root's value of x on every rank. The input of non-root
// ranks only gives the shape and type. The gradient of root's x is the sum of
// every rank's output gradient; the gradient of a non-root x is zero.
func Broadcast(g *dist.ProcessGroup, x *gorgonia.Node, root int) (*gorgonia.Node, error) {
	return apply(x, collectiveOp{kind: kindBroadcast, g: g, root: root})
}

// Reduce returns, on root, the reduction (op) over all ranks of x's value, and
// zeros of x's shape on every other rank. For Sum the gradient of every rank's
// x is root's output gradient (a broadcast; scaled by 1/WorldSize for Mean);
// other reductions have no gradient.
func Reduce(g *dist.ProcessGroup, x *gorgonia.Node, op dist.ReduceOp, root int) (*gorgonia.Node, error) {
	return apply(x, collectiveOp{kind: kindReduce, g: g, reduce: op, root: root})
}

// AllToAll exchanges blocks of rows with every rank (torch's
// all_to_all_single with equal splits): x, of shape (d0, d1, ...) with d0 a
// multiple of the world size n, is cut along axis 0 into n blocks of d0/n
// rows; block j goes to rank j, and block j of the output, of x's shape, is
// rank j's block for this rank. Every rank passes the same shape. The
// gradient of x is the all-to-all of the output gradient (the reverse
// exchange, which for equal blocks is the same AllToAll).
func AllToAll(g *dist.ProcessGroup, x *gorgonia.Node) (*gorgonia.Node, error) {
	return apply(x, collectiveOp{kind: kindAllToAll, g: g})
}

// AllToAllV is AllToAll with blocks of different sizes (torch's
// all_to_all_single with split sizes): counts are in rows of axis 0, each
// row being d1*d2*... elements. Rank j receives the sendCounts[j] rows of x
// that follow those for ranks 0..j-1; the output, of shape
// (sum(recvCounts), d1, ...), holds recvCounts[j] rows from each rank j, in
// rank order. x must have sum(sendCounts) rows, and recvCounts[j] must be
// rank j's sendCounts for this rank (a mismatch between ranks fails when the
// graph runs). Counts may be zero. The slices stay the caller's: the op
// keeps copies. The gradient of x is the AllToAllV of the output gradient
// with sendCounts and recvCounts swapped.
func AllToAllV(g *dist.ProcessGroup, x *gorgonia.Node, sendCounts, recvCounts []int) (*gorgonia.Node, error) {
	return apply(x, collectiveOp{kind: kindAllToAllV, g: g, counts: slices.Clone(sendCounts), recvCounts: slices.Clone(recvCounts)})
}

// Gather returns, on root, the concatenation along axis 0 of every rank's x
// in rank order, and zeros of the same shape on every other rank: a
// (d0, d1, ...) input gives a (WorldSize*d0, d1, ...) output on every rank
// (a node's shape cannot depend on the rank), and every rank passes the same
// shape. The gradient of rank r's x is block r of root's output gradient (a
// scatter from root); the other ranks' output gradients do not count, as
// their outputs are constant.
func Gather(g *dist.ProcessGroup, x *gorgonia.Node, root int) (*gorgonia.Node, error) {
	return apply(x, collectiveOp{kind: kindGather, g: g, root: root})
}

// Scatter gives rank r block r of root's x: x has shape (n*d0, d1, ...),
// n the world size, and the output (d0, d1, ...). Only root's values are
// read; the input of the other ranks gives the shape and type. The gradient
// of root's x is the concatenation of every rank's output gradient (a gather
// to root); the gradient of a non-root x is zero.
func Scatter(g *dist.ProcessGroup, x *gorgonia.Node, root int) (*gorgonia.Node, error) {
	return apply(x, collectiveOp{kind: kindScatter, g: g, root: root})
}

// AllGatherV is AllGather with contributions of different sizes
// (MPI_Allgatherv): counts are in rows of axis 0, rank r contributes its x of
// counts[r] rows (counts[Rank()] must be x's first dimension), and every
// rank gets the concatenation, of shape (sum(counts), d1, ...), in rank
// order. Every rank passes the same counts; counts may be zero. The slice
// stays the caller's: the op keeps a copy. The gradient of x is this rank's
// rows of the output gradient summed over ranks: a reduce-scatter with
// uneven blocks, done as an AllToAllV that sends every rank its rows of the
// gradient followed by a local sum, so that each rank receives only its own
// rows.
func AllGatherV(g *dist.ProcessGroup, x *gorgonia.Node, counts []int) (*gorgonia.Node, error) {
	return apply(x, collectiveOp{kind: kindAllGatherV, g: g, counts: slices.Clone(counts)})
}

// apply gives op (kind, group, reduction, root, counts and scale) a new id,
// validates its arguments and adds its node to x's graph.
func apply(x *gorgonia.Node, op collectiveOp) (*gorgonia.Node, error) {
	k, g := op.kind, op.g
	op.id = nextID.Add(1)
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
	if k.hasRoot() {
		if err := transport.CheckRank(op.root, n); err != nil {
			return nil, fmt.Errorf("ops: %v root: %w", k, err)
		}
	}
	switch k {
	case kindAllToAllV:
		if err := checkCounts(k, "send counts", op.counts, n); err != nil {
			return nil, err
		}
		if err := checkCounts(k, "receive counts", op.recvCounts, n); err != nil {
			return nil, err
		}
		if me := g.Rank(); op.counts[me] != op.recvCounts[me] {
			return nil, fmt.Errorf("ops: %v: rank %d sends itself %d rows and receives %d: %w",
				k, me, op.counts[me], op.recvCounts[me], dist.ErrInvalidArgument)
		}
	case kindAllGatherV, kindReduceScatterV:
		if err := checkCounts(k, "counts", op.counts, n); err != nil {
			return nil, err
		}
	}
	if _, err := op.outShape(x.Shape()); err != nil {
		return nil, err
	}
	y, err := gorgonia.ApplyOp(&op, x)
	if err != nil {
		return nil, fmt.Errorf("ops: %v: %w", k, err)
	}
	return y, nil
}

// checkCounts checks that counts has one non-negative count per rank.
func checkCounts(k kind, what string, counts []int, n int) error {
	if len(counts) != n {
		return fmt.Errorf("ops: %v: %d %s for a group of %d: %w", k, len(counts), what, n, dist.ErrInvalidArgument)
	}
	for r, c := range counts {
		if c < 0 {
			return fmt.Errorf("ops: %v: %s[%d] = %d: %w", k, what, r, c, dist.ErrInvalidArgument)
		}
	}
	return nil
}

func sum(counts []int) int {
	t := 0
	for _, c := range counts {
		t += c
	}
	return t
}

// collectiveOp is one collective node's operation.
type collectiveOp struct {
	kind   kind
	g      *dist.ProcessGroup
	reduce dist.ReduceOp // AllReduce, ReduceScatter, Reduce
	root   int           // Broadcast, Reduce, Gather, Scatter
	// Rows of axis 0 per rank: AllToAllV's send counts (counts) and receive
	// counts (recvCounts); the counts of AllGatherV and ReduceScatterV. The
	// op's own copies.
	counts, recvCounts []int
	scale              float64 // if non-zero, multiplies the result
	id                 uint64  // unique per instance
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
	if op.kind.keepsShape() {
		return s, nil
	}
	if len(s) == 0 {
		return nil, fmt.Errorf("ops: %v needs a tensor with at least one dimension, got a scalar: %w", op, dist.ErrInvalidArgument)
	}
	n, me := op.g.WorldSize(), op.g.Rank()
	var want int // the rows x must have, if fixed by the counts
	switch op.kind {
	case kindAllGather, kindGather:
		s[0] *= n
	case kindReduceScatter, kindScatter:
		if s[0]%n != 0 {
			return nil, fmt.Errorf("ops: %v: first dimension %d of shape %v is not a multiple of the world size %d: %w",
				op, s[0], in, n, dist.ErrInvalidArgument)
		}
		s[0] /= n
	case kindAllToAll:
		if s[0]%n != 0 {
			return nil, fmt.Errorf("ops: %v: first dimension %d of shape %v is not a multiple of the world size %d: %w",
				op, s[0], in, n, dist.ErrInvalidArgument)
		}
		return s, nil
	case kindAllToAllV:
		want, s[0] = sum(op.counts), sum(op.recvCounts)
	case kindAllGatherV:
		want, s[0] = op.counts[me], sum(op.counts)
	case kindReduceScatterV:
		want, s[0] = sum(op.counts), op.counts[me]
	}
	switch op.kind {
	case kindAllToAllV, kindAllGatherV, kindReduceScatterV:
		if in[0] != want {
			return nil, fmt.Errorf("ops: %v: rank %d's input has %d rows (shape %v), its counts say %d: %w",
				op, me, in[0], in, want, dist.ErrInvalidArgument)
		}
	}
	return s, nil
}

// Do implements gorgonia.Op. It runs the collective synchronously on a copy
// of the input; the returned value is newly allocated and owned by the caller.
func (op *collectiveOp) Do(inputs ...gorgonia.Value) (gorgonia.Value, error) {
	if len(inputs) != 1 {
		return nil, fmt.Errorf("ops: %v: want 1 input, got %d: %w", op, len(inputs), dist.ErrInvalidArgument)
	}
	if _, ok := inputs[0].(gorgonia.Scalar); ok {
		if _, err := op.outShape(tensor.ScalarShape()); err != nil {
			return nil, err
		}
	}
	ctx := context.Background() // the group applies its default timeout
	switch in := inputs[0].(type) {
	case *gorgonia.F64:
		buf := []float64{float64(*in)}
		if err := run(ctx, op, buf, buf, 1); err != nil {
			return nil, err
		}
		return gorgonia.NewF64(buf[0]), nil
	case *gorgonia.F32:
		buf := []float32{float32(*in)}
		if err := run(ctx, op, buf, buf, 1); err != nil {
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
		switch in.Dtype() {
		case tensor.Float64:
			return runTensor[float64](ctx, op, in, shape)
		case tensor.Float32:
			return runTensor[float32](ctx, op, in, shape)
		}
		return nil, fmt.Errorf("ops: %v of %v: %w", op, in.Dtype(), dist.ErrUnsupportedDType)
	}
	return nil, fmt.Errorf("ops: %v of a %T: %w", op, inputs[0], dist.ErrUnsupportedDType)
}

// runTensor runs op's collective of in into a new tensor of the given shape.
// Tensors may have no elements (a zero count): the tensor package panics
// when asked for the data of an empty tensor it allocated, so the output is
// made over an explicit backing slice and an empty input is not read.
func runTensor[T float](ctx context.Context, op *collectiveOp, in tensor.Tensor, shape tensor.Shape) (tensor.Tensor, error) {
	var src []T
	if in.Shape().TotalSize() > 0 {
		src = in.Data().([]T)
	}
	dst := make([]T, shape.TotalSize())
	row := 1 // elements per row of axis 0
	if s := in.Shape(); len(s) > 1 {
		row = tensor.Shape(s[1:]).TotalSize()
	}
	if err := run(ctx, op, dst, src, row); err != nil {
		return nil, err
	}
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(dst)), nil
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

// elements returns counts in rows as counts in elements, row elements a row.
func elements(counts []int, row int) []int {
	out := make([]int, len(counts))
	for i, c := range counts {
		out[i] = c * row
	}
	return out
}

// run computes op's collective of src into dst (which may be src for the
// in-place collectives); row is the number of elements in a row of axis 0,
// the unit of op's counts. src is only read: every in-place collective
// works on dst, never on the caller's input register.
func run[T float](ctx context.Context, op *collectiveOp, dst, src []T, row int) error {
	g := op.g
	d, s := buffer(dst), buffer(src)
	isRoot := g.Rank() == op.root
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
		if err == nil && !isRoot {
			clear(dst)
		}
	case kindAllToAll:
		err = g.AllToAll(ctx, d, s)
	case kindAllToAllV:
		err = g.AllToAllV(ctx, d, s, elements(op.counts, row), elements(op.recvCounts, row))
	case kindGather: // dst, newly allocated, stays zero away from root
		if !isRoot {
			d = dist.Buffer{}
		}
		err = g.Gather(ctx, d, s, op.root)
	case kindScatter:
		if !isRoot {
			s = dist.Buffer{}
		}
		err = g.Scatter(ctx, d, s, op.root)
	case kindAllGatherV:
		err = g.AllGatherV(ctx, d, s, elements(op.counts, row))
	case kindReduceScatterV:
		err = reduceScatterV(ctx, g, dst, src, elements(op.counts, row))
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

// reduceScatterV sums src over g's members and leaves this member's block
// of the sum in dst; block r is counts[r] elements, in member order. Every
// member's blocks for member r travel to r alone (an all-to-all), and r
// adds them up in member order, so each member receives only what it keeps.
func reduceScatterV[T float](ctx context.Context, g *dist.ProcessGroup, dst, src []T, counts []int) error {
	n, m := g.WorldSize(), len(dst)
	parts := make([]T, n*m) // member j's block for this member at [j*m, (j+1)*m)
	recv := make([]int, n)
	for j := range recv {
		recv[j] = m
	}
	if err := g.AllToAllV(ctx, buffer(parts), buffer(src), counts, recv); err != nil {
		return err
	}
	clear(dst)
	for j := range n {
		for i, v := range parts[j*m : (j+1)*m] {
			dst[i] += v
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
	fmt.Fprintf(h, "gdist.%v{%v,root=%d,counts=%v,recv=%v,scale=%g}#%d",
		op.kind, op.reduce, op.root, op.counts, op.recvCounts, op.scale, op.id)
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
	case kindAllGather, kindAllToAll:
		return fmt.Sprintf("%v#%d", op.kind, op.id)
	case kindBroadcast, kindGather, kindScatter:
		return fmt.Sprintf("%v(root=%d)#%d", op.kind, op.root, op.id)
	case kindReduce:
		return fmt.Sprintf("%v(%v,root=%d)#%d", op.kind, op.reduce, op.root, op.id)
	case kindAllToAllV:
		return fmt.Sprintf("%v(send=%v,recv=%v)#%d", op.kind, op.counts, op.recvCounts, op.id)
	case kindAllGatherV, kindReduceScatterV:
		return fmt.Sprintf("%v(%v)#%d", op.kind, op.counts, op.id)
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
	if !op.differentiable() {
		return nil, op.notDifferentiable()
	}
	// The adjoint runs on the same group and carries this op's scale.
	adj := collectiveOp{g: op.g, reduce: dist.Sum, root: op.root, scale: op.scale}
	switch op.kind {
	case kindAllReduce:
		adj.kind, adj.reduce = kindAllReduce, op.reduce
	case kindAllGather:
		adj.kind = kindReduceScatter
	case kindReduceScatter:
		adj.kind = kindAllGather
		if op.reduce == dist.Mean {
			adj.scale = scaled(mean)
		}
	case kindBroadcast:
		adj.kind = kindReduce
	case kindReduce:
		adj.kind = kindBroadcast
		if op.reduce == dist.Mean {
			adj.scale = scaled(mean)
		}
	case kindAllToAll:
		adj.kind = kindAllToAll
	case kindAllToAllV:
		adj.kind, adj.counts, adj.recvCounts = kindAllToAllV, op.recvCounts, op.counts
	case kindGather:
		adj.kind = kindScatter
	case kindScatter:
		adj.kind = kindGather
	case kindAllGatherV:
		adj.kind, adj.counts = kindReduceScatterV, op.counts
	case kindReduceScatterV:
		adj.kind, adj.counts = kindAllGatherV, op.counts
	}
	gx, err := apply(grad, adj)
	if err != nil {
		return nil, err
	}
	return gorgonia.Nodes{gx}, nil
}

// differentiable reports whether op has a gradient: the collectives that
// move data always, the reductions (AllReduce, ReduceScatter, Reduce) only
// for Sum and Mean.
func (op *collectiveOp) differentiable() bool {
	switch op.kind {
	case kindAllReduce, kindReduceScatter, kindReduce:
		return op.reduce == dist.Sum || op.reduce == dist.Mean
	}
	return true
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
