package pipeline

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"gorgonia.org/gorgonia"

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
		return nil, fmt.Errorf("pipeline: %w: nil group or builder", ErrInvalidArgument)
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
		return nil, fmt.Errorf("pipeline: %w: rank %d is not in the pipeline's ranks %v", ErrInvalidArgument, g.Rank(), ranks)
	}
	for _, r := range ranks {
		if r >= g.WorldSize() {
			return nil, fmt.Errorf("pipeline: %w: rank %d in %v but the world has %d ranks", ErrInvalidArgument, r, ranks, g.WorldSize())
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
		return fmt.Errorf("pipeline: %w: neither training nor inference graphs", ErrInvalidArgument)
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
