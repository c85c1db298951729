package pipeline

import (
	"context"
	"fmt"
	"slices"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// Data connects a call to the caller's data. Each stage fills in the
// callbacks it needs and ignores the others: the first stage's Input, the
// last stage's Target (TrainStep) and Output (optional).
//
// The tensors passed to the callbacks belong to the pipeline and are valid
// only during the call; copy out what you keep.
type Data struct {
	// Input fills in, the first stage's input for micro-batch mb (of shape
	// InputShape), for example with a slice of the batch or
	// transformer.FillOneHot.
	Input func(mb int, in *tensor.Dense) error
	// Target fills target, the last stage's loss target for micro-batch mb
	// (TrainStep only).
	Target func(mb int, target *tensor.Dense) error
	// Output, if set, receives the last stage's output for micro-batch mb.
	Output func(mb int, out *tensor.Dense) error
}

// Infer runs one batch through the pipeline, forward only: the first stage
// reads micro-batch mb's input with d.Input, every stage computes its
// layers and sends the result on, and the last stage hands each
// micro-batch's output to d.Output. Stages overlap: while stage s computes
// micro-batch mb, stage s+1 computes mb-1 (outputs are sent from a separate
// goroutine). Every stage must call Infer.
func (p *Pipeline) Infer(ctx context.Context, d Data) error {
	c, err := p.begin(ctx, "infer", d)
	if err != nil {
		return err
	}
	return c.end(c.infer())
}

func (c *call) infer() error {
	p := c.p
	s := p.infer
	if s == nil {
		return fmt.Errorf("pipeline: %w: pipeline built without inference graphs", ErrInvalidArgument)
	}
	if err := p.syncParams(); err != nil {
		return err
	}
	if err := c.announce(); err != nil {
		return err
	}
	for mb := range p.cfg.micro {
		if err := c.fillInput(s, mb, kindInfer); err != nil {
			return err
		}
		if err := p.timed(ForwardOnly, mb, func() error { return runSync(s) }); err != nil {
			return err
		}
		if p.IsLast() {
			if err := c.output(s, mb); err != nil {
				return err
			}
		} else {
			c.snd.send(p.next, p.tag(kindInfer, mb), p.pool.clone(s.outVal.(*tensor.Dense).Data()))
		}
	}
	return nil
}

// TrainStep runs one training step over a batch of MicroBatches()
// micro-batches with the configured schedule and adds the batch's
// gradients to the learnables' gradients (their dual values, as a
// TapeMachine does): the same gradients, up to rounding, that one process
// computes for the whole batch with the mean of the micro-batch losses.
// Then call your solver's Step on Learnables() (which zeroes the
// gradients), or ZeroGrad.
//
// On the last stage it returns the batch loss (the mean of the micro-batch
// losses); other stages return 0. Every stage must call TrainStep.
func (p *Pipeline) TrainStep(ctx context.Context, d Data) (float64, error) {
	c, err := p.begin(ctx, "train", d)
	if err != nil {
		return 0, err
	}
	loss, err := c.train()
	if err = c.end(err); err != nil {
		return 0, err
	}
	return loss, nil
}

// schedOp is a step of a stage's training schedule.
type schedOp struct {
	backward bool
	mb       int
}

// schedule returns this stage's order of forward and backward passes. The
// last stage runs each micro-batch's forward and backward together, so its
// schedule is forwards only.
func (p *Pipeline) schedule() []schedOp {
	m := p.cfg.micro
	ops := make([]schedOp, 0, 2*m)
	if p.IsLast() {
		for mb := range m {
			ops = append(ops, schedOp{mb: mb})
		}
		return ops
	}
	switch p.cfg.schedule {
	case OneFOneB:
		w := min(p.nstages-p.stage-1, m)
		for mb := range w {
			ops = append(ops, schedOp{mb: mb})
		}
		for mb := w; mb < m; mb++ {
			ops = append(ops, schedOp{mb: mb}, schedOp{backward: true, mb: mb - w})
		}
		for mb := m - w; mb < m; mb++ {
			ops = append(ops, schedOp{backward: true, mb: mb})
		}
	default:
		for mb := range m {
			ops = append(ops, schedOp{mb: mb})
		}
		for mb := range m {
			ops = append(ops, schedOp{backward: true, mb: mb})
		}
	}
	return ops
}

func (c *call) train() (float64, error) {
	p := c.p
	if p.IsLast() && p.cfg.loss == nil {
		return 0, ErrNoLoss
	}
	if len(p.train) == 0 {
		return 0, fmt.Errorf("pipeline: %w: pipeline built without training graphs", ErrInvalidArgument)
	}
	if err := p.syncParams(); err != nil {
		return 0, err
	}
	if err := c.announce(); err != nil {
		return 0, err
	}
	var loss float64
	for _, op := range p.schedule() {
		var err error
		switch {
		case p.IsLast():
			var l float64
			l, err = c.forwardBackward(op.mb)
			loss += l
		case op.backward:
			err = c.backward(op.mb)
		default:
			err = c.forward(op.mb)
		}
		if err != nil {
			return 0, err
		}
	}
	return loss / float64(p.cfg.micro), nil
}

// acquire takes a free training slot for micro-batch mb.
func (p *Pipeline) acquire(mb int) (*slot, error) {
	if len(p.free) == 0 {
		return nil, fmt.Errorf("%w: no free graph for micro-batch %d", ErrStage, mb) // a schedule bug
	}
	s := p.free[0]
	p.free = p.free[1:]
	s.mb = mb
	return s, nil
}

func (p *Pipeline) release(s *slot) {
	s.mb = -1
	p.free = append(p.free, s)
}

// slotOf returns the slot holding micro-batch mb.
func (p *Pipeline) slotOf(mb int) (*slot, error) {
	for _, s := range p.train {
		if s.mb == mb {
			return s, nil
		}
	}
	return nil, fmt.Errorf("%w: micro-batch %d is not in flight", ErrStage, mb)
}

// forwardBackward runs micro-batch mb through the last stage: forward,
// loss, backward, and sends the input gradient back.
func (c *call) forwardBackward(mb int) (float64, error) {
	p := c.p
	s := p.train[0]
	if err := c.fillInput(s, mb, kindFwd); err != nil {
		return 0, err
	}
	if c.d.Target == nil {
		return 0, fmt.Errorf("pipeline: %w: the last stage needs Data.Target", ErrInvalidArgument)
	}
	if err := c.d.Target(mb, s.targetVal); err != nil {
		return 0, fmt.Errorf("pipeline: target of micro-batch %d: %w", mb, err)
	}
	if err := p.timed(ForwardBackward, mb, func() error { return runSync(s) }); err != nil {
		return 0, err
	}
	loss, err := scalarOf(s.lossVal)
	if err != nil {
		return 0, err
	}
	if !p.IsFirst() {
		c.snd.send(p.prev, p.tag(kindBwd, mb), p.pool.clone(data(s.dInVal)))
	}
	return loss, c.output(s, mb)
}

// start runs s's tape on a goroutine of its own until it pauses in the
// exchange op, and returns the stage output it hands over (a pooled
// buffer).
func (p *Pipeline) start(s *slot) (any, error) {
	s.running = true
	go func() {
		err := s.vm.RunAll()
		s.vm.Reset()
		s.done <- err
	}()
	select {
	case buf := <-s.x.ready:
		s.paused = true
		return buf, nil
	case err := <-s.done:
		s.running = false
		if err == nil {
			err = fmt.Errorf("%w: the tape ended before the exchange op", ErrStage)
		}
		return nil, fmt.Errorf("pipeline: running the stage: %w", err)
	}
}

// resume lets a paused tape continue: with its gradient (ok) to the end of
// the backward pass, or abandoned.
func (p *Pipeline) resume(s *slot, ok bool) error {
	s.paused = false
	s.x.resume <- ok
	err := <-s.done
	s.running = false
	if !ok {
		return nil // the tape stops with errAbandoned
	}
	if err != nil {
		return fmt.Errorf("pipeline: running the stage: %w", err)
	}
	return nil
}

// forward runs micro-batch mb's forward pass on a stage other than the
// last and sends its output on.
func (c *call) forward(mb int) error {
	p := c.p
	s, err := p.acquire(mb)
	if err != nil {
		return err
	}
	if err := c.fillInput(s, mb, kindFwd); err != nil {
		return err
	}
	if p.cfg.recompute {
		p.saved[mb] = p.pool.clone(s.inVal.Data())
	}
	var out any
	if err := p.timed(Forward, mb, func() (err error) { out, err = p.start(s); return err }); err != nil {
		return err
	}
	c.snd.send(p.next, p.tag(kindFwd, mb), out)
	if p.cfg.recompute {
		if err := p.resume(s, false); err != nil {
			return err
		}
		p.release(s)
	}
	return nil
}

// backward receives micro-batch mb's output gradient, runs its backward
// pass (recomputing its forward first with WithRecompute), merges the
// parameter gradients and sends the input gradient back.
func (c *call) backward(mb int) error {
	p := c.p
	var s *slot
	var err error
	if p.cfg.recompute {
		if s, err = p.acquire(mb); err != nil {
			return err
		}
		if err := copyData(s.inVal.Data(), p.saved[mb]); err != nil {
			return err
		}
		p.pool.put(p.saved[mb])
		p.saved[mb] = nil
		var out any
		if err := p.timed(Recompute, mb, func() (err error) { out, err = p.start(s); return err }); err != nil {
			return err
		}
		p.pool.put(out)
	} else if s, err = p.slotOf(mb); err != nil {
		return err
	}
	if err := c.expect(p.next); err != nil {
		return err
	}
	if err := recvInto(c.ctx, p.g, p.next, p.tag(kindBwd, mb), s.x.grad.Data()); err != nil {
		return err
	}
	err = p.timed(Backward, mb, func() error {
		if err := p.resume(s, true); err != nil {
			return err
		}
		if s != p.train[0] {
			return p.mergeGrads(s)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if !p.IsFirst() {
		c.snd.send(p.prev, p.tag(kindBwd, mb), p.pool.clone(data(s.dInVal)))
	}
	p.release(s)
	return nil
}

// mergeGrads adds s's parameter gradients to the primary's and zeroes
// them, so that the primary accumulates every micro-batch's gradient in
// micro-batch order whatever graph computed it.
func (p *Pipeline) mergeGrads(s *slot) error {
	for j, n := range s.params {
		src, err := gradData(n)
		if err != nil {
			return err
		}
		dst, err := gradData(p.params[j])
		if err != nil {
			return err
		}
		if err := addInto(dst, src); err != nil {
			return err
		}
	}
	return nil
}

// gradData returns the data of n's gradient (its dual value).
func gradData(n *gorgonia.Node) (any, error) {
	g, err := n.Grad()
	if err != nil || g == nil {
		return nil, fmt.Errorf("%w: parameter %s has no gradient", ErrStage, n.Name())
	}
	return denseData(g)
}

// syncParams makes every graph's parameters the primary's tensors again,
// in case a solver replaced a tensor instead of updating it in place.
func (p *Pipeline) syncParams() error {
	for _, s := range append(slices.Clone(p.train), p.infer) {
		if s == nil || s.st == p.primary {
			continue
		}
		for j, n := range s.params {
			pv, sv := p.params[j].Value(), n.Value()
			if pv == sv {
				continue
			}
			pd, err := denseData(pv)
			if err != nil {
				return err
			}
			sd, err := denseData(sv)
			if err != nil {
				return err
			}
			if err := copyData(sd, pd); err != nil {
				return err
			}
		}
	}
	return nil
}

// ZeroGrad zeroes the learnables' gradients (solvers do it in Step).
func (p *Pipeline) ZeroGrad() {
	for _, n := range p.params {
		if d, err := gradData(n); err == nil {
			switch x := d.(type) {
			case []float32:
				clear(x)
			case []float64:
				clear(x)
			}
		}
	}
}

// scalarOf returns a scalar value read from the graph as float64.
func scalarOf(v gorgonia.Value) (float64, error) {
	switch x := v.(type) {
	case *gorgonia.F64:
		return float64(*x), nil
	case *gorgonia.F32:
		return float64(*x), nil
	case tensor.Tensor:
		switch d := x.Data().(type) {
		case float64:
			return d, nil
		case float32:
			return float64(d), nil
		case []float64:
			if len(d) == 1 {
				return d[0], nil
			}
		case []float32:
			if len(d) == 1 {
				return float64(d[0]), nil
			}
		}
	}
	return 0, fmt.Errorf("%w: loss value %T is not a scalar", ErrStage, v)
}
