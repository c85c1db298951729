package pipeline

import (
	"fmt"
	"slices"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// slotKind says what a slot's graph computes.
type slotKind uint8

const (
	// slotInfer: in -> Forward -> out.
	slotInfer slotKind = iota
	// slotTrainLast: the last virtual stage: in -> Forward -> out ->
	// loss(out, target)/m, gradients of the learnables (and of in unless
	// it is the first virtual stage too).
	slotTrainLast
	// slotTrainMid: any other virtual stage: in -> Forward -> out, and the
	// gradients of the learnables (and of in unless first) with the
	// gradient of out, which the next stage sends, as an input (gOut).
	slotTrainMid
)

// Passes of a slot's program (see compile). A forward-only slot has
// progFwd only; the last stage's has progFB (forward, loss and backward;
// without the weight gradients when split) and progW when split; any
// other has progFwd, progB (the whole backward, or its input-gradient part
// when split) and progW when split.
const (
	progFwd = 0
	progFB  = 0
	progB   = 1
)

// slot is one graph of one of this rank's virtual stages and its compiled
// program: the forward-only graph of Infer, or one micro-batch's worth of
// training graph. A chunk builds one training slot per micro-batch it may
// hold at once (slotsNeeded).
type slot struct {
	kind   slotKind
	g      *gorgonia.ExprGraph
	st     Stage
	params gorgonia.Nodes
	prog   *program
	wPass  int // the pass that computes the weight gradients (progB or progW)

	in    *gorgonia.Node
	inVal *tensor.Dense
	out   *gorgonia.Node

	target    *gorgonia.Node // last stage
	targetVal *tensor.Dense
	loss      *gorgonia.Node // the unscaled loss (last stage)

	gOut    *gorgonia.Node // the gradient of out, from the next stage (mid)
	gOutVal *tensor.Dense

	dIn   *gorgonia.Node // the gradient of in; nil on the first virtual stage
	grads gorgonia.Nodes // the gradient of each of params
	// added[j] is the program index of grads[j] if the program adds it
	// to the parameter's gradient itself (program.accumulateInto), -1 if
	// accumulate adds its value.
	added []int

	// Run state (owned by the scheduler goroutine).
	mb      int           // micro-batch in flight, -1 if free
	sending int           // sends of this slot's values not yet done
	sent    chan struct{} // a token per finished send
}

// buildSlot builds one slot: a new graph, a stage from build, the nodes of
// its kind and its program. target is the shape of the last stage's target
// (nil: the output shape); scale is the factor of its loss (1/m); first
// says whether this is the first virtual stage (no input gradient); split
// whether the weight gradients get a pass of their own.
// Called with the build lock held.
func buildSlot(kind slotKind, build func(*gorgonia.ExprGraph) (Stage, error), first bool, loss LossFunc, target tensor.Shape, scale float64, split bool) (s *slot, err error) {
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
	s = &slot{kind: kind, g: g, st: st, params: st.Learnables(), mb: -1, sent: make(chan struct{}, 4)}
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
	var fwd gorgonia.Nodes // what the first pass computes
	switch kind {
	case slotInfer:
		s.prog, err = compile(g, gorgonia.Nodes{s.out})
		if err != nil {
			return nil, err
		}
		setTraining(s.prog, false)
		return s, nil
	case slotTrainLast:
		if target == nil {
			target = s.out.Shape().Clone()
		}
		s.targetVal = tensor.New(tensor.Of(outDt), tensor.WithShape(target...))
		s.target = gorgonia.NewTensor(g, outDt, len(target), gorgonia.WithShape(target...),
			gorgonia.WithName("pipeline.target"), gorgonia.WithValue(s.targetVal))
		if s.loss, err = loss(s.out, s.target); err != nil {
			return nil, fmt.Errorf("pipeline: loss: %w", err)
		}
		if !s.loss.IsScalar() {
			return nil, fmt.Errorf("%w: loss has shape %v, want a scalar", ErrStage, s.loss.Shape())
		}
		cost := s.loss
		if scale != 1 {
			var c *gorgonia.Node
			if outDt == tensor.Float32 {
				c = gorgonia.NewConstant(float32(scale))
			} else {
				c = gorgonia.NewConstant(scale)
			}
			if cost, err = gorgonia.HadamardProd(s.loss, c); err != nil {
				return nil, fmt.Errorf("pipeline: scaling the loss: %w", err)
			}
		}
		if len(wrt) > 0 {
			if grads, err = gorgonia.Grad(cost, wrt...); err != nil {
				return nil, fmt.Errorf("pipeline: gradients: %w", err)
			}
		}
		fwd = gorgonia.Nodes{s.out, s.loss}
	case slotTrainMid:
		s.gOutVal = tensor.New(tensor.Of(outDt), tensor.WithShape(s.out.Shape().Clone()...))
		s.gOut = gorgonia.NewTensor(g, outDt, s.out.Dims(), gorgonia.WithShape(s.out.Shape().Clone()...),
			gorgonia.WithName("pipeline.grad"), gorgonia.WithValue(s.gOutVal))
		if len(wrt) > 0 {
			if grads, err = gorgonia.Backpropagate(gorgonia.Nodes{s.out}, gorgonia.Nodes{s.gOut}, wrt); err != nil {
				return nil, fmt.Errorf("pipeline: gradients: %w", err)
			}
		}
		fwd = gorgonia.Nodes{s.out}
	}
	s.grads = grads[:len(s.params)]
	var dIn gorgonia.Nodes
	if !first {
		s.dIn = grads[len(grads)-1]
		dIn = gorgonia.Nodes{s.dIn}
	}
	// The passes: forward (with the loss and the input gradient on the
	// last stage), backward, weights.
	var outs []gorgonia.Nodes
	switch {
	case kind == slotTrainLast && split:
		outs = []gorgonia.Nodes{append(fwd, dIn...), s.grads}
		s.wPass = 1
	case kind == slotTrainLast:
		outs = []gorgonia.Nodes{append(append(fwd, dIn...), s.grads...)}
		s.wPass = progFB
	case split:
		outs = []gorgonia.Nodes{fwd, dIn, s.grads}
		s.wPass = 2
	default:
		outs = []gorgonia.Nodes{fwd, append(dIn, s.grads...)}
		s.wPass = progB
	}
	if s.prog, err = compile(g, outs...); err != nil {
		return nil, err
	}
	setTraining(s.prog, true)
	s.added = addedGrads(s.prog, s.grads, s.wPass)
	return s, nil
}

// addedGrads returns, for each of grads, the program index of the node if
// the program can add it to its parameter's gradient itself, or -1: a
// matrix product of the weight-gradient pass that no other node reads.
// Its value is then never kept, and a micro-batch's weight gradients
// cost no write and read of a whole product on top of the sum.
func addedGrads(p *program, grads gorgonia.Nodes, wPass int) []int {
	read := make([]bool, len(p.nodes))
	for _, as := range p.args {
		for _, c := range as {
			read[c] = true
		}
	}
	inPass := make([]bool, len(p.nodes))
	for _, i := range p.passes[wPass] {
		inPass[i] = true
	}
	out := make([]int, len(grads))
	for j, n := range grads {
		out[j] = -1
		if i, ok := p.index[n]; ok && p.isMM[i] && inPass[i] && !read[i] && !slices.Contains(grads[:j], n) {
			out[j] = i
		}
	}
	return out
}

// bindGrads points the program's added weight gradients at the data of
// the learnables' gradients, params (the chunk's primary nodes), which a
// solver may have replaced since the last call.
func (s *slot) bindGrads(params gorgonia.Nodes) error {
	for j, i := range s.added {
		if i < 0 {
			continue
		}
		dst, err := gradData(params[j])
		if err != nil {
			return err
		}
		s.prog.accumulateInto(i, dst)
	}
	return nil
}

// setTraining tells the program's ops that have a training mode (dropout,
// batch normalisation) which mode they run in, as a TapeMachine does.
func setTraining(p *program, on bool) {
	for _, n := range p.nodes {
		if op, ok := n.Op().(gorgonia.TrainModeOp); ok {
			_ = op.SetTraining(on)
		}
	}
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

// start starts a run of the slot's program with pass 0: the argument nodes'
// values are loaded again (a solver may have replaced a parameter tensor).
func (s *slot) start() error {
	s.prog.load()
	return s.prog.run(0)
}

// valueData returns the flat data ([]float32 or []float64) of node n's
// value in the slot's current run.
func (s *slot) valueData(n *gorgonia.Node) (any, error) {
	v := s.prog.value(n)
	if v == nil {
		return nil, fmt.Errorf("%w: node %v has no value", ErrStage, n)
	}
	return denseData(v)
}

// waitSent waits until every send of the slot's values has finished, so
// that the slot may run again.
func (s *slot) waitSent() {
	for ; s.sending > 0; s.sending-- {
		<-s.sent
	}
}
