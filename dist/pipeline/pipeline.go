package pipeline

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
)

// Tags inside a pipeline's range: setup descriptors, a tag no longer used
// (the pipeline's own abort notices, before it failed through dist), call
// headers, then data (3 kinds per micro-batch and call, see tag).
const (
	tagSetup = iota
	_
	tagCall
	tagData
)

// Kinds of data message.
const (
	kindFwd   = iota // training forward activation, stage s -> s+1
	kindBwd          // training gradient, stage s+1 -> s
	kindInfer        // inference activation, stage s -> s+1
	numKinds
)

// Pipeline is one rank's stage of a pipeline-parallel model: the stage's
// graphs, its neighbours, and the schedules that move micro-batches through
// them. Every stage calls the same methods (Infer, TrainStep) in the same
// order with its own Data.
//
// A Pipeline is not safe for concurrent use. A call that fails (a lost
// peer, another stage's failure, a cancelled context, a callback's error)
// breaks it and fails its group (dist's one failure domain, see
// dist.ProcessGroup.Abort): the other stages, and every other user of the
// group, fail promptly with a *dist.PeerError naming the culprit, and
// every later call returns an error wrapping ErrBroken and the first
// failure.
type Pipeline struct {
	g       *dist.ProcessGroup
	cfg     config
	stage   int
	nstages int
	ranks   []int
	prev    int // rank of the previous stage, -1 on the first
	next    int // rank of the next stage, -1 on the last
	in, out Desc

	primary Stage
	params  gorgonia.Nodes
	train   []*slot // training slots; train[0] holds the primary stage
	infer   *slot
	free    []*slot
	saved   []any // recompute: each micro-batch's input, between F and B
	pool    *pools

	step  uint64
	stats Stats

	mu     sync.Mutex
	closed bool
	busy   bool
	cause  error
}

