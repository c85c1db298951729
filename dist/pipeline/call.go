package pipeline

// A call is one Infer or TrainStep: call headers between neighbours, the
// sender, timing, and the inputs and outputs of the micro-batches.

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

// announce sends this call's header to the neighbours it sends data to
// (once to a rank that is both).
func (c *call) announce() error {
	p := c.p
	var hdr [callHeaderLen]byte
	hdr[0] = c.kind
	binary.LittleEndian.PutUint64(hdr[1:], p.step)
	binary.LittleEndian.PutUint32(hdr[9:], uint32(p.stage))
	tag := p.cfg.tagBase + tagCall
	if p.next >= 0 {
		if err := p.g.Send(c.ctx, p.next, tag, hdr[:]); err != nil {
			return err
		}
	}
	if c.kind == callTrain && p.prev >= 0 && p.prev != p.next {
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
	if p.prev == p.next { // one neighbour both ways: one header
		c.heard[1-i] = true
	}
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
	c.snd = startSender(c.ctx, p.g, 2*p.cfg.micro*p.lay.v+2, func(err error) {
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

// abandon returns every slot and saved input after a failure, once the
// sends of their values are done (the sender has flushed by then).
func (p *Pipeline) abandon() {
	for _, ch := range p.chunks {
		for _, s := range ch.train {
			s.waitSent()
			s.mb = -1
		}
		if ch.infer != nil {
			ch.infer.waitSent()
		}
		ch.free = slices.Clone(ch.train)
		for i, b := range ch.saved {
			p.pool.put(b)
			ch.saved[i] = nil
		}
	}
}

// tag returns the tag of micro-batch mb's message of the given kind across
// virtual stage boundary b (between virtual stages b and b+1) in the
// current call.
func (p *Pipeline) tag(kind, mb, b int) uint32 {
	n := ((p.step*uint64(p.cfg.micro)+uint64(mb))*numKinds+uint64(kind))*uint64(p.lay.stages()) + uint64(b)
	return p.cfg.tagBase + tagData + uint32(n%uint64(TagSpan-tagData))
}

// timed runs f and records it as an event of virtual stage ch.
func (p *Pipeline) timed(kind EventKind, ch *chunk, mb int, f func() error) error {
	start := time.Now()
	err := f()
	end := time.Now()
	p.stats.Busy += end.Sub(start)
	p.stats.Events = append(p.stats.Events, Event{Kind: kind, MicroBatch: mb, Stage: ch.vs, Start: start, End: end})
	if tl := p.g.Timeline(); tl != nil {
		name := fmt.Sprintf("%s mb %d", kind.longName(), mb)
		if p.lay.v > 1 {
			name += fmt.Sprintf(" stage %d", ch.vs)
		}
		tl.Add(timeline.Event{Lane: "pipeline compute", Name: name, Cat: "pipeline",
			Start: start, End: end, Args: [4]timeline.Arg{{Key: "micro_batch", Int: int64(mb)}, {Key: "step", Int: int64(p.step)},
				{Key: "stage", Int: int64(ch.vs)}}})
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
	case WeightGrad:
		return "weights"
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
// first virtual stage, from the previous one otherwise.
func (c *call) fillInput(ch *chunk, s *slot, mb, kind int) error {
	p := c.p
	if ch.first {
		if c.d.Input == nil {
			return fmt.Errorf("pipeline: %w: the first stage needs Data.Input", ErrInvalidArgument)
		}
		if err := c.d.Input(mb, s.inVal); err != nil {
			return fmt.Errorf("pipeline: input of micro-batch %d: %w", mb, err)
		}
		return nil
	}
	if err := c.expect(p.prev); err != nil {
		return err
	}
	return recvInto(c.ctx, p.g, p.prev, p.tag(kind, mb, ch.vs-1), flatData(s.inVal))
}

// output hands the last stage's output of micro-batch mb to Data.Output.
func (c *call) output(s *slot, mb int) error {
	if c.d.Output == nil {
		return nil
	}
	v, ok := s.prog.value(s.out).(*tensor.Dense)
	if !ok {
		return fmt.Errorf("%w: output value %T is not a dense tensor", ErrStage, s.prog.value(s.out))
	}
	if err := c.d.Output(mb, v); err != nil {
		return fmt.Errorf("pipeline: output of micro-batch %d: %w", mb, err)
	}
	return nil
}

// sendValue queues node n's value in s's current run for rank `to`,
// without copying it: s does not run again until the send is done.
func (c *call) sendValue(s *slot, n *gorgonia.Node, to int, tag uint32) error {
	d, err := s.valueData(n)
	if err != nil {
		return err
	}
	s.sending++
	c.snd.send(to, tag, d, s.sent)
	return nil
}
