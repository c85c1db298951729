package pipeline

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/timeline"
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

// EventKind says what a stage computed during an Event.
type EventKind uint8

// Kinds of Event.
const (
	// Forward is a training forward pass (up to the output).
	Forward EventKind = iota
	// Backward is a training backward pass; with WithRecompute it is
	// preceded by a Recompute event for the same micro-batch.
	Backward
	// ForwardBackward is the last stage's forward and backward of one
	// micro-batch, run back to back.
	ForwardBackward
	// Recompute is the forward pass a recomputing stage repeats before a
	// backward pass.
	Recompute
	// ForwardOnly is a forward pass of Infer.
	ForwardOnly
)

// String returns "F", "B", "FB", "R" or "I".
func (k EventKind) String() string {
	switch k {
	case Forward:
		return "F"
	case Backward:
		return "B"
	case ForwardBackward:
		return "FB"
	case Recompute:
		return "R"
	case ForwardOnly:
		return "I"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Event is one interval a stage spent computing.
type Event struct {
	Kind       EventKind
	MicroBatch int
	Start, End time.Time
}

// Stats describes the last call (Infer or TrainStep) of a stage: when it
// started and ended, how long the stage computed, and each compute interval.
// Idle time — the stage's share of the pipeline bubble, plus time spent
// waiting for messages — is Wall - Busy.
type Stats struct {
	Start, End time.Time
	Busy       time.Duration
	Events     []Event
}

// Wall returns End - Start.
func (s Stats) Wall() time.Duration { return s.End.Sub(s.Start) }

// IdleFraction returns (Wall - Busy) / Wall, or 0 for an empty call.
func (s Stats) IdleFraction() float64 {
	w := s.Wall()
	if w <= 0 {
		return 0
	}
	return float64(w-s.Busy) / float64(w)
}

// Stats returns the statistics of the last call. The caller owns the
// returned Events.
func (p *Pipeline) Stats() Stats {
	s := p.stats
	s.Events = slices.Clone(s.Events)
	return s
}

// call is the state of one Infer or TrainStep.
type call struct {
	p      *Pipeline
	ctx    context.Context
	cancel context.CancelCauseFunc
	snd    *sender
	d      Data
	kind   byte    // callInfer or callTrain
	heard  [2]bool // the call header from prev, next was checked
}

// Call kinds, in call headers.
const (
	callInfer = 1
	callTrain = 2
)

func callName(kind byte) string {
	switch kind {
	case callInfer:
		return "Infer"
	case callTrain:
		return "TrainStep"
	}
	return fmt.Sprintf("call kind %d", kind)
}

// Call headers. At the start of a call a stage sends a header (its call
// kind, its call number and its stage) to each neighbour it will send data
// to; before its first receive from a neighbour it checks that neighbour's
// header against its own call. Stages in different calls would otherwise
// wait on tags that never come, until their contexts end: with headers the
// first stage to receive finds the mismatch and aborts them all with
// ErrCallMismatch. The header travels ahead of the data it announces, so
// checking it costs no wait of its own.
const callHeaderLen = 1 + 8 + 4

// announce sends this call's header to the neighbours it sends data to.
func (c *call) announce() error {
	p := c.p
	var hdr [callHeaderLen]byte
	hdr[0] = c.kind
	binary.LittleEndian.PutUint64(hdr[1:], p.step)
	binary.LittleEndian.PutUint32(hdr[9:], uint32(p.stage))
	tag := p.cfg.tagBase + tagCall
	if !p.IsLast() {
		if err := p.g.Send(c.ctx, p.next, tag, hdr[:]); err != nil {
			return err
		}
	}
	if c.kind == callTrain && !p.IsFirst() {
		if err := p.g.Send(c.ctx, p.prev, tag, hdr[:]); err != nil {
			return err
		}
	}
	return nil
}

// expect checks, once per call, the header of neighbour `from` (p.prev or
// p.next) before the call's first receive from it.
func (c *call) expect(from int) error {
	p := c.p
	i := 0
	if from == p.next {
		i = 1
	}
	if c.heard[i] {
		return nil
	}
	var b [callHeaderLen]byte
	n, err := p.g.RecvInto(c.ctx, from, p.cfg.tagBase+tagCall, b[:])
	if err != nil && !errors.Is(err, dist.ErrMessageTooLong) {
		return err
	}
	if n != callHeaderLen {
		return &dist.PeerError{Rank: from, Op: "pipeline",
			Err: fmt.Errorf("%w: call header of %d bytes", dist.ErrProtocol, n)}
	}
	kind, step, stage := b[0], binary.LittleEndian.Uint64(b[1:]), int(binary.LittleEndian.Uint32(b[9:]))
	if kind != c.kind || step != p.step {
		return fmt.Errorf("%w: stage %d (rank %d) is in call #%d (%s) but stage %d (rank %d) is in call #%d (%s)",
			ErrCallMismatch, p.stage, p.g.Rank(), p.step, callName(c.kind), stage, from, step, callName(kind))
	}
	c.heard[i] = true
	return nil
}

// begin starts a call: it checks the pipeline's state, derives a context
// that ends with the caller's or when the pipeline fails, and starts the
// sender.
func (p *Pipeline) begin(ctx context.Context, op string, d Data) (*call, error) {
	p.mu.Lock()
	switch {
	case p.closed:
		p.mu.Unlock()
		return nil, fmt.Errorf("pipeline: %s: %w", op, ErrClosed)
	case p.cause != nil:
		c := p.cause
		p.mu.Unlock()
		return nil, fmt.Errorf("pipeline: %s: %w: %w", op, ErrBroken, c)
	case p.busy:
		p.mu.Unlock()
		return nil, fmt.Errorf("pipeline: %s: %w", op, ErrBusy)
	}
	p.busy = true
	p.mu.Unlock()
	c := &call{p: p, d: d, kind: callTrain}
	if op == "infer" {
		c.kind = callInfer
	}
	c.ctx, c.cancel = context.WithCancelCause(ctx)
	// A failure of the group wakes the call's sends and receives (they are
	// the group's point-to-point calls); a failed send stops the call.
	c.snd = startSender(c.ctx, p.g, p.pool, 2*p.cfg.micro+2, func(err error) {
		c.cancel(p.fail(err))
	})
	p.stats.Start, p.stats.Busy, p.stats.Events = time.Now(), 0, p.stats.Events[:0]
	return c, nil
}

// end finishes a call: err is the schedule's error, if any. It flushes the
// sender, abandons slots still in flight, and turns a failure into the
// pipeline's first failure (telling the other stages).
func (c *call) end(err error) error {
	p := c.p
	if err != nil {
		err = p.fail(err)
	}
	if serr := c.snd.finish(); serr != nil && err == nil {
		err = p.fail(serr)
	}
	if err != nil {
		p.abandon()
		// A local error caused by an earlier failure (a receive cancelled
		// because a peer aborted) is reported as that failure.
		if cause := p.causeErr(); cause != nil {
			err = cause
		}
	}
	c.cancel(nil)
	p.stats.End = time.Now()
	p.timelineBubbles()
	p.step++
	p.mu.Lock()
	p.busy = false
	p.mu.Unlock()
	return err
}

// abandon stops every tape paused in its exchange op, waits for it, and
// returns all slots and saved inputs.
func (p *Pipeline) abandon() {
	for _, s := range p.train {
		if s.running {
			if s.paused {
				s.paused = false
				s.x.resume <- false
			}
			<-s.done
			s.running = false
		}
		s.mb = -1
	}
	p.free = slices.Clone(p.train)
	for i, b := range p.saved {
		p.pool.put(b)
		p.saved[i] = nil
	}
}

// tag returns the tag of micro-batch mb's message of the given kind in the
// current call.
func (p *Pipeline) tag(kind, mb int) uint32 {
	n := (p.step*uint64(p.cfg.micro)+uint64(mb))*numKinds + uint64(kind)
	return p.cfg.tagBase + tagData + uint32(n%uint64(TagSpan-tagData))
}

// timed runs f and records it as an event.
func (p *Pipeline) timed(kind EventKind, mb int, f func() error) error {
	start := time.Now()
	err := f()
	end := time.Now()
	p.stats.Busy += end.Sub(start)
	p.stats.Events = append(p.stats.Events, Event{Kind: kind, MicroBatch: mb, Start: start, End: end})
	if tl := p.g.Timeline(); tl != nil {
		tl.Add(timeline.Event{Lane: "pipeline compute", Name: fmt.Sprintf("%s mb %d", kind.longName(), mb), Cat: "pipeline",
			Start: start, End: end, Args: [4]timeline.Arg{{Key: "micro_batch", Int: int64(mb)}, {Key: "step", Int: int64(p.step)}}})
	}
	return err
}

// longName names the kind on the timeline.
func (k EventKind) longName() string {
	switch k {
	case Forward:
		return "forward"
	case Backward:
		return "backward"
	case ForwardBackward:
		return "forward+backward"
	case Recompute:
		return "recompute"
	case ForwardOnly:
		return "infer"
	}
	return k.String()
}

// timelineBubbles puts the call's idle spans (from its start to the first
// pass, between passes, and from the last to its end) on the timeline.
func (p *Pipeline) timelineBubbles() {
	tl := p.g.Timeline()
	if tl == nil {
		return
	}
	at := p.stats.Start
	add := func(end time.Time) {
		if end.Sub(at) > time.Microsecond {
			tl.Add(timeline.Event{Lane: "pipeline compute", Name: "bubble", Cat: "pipeline bubble", Start: at, End: end,
				Args: [4]timeline.Arg{{Key: "step", Int: int64(p.step)}}})
		}
	}
	for _, e := range p.stats.Events {
		add(e.Start)
		if e.End.After(at) {
			at = e.End
		}
	}
	add(p.stats.End)
}

// fillInput gets micro-batch mb's input into s: from Data.Input on the
// first stage, from the previous stage otherwise.
func (c *call) fillInput(s *slot, mb, kind int) error {
	p := c.p
	if p.IsFirst() {
		if c.d.Input == nil {
			return fmt.Errorf("%w: the first stage needs Data.Input", ErrInvalidArgument)
		}
		if err := c.d.Input(mb, s.inVal); err != nil {
			return fmt.Errorf("pipeline: input of micro-batch %d: %w", mb, err)
		}
		return nil
	}
	if err := c.expect(p.prev); err != nil {
		return err
	}
	return recvInto(c.ctx, p.g, p.prev, p.tag(kind, mb), s.inVal.Data())
}

// output hands the last stage's output of micro-batch mb to Data.Output.
func (c *call) output(s *slot, mb int) error {
	if c.d.Output == nil {
		return nil
	}
	if err := c.d.Output(mb, s.outVal.(*tensor.Dense)); err != nil {
		return fmt.Errorf("pipeline: output of micro-batch %d: %w", mb, err)
	}
	return nil
}

// runSync runs s's tape to the end on this goroutine.
func runSync(s *slot) error {
	err := s.vm.RunAll()
	s.vm.Reset()
	if err != nil {
		return fmt.Errorf("pipeline: running the stage: %w", err)
	}
	return nil
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
		return fmt.Errorf("%w: pipeline built without inference graphs", ErrInvalidArgument)
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
		return 0, fmt.Errorf("%w: pipeline built without training graphs", ErrInvalidArgument)
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
		return 0, fmt.Errorf("%w: the last stage needs Data.Target", ErrInvalidArgument)
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