// New sets up this rank's stage of a pipeline over g: it builds the stage's
// graphs with build (one forward-only graph for Infer, and for training one
// graph per micro-batch a stage may hold in flight — see Schedule and
// WithRecompute), then exchanges a descriptor with every other stage so
// that all of them check, before any data moves, that neighbouring stages
// agree on the shape and dtype between them (a *StageMismatchError naming
// both stages otherwise) and on the number of stages, micro-batches and
// schedule (ErrConfigMismatch). Every stage calls New; it returns once all
// descriptors have arrived, or when ctx ends.
//
// By default stage i runs on rank i of g (see WithRanks). The Pipeline uses
// g's point-to-point messages on TagSpan tags from its tag base
// (WithTagBase) and does not own g: Close the Pipeline, then the group.
func New(ctx context.Context, g *dist.ProcessGroup, build Builder, opts ...Option) (*Pipeline, error) {
	if g == nil || build == nil {
		return nil, fmt.Errorf("%w: nil group or builder", ErrInvalidArgument)
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	ranks := cfg.ranks
	if ranks == nil {
		ranks = make([]int, g.WorldSize())
		for i := range ranks {
			ranks[i] = i
		}
	}
	stage := slices.Index(ranks, g.Rank())
	if stage < 0 {
		return nil, fmt.Errorf("%w: rank %d is not in the pipeline's ranks %v", ErrInvalidArgument, g.Rank(), ranks)
	}
	for _, r := range ranks {
		if r >= g.WorldSize() {
			return nil, fmt.Errorf("%w: rank %d in %v but the world has %d ranks", ErrInvalidArgument, r, ranks, g.WorldSize())
		}
	}
	p := &Pipeline{g: g, cfg: cfg, stage: stage, nstages: len(ranks), ranks: ranks, prev: -1, next: -1, pool: newPools()}
	if stage > 0 {
		p.prev = ranks[stage-1]
	}
	if stage < len(ranks)-1 {
		p.next = ranks[stage+1]
	}
	if err := p.build(build); err != nil {
		p.closeSlots()
		// Fail the group, so that the other stages' New fails at once,
		// naming this rank, instead of waiting for its descriptor.
		return nil, g.Abort(opSetup, err)
	}
	if err := p.handshake(ctx); err != nil {
		p.closeSlots()
		return nil, p.stageErr(err)
	}
	return p, nil
}

// nslots returns how many training graphs this stage needs.
func (p *Pipeline) nslots() int {
	m := p.cfg.micro
	switch {
	case p.IsLast() || p.cfg.recompute:
		return 1
	case p.cfg.schedule == OneFOneB:
		return min(m, p.nstages-p.stage)
	}
	return m
}

// build makes the slots and ties their parameters to the primary's.
func (p *Pipeline) build(build Builder) error {
	p.cfg.buildLock.Lock()
	defer p.cfg.buildLock.Unlock()
	first := p.IsFirst()
	kind := slotTrainMid
	if p.IsLast() {
		kind = slotTrainLast
	}
	var all []*slot
	if !p.cfg.noTrain && (kind != slotTrainLast || p.cfg.loss != nil) {
		for range p.nslots() {
			s, err := buildSlot(kind, build, first, p.cfg.loss, p.cfg.target, 1/float64(p.cfg.micro), p.pool)
			if err != nil {
				return err
			}
			p.train = append(p.train, s)
			all = append(all, s)
		}
	}
	if !p.cfg.noInfer {
		s, err := buildSlot(slotInfer, build, first, nil, nil, 1, p.pool)
		if err != nil {
			return err
		}
		p.infer = s
		all = append(all, s)
	}
	if len(all) == 0 {
		return fmt.Errorf("%w: neither training nor inference graphs", ErrInvalidArgument)
	}
	pr := all[0]
	p.primary, p.params = pr.st, pr.params
	dt, _ := stageDtype(pr.st)
	p.in = Desc{Shape: pr.in.Shape().Clone(), Dtype: dt}
	p.out = Desc{Shape: pr.out.Shape().Clone(), Dtype: pr.out.Dtype()}
	for _, s := range all[1:] {
		if !s.in.Shape().Eq(p.in.Shape) || !s.out.Shape().Eq(p.out.Shape) || len(s.params) != len(p.params) {
			return fmt.Errorf("%w: the builder made stages of different shapes", ErrStage)
		}
		for j, n := range s.params {
			if err := gorgonia.Let(n, p.params[j].Value()); err != nil {
				return fmt.Errorf("%w: parameter %d (%s) differs between builds: %v", ErrStage, j, n.Name(), err)
			}
		}
	}
	p.free = slices.Clone(p.train)
	p.saved = make([]any, p.cfg.micro)
	return nil
}

func (p *Pipeline) closeSlots() {
	for _, s := range p.train {
		s.close()
	}
	if p.infer != nil {
		p.infer.close()
	}
}

// Stage returns the stage instance whose learnables the pipeline trains
// (the first one the Builder made): load weights into it, checkpoint it.
// Every other graph shares its parameter tensors.
func (p *Pipeline) Stage() Stage { return p.primary }

// Learnables returns the primary stage's learnables. After TrainStep their
// gradients (gorgonia's dual values, read by Solver.Step) hold the batch's
// gradients. The caller owns the slice, not the nodes.
func (p *Pipeline) Learnables() gorgonia.Nodes { return slices.Clone(p.params) }

// StageIndex returns this rank's stage, in [0, NumStages).
func (p *Pipeline) StageIndex() int { return p.stage }

// NumStages returns the number of stages.
func (p *Pipeline) NumStages() int { return p.nstages }

// IsFirst reports whether this is the first stage, whose inputs come from
// Data.Input.
func (p *Pipeline) IsFirst() bool { return p.stage == 0 }

// IsLast reports whether this is the last stage, which computes the loss
// and hands outputs to Data.Output.
func (p *Pipeline) IsLast() bool { return p.stage == p.nstages-1 }

// MicroBatches returns the number of micro-batches per batch.
func (p *Pipeline) MicroBatches() int { return p.cfg.micro }

// Input describes one micro-batch's input of this stage.
func (p *Pipeline) Input() Desc { return Desc{Shape: p.in.Shape.Clone(), Dtype: p.in.Dtype} }

// Output describes one micro-batch's output of this stage.
func (p *Pipeline) Output() Desc { return Desc{Shape: p.out.Shape.Clone(), Dtype: p.out.Dtype} }

// Ranks returns the rank of every stage. The caller owns the slice.
func (p *Pipeline) Ranks() []int { return slices.Clone(p.ranks) }

// Close stops the pipeline's goroutines and releases its machines. It does
// not close the group. It is idempotent; later calls fail with ErrClosed.
// It must not run concurrently with another call.
func (p *Pipeline) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	p.closeSlots()
	return nil
}

// ---- setup ----

const (
	descMagic   = 0x4c504447 // "GDPL"
	descVersion = 2
)

