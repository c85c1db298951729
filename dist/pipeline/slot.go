package pipeline

import (
	"fmt"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// slotKind says what a slot's graph computes.
type slotKind uint8

const (
	// slotInfer: in -> Forward -> out, read out.
	slotInfer slotKind = iota
	// slotTrainLast: the last stage: in -> Forward -> out -> loss(out,
	// target)/m, gradients of the learnables (and of in unless first).
	slotTrainLast
	// slotTrainMid: any other stage: in -> Forward -> out -> exchange(out)
	// = G, gradients of the learnables (and of in unless first) with G as
	// the gradient of out.
	slotTrainMid
)

// slot is one graph of this rank's stage with its machine: the forward-only
// graph of Infer, or one micro-batch's worth of training graph. The
// pipeline builds one training slot per micro-batch it may hold in flight.
type slot struct {
	kind   slotKind
	g      *gorgonia.ExprGraph
	st     Stage
	params gorgonia.Nodes
	vm     gorgonia.VM

	in    *gorgonia.Node
	inVal *tensor.Dense
	out   *gorgonia.Node

	outVal gorgonia.Value // read from out (infer and last); preallocated

	target    *gorgonia.Node // last stage
	targetVal *tensor.Dense
	lossVal   gorgonia.Value // read from the unscaled loss (last stage)

	dInVal gorgonia.Value // read from dLoss/din, unless first; preallocated

	x *exchange // slotTrainMid

	// Run state (owned by the scheduler goroutine).
	mb      int        // micro-batch in flight, -1 if free
	paused  bool       // the tape is paused inside the exchange op
	running bool       // a tape goroutine exists
	done    chan error // the tape goroutine's result, capacity 1
}

// buildSlot builds one slot: a new graph, a stage from build, and the
// nodes of its kind. target is the shape of the last stage's target (nil:
// the output shape); scale is the factor of its loss (1/m).
// Called with the build lock held.
func buildSlot(kind slotKind, build Builder, first bool, loss LossFunc, target tensor.Shape, scale float64, pool *pools) (s *slot, err error) {
	defer func() {
		// Gorgonia panics on some malformed graphs; report them as errors.
		if r := recover(); r != nil {
			s, err = nil, fmt.Errorf("%w: building the stage's graph: %v", ErrStage, r)
		}
	}()
	g := gorgonia.NewGraph()
	st, err := build(g)
	if err != nil {
		return nil, fmt.Errorf("pipeline: building the stage: %w", err)
	}
	if st == nil {
		return nil, fmt.Errorf("%w: builder returned a nil stage", ErrStage)
	}
	dt, err := stageDtype(st)
	if err != nil {
		return nil, err
	}
	inShape := st.InputShape().Clone()
	s = &slot{kind: kind, g: g, st: st, params: st.Learnables(), mb: -1, done: make(chan error, 1)}
	s.inVal = tensor.New(tensor.Of(dt), tensor.WithShape(inShape...))
	s.in = gorgonia.NewTensor(g, dt, len(inShape), gorgonia.WithShape(inShape...),
		gorgonia.WithName("pipeline.in"), gorgonia.WithValue(s.inVal))
	if s.out, err = st.Forward(s.in); err != nil {
		return nil, fmt.Errorf("pipeline: stage forward: %w", err)
	}
	if want := st.OutputShape(); !s.out.Shape().Eq(want) {
		return nil, fmt.Errorf("%w: Forward returned shape %v, OutputShape says %v", ErrStage, s.out.Shape(), want)
	}
	outDt := s.out.Dtype()
	if outDt != tensor.Float32 && outDt != tensor.Float64 {
		return nil, fmt.Errorf("%w: output dtype %v (want float32 or float64)", ErrStage, outDt)
	}

	wrt := s.params
	if !first {
		wrt = append(wrt[:len(wrt):len(wrt)], s.in)
	}
	var grads gorgonia.Nodes
	switch kind {
	case slotInfer:
		s.outVal = tensor.New(tensor.Of(outDt), tensor.WithShape(s.out.Shape().Clone()...))
		gorgonia.Read(s.out, &s.outVal)
	case slotTrainLast:
		if target == nil {
			target = s.out.Shape().Clone()
		}
		s.outVal = tensor.New(tensor.Of(outDt), tensor.WithShape(s.out.Shape().Clone()...))
		gorgonia.Read(s.out, &s.outVal)
		s.targetVal = tensor.New(tensor.Of(outDt), tensor.WithShape(target...))
		s.target = gorgonia.NewTensor(g, outDt, len(target), gorgonia.WithShape(target...),
			gorgonia.WithName("pipeline.target"), gorgonia.WithValue(s.targetVal))
		l, err := loss(s.out, s.target)
		if err != nil {
			return nil, fmt.Errorf("pipeline: loss: %w", err)
		}
		if !l.IsScalar() {
			return nil, fmt.Errorf("%w: loss has shape %v, want a scalar", ErrStage, l.Shape())
		}
		gorgonia.Read(l, &s.lossVal)
		cost := l
		if scale != 1 {
			var c *gorgonia.Node
			if outDt == tensor.Float32 {
				c = gorgonia.NewConstant(float32(scale))
			} else {
				c = gorgonia.NewConstant(scale)
			}
			if cost, err = gorgonia.HadamardProd(l, c); err != nil {
				return nil, fmt.Errorf("pipeline: scaling the loss: %w", err)
			}
		}
		if len(wrt) > 0 {
			if grads, err = gorgonia.Grad(cost, wrt...); err != nil {
				return nil, fmt.Errorf("pipeline: gradients: %w", err)
			}
		}
	case slotTrainMid:
		s.x = &exchange{
			ready:  make(chan any, 1),
			resume: make(chan bool, 1),
			grad:   tensor.New(tensor.Of(outDt), tensor.WithShape(s.out.Shape().Clone()...)),
			pool:   pool,
		}
		gOut, err := gorgonia.ApplyOp(newExchangeOp(s.x, s.out.Shape()), s.out)
		if err != nil {
			return nil, fmt.Errorf("pipeline: exchange op: %w", err)
		}
		if len(wrt) > 0 {
			if grads, err = gorgonia.Backpropagate(gorgonia.Nodes{s.out}, gorgonia.Nodes{gOut}, wrt); err != nil {
				return nil, fmt.Errorf("pipeline: gradients: %w", err)
			}
		}
	}
	if !first && kind != slotInfer {
		s.dInVal = tensor.New(tensor.Of(dt), tensor.WithShape(inShape...))
		gorgonia.Read(grads[len(grads)-1], &s.dInVal)
	}
	var opts []gorgonia.VMOpt
	if kind != slotInfer && len(s.params) > 0 {
		opts = append(opts, gorgonia.BindDualValues(s.params...))
	}
	s.vm = gorgonia.NewTapeMachine(g, opts...)
	return s, nil
}

// stageDtype returns the stage's input dtype: Dtyper's, else that of its
// first learnable.
func stageDtype(st Stage) (tensor.Dtype, error) {
	var dt tensor.Dtype
	if d, ok := st.(Dtyper); ok {
		dt = d.Dtype()
	} else if ps := st.Learnables(); len(ps) > 0 {
		dt = ps[0].Dtype()
	} else {
		return dt, fmt.Errorf("%w: a stage without learnables must implement Dtyper", ErrStage)
	}
	if dt != tensor.Float32 && dt != tensor.Float64 {
		return dt, fmt.Errorf("%w: dtype %v (want float32 or float64)", ErrStage, dt)
	}
	return dt, nil
}

// data returns the flat data of a preallocated tensor value.
func data(v gorgonia.Value) any {
	return v.(*tensor.Dense).Data()
}

// close releases the slot's machine.
func (s *slot) close() {
	if s.vm != nil {
		s.vm.Close()
	}
}
