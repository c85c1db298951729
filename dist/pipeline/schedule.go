package pipeline

import (
	"context"
	"fmt"

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
	for _, ch := range p.chunks {
		if ch.infer == nil {
			return fmt.Errorf("pipeline: %w: pipeline built without inference graphs", ErrInvalidArgument)
		}
	}
	if err := p.syncParams(); err != nil {
		return err
	}
	if err := c.announce(); err != nil {
		return err
	}
	for _, x := range p.order {
		ch := p.chunks[x.chunk]
		s := ch.infer
		s.waitSent()
		if err := c.fillInput(ch, s, x.mb, kindInfer); err != nil {
			return err
		}
		if err := p.timed(ForwardOnly, ch, x.mb, s.start); err != nil {
			return err
		}
		if ch.last {
			if err := c.output(s, x.mb); err != nil {
				return err
			}
			continue
		}
		if err := c.sendValue(s, s.out, p.next, p.tag(kindInfer, x.mb, ch.vs)); err != nil {
			return err
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

func (c *call) train() (float64, error) {
	p := c.p
	for _, ch := range p.chunks {
		if ch.last && p.cfg.loss == nil {
			return 0, ErrNoLoss
		}
		if len(ch.train) == 0 {
			return 0, fmt.Errorf("pipeline: %w: pipeline built without training graphs", ErrInvalidArgument)
		}
	}
	if err := p.syncParams(); err != nil {
		return 0, err
	}
	for _, ch := range p.chunks {
		for _, s := range ch.train {
			if err := s.bindGrads(ch.params); err != nil {
				return 0, err
			}
		}
	}
	if err := c.announce(); err != nil {
		return 0, err
	}
	var loss float64
	for _, x := range p.plan {
		ch := p.chunks[x.chunk]
		var err error
		switch x.kind {
		case passFB:
			var l float64
			l, err = c.forwardBackward(ch, x.mb)
			loss += l
		case passF:
			err = c.forward(ch, x.mb)
		case passB:
			err = c.backward(ch, x.mb)
		case passW:
			err = c.weights(ch, x.mb)
		}
		if err != nil {
			return 0, err
		}
	}
	return loss / float64(p.cfg.micro), nil
}

// acquire takes a free training slot of ch for micro-batch mb, once the
// sends of its last run are done: the slot released last if its sends are
// done, as its tensors are the likeliest to be in the cache (a last stage
// then runs every micro-batch on one graph), else the one released first.
// Every graph computes the same bits.
func (ch *chunk) acquire(mb int) (*slot, error) {
	n := len(ch.free)
	if n == 0 {
		return nil, fmt.Errorf("%w: no free graph for micro-batch %d", ErrStage, mb) // a schedule bug
	}
	var s *slot
	if last := ch.free[n-1]; last.sending == len(last.sent) {
		s = last
		ch.free = ch.free[:n-1]
	} else {
		s = ch.free[0]
		ch.free = append(ch.free[:0], ch.free[1:]...)
	}
	s.waitSent()
	s.mb = mb
	return s, nil
}

func (ch *chunk) release(s *slot) {
	s.mb = -1
	ch.free = append(ch.free, s)
}

// slotOf returns the slot of ch holding micro-batch mb.
func (ch *chunk) slotOf(mb int) (*slot, error) {
	for _, s := range ch.train {
		if s.mb == mb {
			return s, nil
		}
	}
	return nil, fmt.Errorf("%w: micro-batch %d is not in flight on virtual stage %d", ErrStage, mb, ch.vs)
}

// forwardBackward runs micro-batch mb through the last virtual stage:
// forward, loss, backward, and sends the input gradient back. With the
// zero-bubble schedule the weight gradients wait for their own pass.
func (c *call) forwardBackward(ch *chunk, mb int) (float64, error) {
	p := c.p
	s, err := ch.acquire(mb)
	if err != nil {
		return 0, err
	}
	if err := c.fillInput(ch, s, mb, kindFwd); err != nil {
		return 0, err
	}
	if c.d.Target == nil {
		return 0, fmt.Errorf("pipeline: %w: the last stage needs Data.Target", ErrInvalidArgument)
	}
	if err := c.d.Target(mb, s.targetVal); err != nil {
		return 0, fmt.Errorf("pipeline: target of micro-batch %d: %w", mb, err)
	}
	err = p.timed(ForwardBackward, ch, mb, func() error {
		if err := s.start(); err != nil {
			return err
		}
		if s.wPass == progFB {
			return p.accumulate(ch, s)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	loss, err := scalarOf(s.prog.value(s.loss))
	if err != nil {
		return 0, err
	}
	if !ch.first {
		if err := c.sendValue(s, s.dIn, p.prev, p.tag(kindBwd, mb, ch.vs-1)); err != nil {
			return 0, err
		}
	}
	if err := c.output(s, mb); err != nil {
		return 0, err
	}
	if s.wPass == progFB {
		ch.release(s)
	}
	return loss, nil
}

// forward runs micro-batch mb's forward pass on a virtual stage other than
// the last and sends its output on.
func (c *call) forward(ch *chunk, mb int) error {
	p := c.p
	s, err := ch.acquire(mb)
	if err != nil {
		return err
	}
	if err := c.fillInput(ch, s, mb, kindFwd); err != nil {
		return err
	}
	if p.cfg.recompute {
		ch.saved[mb] = p.pool.clone(flatData(s.inVal))
	}
	if err := p.timed(Forward, ch, mb, s.start); err != nil {
		return err
	}
	if err := c.sendValue(s, s.out, p.next, p.tag(kindFwd, mb, ch.vs)); err != nil {
		return err
	}
	if p.cfg.recompute {
		ch.release(s)
	}
	return nil
}

// backward receives micro-batch mb's output gradient and runs its
// backward pass (recomputing its forward first with WithRecompute): the
// input gradient, which it sends back, and, unless the zero-bubble
// schedule gives them their own pass, the weight gradients, which it adds
// to the learnables' gradients.
func (c *call) backward(ch *chunk, mb int) error {
	p := c.p
	var s *slot
	var err error
	if p.cfg.recompute {
		if s, err = ch.acquire(mb); err != nil {
			return err
		}
		if err := copyData(flatData(s.inVal), ch.saved[mb]); err != nil {
			return err
		}
		p.pool.put(ch.saved[mb])
		ch.saved[mb] = nil
		if err := p.timed(Recompute, ch, mb, s.start); err != nil {
			return err
		}
	} else if s, err = ch.slotOf(mb); err != nil {
		return err
	}
	if err := c.expect(p.next); err != nil {
		return err
	}
	if err := recvInto(c.ctx, p.g, p.next, p.tag(kindBwd, mb, ch.vs), flatData(s.gOutVal)); err != nil {
		return err
	}
	err = p.timed(Backward, ch, mb, func() error {
		if err := s.prog.run(progB); err != nil {
			return err
		}
		if s.wPass == progB {
			return p.accumulate(ch, s)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if !ch.first {
		if err := c.sendValue(s, s.dIn, p.prev, p.tag(kindBwd, mb, ch.vs-1)); err != nil {
			return err
		}
	}
	if s.wPass == progB {
		ch.release(s)
	}
	return nil
}

// weights runs micro-batch mb's weight-gradient pass (the zero-bubble
// schedule) and adds them to the learnables' gradients.
func (c *call) weights(ch *chunk, mb int) error {
	p := c.p
	s, err := ch.slotOf(mb)
	if err != nil {
		return err
	}
	err = p.timed(WeightGrad, ch, mb, func() error {
		if err := s.prog.run(s.wPass); err != nil {
			return err
		}
		return p.accumulate(ch, s)
	})
	if err != nil {
		return err
	}
	ch.release(s)
	return nil
}

// accumulate adds the weight gradients s computed to ch's learnables'
// gradients, but for those the weight-gradient pass added itself (see
// addedGrads). Every schedule runs the pass and calls it in micro-batch
// order, so the sums are the same bits whatever the schedule.
func (p *Pipeline) accumulate(ch *chunk, s *slot) error {
	for j, n := range s.grads {
		if s.added[j] >= 0 {
			continue // added by the pass itself
		}
		src, err := s.valueData(n)
		if err != nil {
			return err
		}
		dst, err := gradData(ch.params[j])
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
	for _, ch := range p.chunks {
		for _, s := range append(ch.train[:len(ch.train):len(ch.train)], ch.infer) {
			if s == nil || s.st == ch.primary {
				continue
			}
			for j, n := range s.params {
				pv, sv := ch.params[j].Value(), n.Value()
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