// descriptor is what each stage tells every other at setup: its settings
// and the tensors it takes and produces. (A stage that fails to set up
// fails the group instead; version 1 could carry that failure as text.)
type descriptor struct {
	stage, nstages int
	micro          int
	schedule       Schedule
	ranks          []int
	in, out        Desc
}

func dtypeCode(dt tensor.Dtype) byte {
	switch dt {
	case tensor.Float32:
		return 1
	case tensor.Float64:
		return 2
	}
	return 0
}

func codeDtype(c byte) (tensor.Dtype, bool) {
	switch c {
	case 1:
		return tensor.Float32, true
	case 2:
		return tensor.Float64, true
	}
	return tensor.Dtype{}, false
}

func (d *descriptor) encode() []byte {
	b := binary.LittleEndian.AppendUint32(nil, descMagic)
	b = binary.LittleEndian.AppendUint16(b, descVersion)
	b = binary.LittleEndian.AppendUint32(b, uint32(d.stage))
	b = binary.LittleEndian.AppendUint32(b, uint32(d.nstages))
	b = binary.LittleEndian.AppendUint32(b, uint32(d.micro))
	b = append(b, byte(d.schedule))
	for _, r := range d.ranks {
		b = binary.LittleEndian.AppendUint32(b, uint32(r))
	}
	for _, x := range []Desc{d.in, d.out} {
		b = append(b, dtypeCode(x.Dtype), byte(len(x.Shape)))
		for _, s := range x.Shape {
			b = binary.LittleEndian.AppendUint64(b, uint64(s))
		}
	}
	return b
}

var errBadDescriptor = errors.New("malformed pipeline descriptor")

func decodeDescriptor(b []byte) (*descriptor, error) {
	r := reader{b: b}
	if r.u32() != descMagic || r.u16() != descVersion {
		return nil, errBadDescriptor
	}
	d := &descriptor{stage: int(r.u32()), nstages: int(r.u32()), micro: int(r.u32()), schedule: Schedule(r.u8())}
	if r.err || d.nstages < 1 || d.nstages > dist.MaxWorldSize {
		return nil, errBadDescriptor
	}
	d.ranks = make([]int, d.nstages)
	for i := range d.ranks {
		d.ranks[i] = int(r.u32())
	}
	for _, x := range []*Desc{&d.in, &d.out} {
		dt, ok := codeDtype(r.u8())
		n := int(r.u8())
		if !ok || n > 16 {
			return nil, errBadDescriptor
		}
		x.Dtype = dt
		x.Shape = make(tensor.Shape, n)
		for i := range x.Shape {
			x.Shape[i] = int(r.u64())
		}
	}
	if r.err || len(r.b) != 0 {
		return nil, errBadDescriptor
	}
	return d, nil
}

// reader decodes little-endian fields, remembering a short read.
type reader struct {
	b   []byte
	err bool
}

