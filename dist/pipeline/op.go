package pipeline

import (
	"errors"
	"fmt"
	"hash"
	"hash/fnv"
	"sync/atomic"

	"github.com/chewxy/hm"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// errAbandoned is what the exchange op returns to stop a tape after its
// forward half (a forward-only run of a recomputing stage, or a slot given
// up after a failure).
var errAbandoned = errors.New("pipeline: run abandoned")

var opIDs atomic.Uint64

// exchange is the rendezvous between a slot's tape, paused inside the
// exchange op, and the scheduler.
type exchange struct {
	// ready receives a copy of the stage output when the forward pass is
	// done (the buffer then belongs to the receiver).
	ready chan any
	// resume receives true once grad holds the output's gradient, false to
	// abandon the run.
	resume chan bool
	// grad is the gradient tensor the op returns: filled by the scheduler
	// while the tape is paused.
	grad *tensor.Dense
	pool *pools
}

// exchangeOp marks the end of a stage's forward pass inside a training
// graph: out -> exchange(out) = dLoss/dout. Its Do hands a copy of out to
// the scheduler, waits until the scheduler has received the gradient from
// the next stage, and returns it; Backpropagate uses the node as the
// gradient of out. The op itself is not differentiable, so the tape runs
// the whole forward pass before it and the backward pass after it.
type exchangeOp struct {
	x     *exchange
	shape tensor.Shape
	id    uint64
}

func newExchangeOp(x *exchange, shape tensor.Shape) *exchangeOp {
	return &exchangeOp{x: x, shape: shape.Clone(), id: opIDs.Add(1)}
}

func (op *exchangeOp) Arity() int { return 1 }

func (op *exchangeOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	return hm.NewFnType(a, a)
}

func (op *exchangeOp) InferShape(in ...gorgonia.DimSizer) (tensor.Shape, error) {
	return op.shape.Clone(), nil
}

func (op *exchangeOp) Do(in ...gorgonia.Value) (gorgonia.Value, error) {
	if len(in) != 1 {
		return nil, fmt.Errorf("%w: exchange of %d values", ErrStage, len(in))
	}
	src, err := denseData(in[0])
	if err != nil {
		return nil, err
	}
	buf := op.x.pool.clone(src)
	op.x.ready <- buf
	if ok := <-op.x.resume; !ok {
		return nil, errAbandoned
	}
	return op.x.grad, nil
}

func (op *exchangeOp) ReturnsPtr() bool     { return false }
func (op *exchangeOp) CallsExtern() bool    { return false }
func (op *exchangeOp) OverwritesInput() int { return -1 }
func (op *exchangeOp) WriteHash(h hash.Hash) {
	fmt.Fprintf(h, "gdist.pipeline.exchange#%d", op.id)
}
func (op *exchangeOp) Hashcode() uint32 {
	h := fnv.New32a()
	op.WriteHash(h)
	return h.Sum32()
}
func (op *exchangeOp) String() string { return fmt.Sprintf("PipelineExchange#%d", op.id) }

// DiffWRT reports the op as not differentiable: gradients do not flow
// through the exchange, it only supplies one.
func (op *exchangeOp) DiffWRT(inputs int) []bool { return make([]bool, inputs) }

func (op *exchangeOp) SymDiff(gorgonia.Nodes, *gorgonia.Node, *gorgonia.Node) (gorgonia.Nodes, error) {
	return nil, fmt.Errorf("%w: the exchange op is not differentiable", ErrStage)
}

// denseData returns the flat data ([]float32 or []float64) of a tensor
// value, materialising views. The slice aliases v unless it was a view.
func denseData(v gorgonia.Value) (any, error) {
	d, ok := v.(*tensor.Dense)
	if !ok {
		return nil, fmt.Errorf("%w: value %T is not a dense tensor", ErrStage, v)
	}
	if d.IsView() {
		d = d.Materialize().(*tensor.Dense)
	}
	switch x := d.Data().(type) {
	case []float32, []float64:
		return x, nil
	}
	return nil, fmt.Errorf("%w: dtype %v (want float32 or float64)", ErrStage, d.Dtype())
}