func (r *reader) take(n int) []byte {
	if len(r.b) < n {
		r.err = true
		r.b = nil
		return make([]byte, n)
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}
func (r *reader) u8() byte    { return r.take(1)[0] }
func (r *reader) u16() uint16 { return binary.LittleEndian.Uint16(r.take(2)) }
func (r *reader) u32() uint32 { return binary.LittleEndian.Uint32(r.take(4)) }
func (r *reader) u64() uint64 { return binary.LittleEndian.Uint64(r.take(8)) }

// handshake sends this stage's descriptor to every other stage, receives
// theirs and checks them all, in stage order, so that every stage reports
// the same first disagreement.
func (p *Pipeline) handshake(ctx context.Context) error {
	own := &descriptor{stage: p.stage, nstages: p.nstages, micro: p.cfg.micro, schedule: p.cfg.schedule,
		ranks: p.ranks, in: p.in, out: p.out}
	msg := own.encode()
	tag := p.cfg.tagBase + tagSetup
	// A stage that fails to set up fails the group: the sends and receives
	// below then fail with the group's error, naming it.
	var firstErr error
	keep := func(err error) {
		if firstErr == nil {
			firstErr = err
		}
	}
	for _, r := range p.ranks {
		if r == p.g.Rank() {
			continue
		}
		if err := p.g.Send(ctx, r, tag, msg); err != nil {
			keep(fmt.Errorf("pipeline: setup: %w", err))
		}
	}
	descs := make([]*descriptor, p.nstages)
	descs[p.stage] = own
	for i, r := range p.ranks {
		if r == p.g.Rank() {
			continue
		}
		b, err := p.g.Recv(ctx, r, tag)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("pipeline: setup: %w", err)
			}
			keep(fmt.Errorf("pipeline: setup: %w", err))
			continue
		}
		d, err := decodeDescriptor(b)
		switch {
		case err != nil:
			keep(&dist.PeerError{Rank: r, Op: "pipeline setup", Err: fmt.Errorf("%w: %w", dist.ErrProtocol, err)})
		case d.stage != i:
			// The peer thinks it is another stage: its rank list differs.
			keep(fmt.Errorf("%w: rank %d is stage %d here but says it is stage %d (ranks %v vs %v)",
				ErrConfigMismatch, r, i, d.stage, p.ranks, d.ranks))
		default:
			descs[i] = d
		}
	}
	if firstErr != nil {
		return firstErr
	}
	d0 := descs[0]
	for i, d := range descs[1:] {
		i++
		switch {
		case !slices.Equal(d.ranks, d0.ranks):
			return fmt.Errorf("%w: stage 0 (rank %d) has stage ranks %v, stage %d (rank %d) has %v",
				ErrConfigMismatch, p.ranks[0], d0.ranks, i, p.ranks[i], d.ranks)
		case d.micro != d0.micro:
			return fmt.Errorf("%w: stage 0 (rank %d) uses %d micro-batches, stage %d (rank %d) uses %d",
				ErrConfigMismatch, p.ranks[0], d0.micro, i, p.ranks[i], d.micro)
		case d.schedule != d0.schedule:
			return fmt.Errorf("%w: stage 0 (rank %d) uses schedule %v, stage %d (rank %d) uses %v",
				ErrConfigMismatch, p.ranks[0], d0.schedule, i, p.ranks[i], d.schedule)
		}
	}
	for i := range p.nstages - 1 {
		if !descs[i].out.Equal(descs[i+1].in) {
			return &StageMismatchError{Stage: i, Rank: p.ranks[i], NextRank: p.ranks[i+1],
				Output: descs[i].out, Input: descs[i+1].in}
		}
	}
	return nil
}

// ---- failure ----

// Operations under which a pipeline fails its group (dist's Abort); the
// other stages tell from the encoded cause what happened.
const (
	opPipeline     = "pipeline"
	opSetup        = "pipeline setup"
	opCallMismatch = "pipeline call"
)

// fail records the pipeline's first failure: err, which this stage met,
// fails the group (dist's one failure domain: every peer is told, encoded)
// unless the group has failed already, in which case the group's first
// failure wins. It returns the error the call reports.
func (p *Pipeline) fail(err error) error {
	p.mu.Lock()
	if c := p.cause; c != nil {
		p.mu.Unlock()
		return c
	}
	p.mu.Unlock()
	op := opPipeline
	if errors.Is(err, ErrCallMismatch) {
		op = opCallMismatch
	}
	e := p.stageErr(p.g.Abort(op, err))
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cause == nil {
		p.cause = e
	}
	return p.cause
}

// stageErr adds the pipeline's sentinel to the error of a group that
// another rank failed for a reason of its own: ErrCallMismatch if it found
// the stages in different calls, ErrStageFailed for anything else (a
// callback's error, a cancelled context, a timeout, a failed setup). A
// lost, frozen or closed peer, a desync and this stage's own failures are
// reported as they are.
func (p *Pipeline) stageErr(err error) error {
	var (
		a  *dist.AbortError
		pe *dist.PeerError
	)
	if !errors.As(err, &a) || a.Reporter == p.g.Rank() || !errors.As(err, &pe) {
		return err
	}
	var sentinel error
	switch {
	case a.Op == opCallMismatch:
		sentinel = ErrCallMismatch
	case a.Kind == dist.KindUser || a.Kind == dist.KindCancelled || a.Kind == dist.KindTimeout:
		sentinel = ErrStageFailed
	default:
		return err
	}
	return &dist.PeerError{Rank: pe.Rank, Op: opPipeline, Err: &stageError{sentinel: sentinel, err: pe.Err}}
}

// stageError is the Err of a *dist.PeerError reporting another stage's
// failure: it matches the pipeline's sentinel and the group's cause.
type stageError struct {
	sentinel, err error
}

func (e *stageError) Error() string   { return e.sentinel.Error() + ": " + e.err.Error() }
func (e *stageError) Unwrap() []error { return []error{e.sentinel, e.err} }

func (p *Pipeline) causeErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cause
}
