package pipeline

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
)

// Tags inside a pipeline's range: setup descriptors, a tag no longer used
// (the pipeline's own abort notices, before it failed through dist), call
// headers, then data (3 kinds per micro-batch, virtual stage boundary and
// call, see tag).
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

// Pipeline is one rank's part of a pipeline-parallel model: the graphs of
// its stage (or, from NewInterleaved, of its virtual stages), its
// neighbours, and the schedules that move micro-batches through them.
// Every rank calls the same methods (Infer, TrainStep) in the same order
// with its own Data.
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
	stage   int // this rank's position among the ranks
	nstages int
	ranks   []int
	prev    int // rank of the stage data comes from going forward, -1 if none
	next    int // rank of the stage data goes to going forward, -1 if none
	lay     layout

	chunks []*chunk
	params gorgonia.Nodes // every chunk's learnables, chunk by chunk
	plan   []pass         // this rank's training passes
	order  []pass         // this rank's forward passes for Infer
	pool   *pools

	step  uint64
	stats Stats

	mu     sync.Mutex
	closed bool
	busy   bool
	cause  error
}

// chunk is one of this rank's virtual stages (the only one unless
// NewInterleaved): its graphs and the learnables they share.
type chunk struct {
	k, vs       int  // local index, virtual stage
	first, last bool // virtual stage 0, the last one
	in, out     Desc

	primary Stage
	params  gorgonia.Nodes
	train   []*slot // training slots
	free    []*slot
	infer   *slot
	saved   []any // recompute: each micro-batch's input, between F and B
}

// VirtualBuilder adds a new instance of virtual stage vs to g and returns
// it, as Builder does for New. With p ranks and v chunks each, virtual
// stage vs = k*p + d is chunk k of the rank at position d (WithRanks), so a
// rank builds virtual stages d, d+p, ..., d+(v-1)p, in that order.
type VirtualBuilder func(g *gorgonia.ExprGraph, vs int) (Stage, error)

// New sets up this rank's stage of a pipeline over g: it builds the stage's
// graphs with build (one forward-only graph for Infer, and for training one
// graph per micro-batch a stage may hold at once — see Schedule and
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
	if build == nil {
		return nil, fmt.Errorf("pipeline: %w: nil builder", ErrInvalidArgument)
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if cfg.schedule == Interleaved {
		return nil, fmt.Errorf("pipeline: %w: the Interleaved schedule needs virtual stages: use NewInterleaved", ErrInvalidArgument)
	}
	return newPipeline(ctx, g, 1, func(gr *gorgonia.ExprGraph, _ int) (Stage, error) { return build(gr) }, cfg)
}

// NewInterleaved sets up this rank's v chunks of a pipeline of v*p virtual
// stages over the p ranks of g (or of WithRanks) and trains them with the
// Interleaved schedule (interleaved 1F1B): each rank holds v
// non-neighbouring chunks of the model — with p = 2 and v = 2, rank 0 holds
// virtual stages 0 and 2, rank 1 stages 1 and 3 — so that a micro-batch
// crosses every rank v times and the bubble shrinks v times, for v times
// as many messages. build makes virtual stage vs (see VirtualBuilder); v
// must be at least 2 and the number of micro-batches a multiple of p.
// Everything else is as for New: Infer runs the forward passes in the same
// interleaved order, Learnables lists the chunks' learnables chunk by
// chunk, and the setup checks every pair of neighbouring virtual stages.
func NewInterleaved(ctx context.Context, g *dist.ProcessGroup, v int, build VirtualBuilder, opts ...Option) (*Pipeline, error) {
	if build == nil {
		return nil, fmt.Errorf("pipeline: %w: nil builder", ErrInvalidArgument)
	}
	if v < 2 || v > 64 {
		return nil, fmt.Errorf("pipeline: %w: NewInterleaved with %d chunks per rank: want 2..64 (New runs one)", ErrInvalidArgument, v)
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if cfg.scheduleSet && cfg.schedule != Interleaved {
		return nil, fmt.Errorf("pipeline: %w: NewInterleaved runs the Interleaved schedule, not %v", ErrInvalidArgument, cfg.schedule)
	}
	cfg.schedule = Interleaved
	return newPipeline(ctx, g, v, build, cfg)
}

func newPipeline(ctx context.Context, g *dist.ProcessGroup, v int, build VirtualBuilder, cfg config) (*Pipeline, error) {
	if g == nil {
		return nil, fmt.Errorf("pipeline: %w: nil group", ErrInvalidArgument)
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
	p := &Pipeline{g: g, cfg: cfg, stage: stage, nstages: len(ranks), ranks: ranks, prev: -1, next: -1,
		lay: layout{p: len(ranks), v: v, m: cfg.micro}, pool: newPools()}
	if stage > 0 || v > 1 {
		p.prev = ranks[(stage+len(ranks)-1)%len(ranks)]
	}
	if stage < len(ranks)-1 || v > 1 {
		p.next = ranks[(stage+1)%len(ranks)]
	}
	var err error
	if p.plan, err = plan(cfg.schedule, p.lay, stage); err == nil {
		p.order, err = inferOrder(p.lay, stage)
	}
	if err == nil {
		err = p.build(build)
	}
	if err != nil {
		// Fail the group, so that the other stages' New fails at once,
		// naming this rank, instead of waiting for its descriptor.
		return nil, g.Abort(opSetup, err)
	}
	if err := p.handshake(ctx); err != nil {
		return nil, p.stageErr(err)
	}
	return p, nil
}

// inferOrder returns rank d's forward passes for Infer: micro-batches in
// order with one stage per rank, else the interleaved schedule's forwards.
func inferOrder(l layout, d int) ([]pass, error) {
	if l.v == 1 {
		out := make([]pass, l.m)
		for mb := range out {
			out[mb] = pass{kind: passF, mb: mb}
		}
		return out, nil
	}
	ps, err := planInterleaved(l, d)
	if err != nil {
		return nil, err
	}
	var out []pass
	for _, x := range ps {
		if x.kind == passF || x.kind == passFB {
			out = append(out, pass{kind: passF, chunk: x.chunk, mb: x.mb})
		}
	}
	return out, nil
}

// build makes every chunk's slots and ties their parameters to the
// chunk's primary (its first graph).
func (p *Pipeline) build(build VirtualBuilder) error {
	p.cfg.buildLock.Lock()
	defer p.cfg.buildLock.Unlock()
	split := p.cfg.schedule.split()
	need := slotsNeeded(p.plan, p.lay.v, split, p.cfg.recompute)
	scratch := new(gemmScratch) // the schedule runs one program at a time
	for k := range p.lay.v {
		c := &chunk{k: k, vs: p.lay.vstage(p.stage, k)}
		c.first, c.last = c.vs == 0, c.vs == p.lay.stages()-1
		p.chunks = append(p.chunks, c)
		bk := func(gr *gorgonia.ExprGraph) (Stage, error) { return build(gr, c.vs) }
		kind := slotTrainMid
		if c.last {
			kind = slotTrainLast
		}
		var all []*slot
		if !p.cfg.noTrain && (kind != slotTrainLast || p.cfg.loss != nil) {
			for range need[k] {
				s, err := buildSlot(kind, bk, c.first, p.cfg.loss, p.cfg.target, 1/float64(p.cfg.micro), split)
				if err != nil {
					return err
				}
				s.prog.scratch = scratch
				c.train = append(c.train, s)
				all = append(all, s)
			}
		}
		if !p.cfg.noInfer {
			s, err := buildSlot(slotInfer, bk, c.first, nil, nil, 1, false)
			if err != nil {
				return err
			}
			c.infer = s
			all = append(all, s)
		}
		if len(all) == 0 {
			return fmt.Errorf("pipeline: %w: neither training nor inference graphs", ErrInvalidArgument)
		}
		pr := all[0]
		c.primary, c.params = pr.st, pr.params
		dt, _ := stageDtype(pr.st)
		c.in = Desc{Shape: pr.in.Shape().Clone(), Dtype: dt}
		c.out = Desc{Shape: pr.out.Shape().Clone(), Dtype: pr.out.Dtype()}
		for _, s := range all[1:] {
			if !s.in.Shape().Eq(c.in.Shape) || !s.out.Shape().Eq(c.out.Shape) || len(s.params) != len(c.params) {
				return fmt.Errorf("%w: the builder made stages of different shapes", ErrStage)
			}
			for j, n := range s.params {
				if err := gorgonia.Let(n, c.params[j].Value()); err != nil {
					return fmt.Errorf("%w: parameter %d (%s) differs between builds: %v", ErrStage, j, n.Name(), err)
				}
			}
		}
		if len(c.train) > 0 {
			if err := ensureGrads(c.params); err != nil {
				return err
			}
		}
		c.free = slices.Clone(c.train)
		c.saved = make([]any, p.cfg.micro)
		p.params = append(p.params, c.params...)
	}
	return nil
}

// ensureGrads gives every node of ps a zero gradient: a dual value, which
// solvers read and zero, and into which the pipeline adds each
// micro-batch's gradients. (gorgonia.WithGrad binds one, or zeroes the one
// the node has.)
func ensureGrads(ps gorgonia.Nodes) error {
	for _, n := range ps {
		d, ok := n.Value().(*tensor.Dense)
		if !ok {
			return fmt.Errorf("%w: parameter %s has a %T value, want a dense tensor", ErrStage, n.Name(), n.Value())
		}
		gorgonia.WithGrad(tensor.New(tensor.Of(d.Dtype()), tensor.WithShape(d.Shape().Clone()...)))(n)
	}
	return nil
}

// Stage returns the stage instance whose learnables the pipeline trains
// (the first one the Builder made): load weights into it, checkpoint it.
// Every other graph shares its parameter tensors. With NewInterleaved it
// is the first chunk's; Stages returns every chunk's.
func (p *Pipeline) Stage() Stage { return p.chunks[0].primary }

// Stages returns the stage instance of each of this rank's virtual stages,
// chunk by chunk (one unless NewInterleaved). The caller owns the slice.
func (p *Pipeline) Stages() []Stage {
	out := make([]Stage, len(p.chunks))
	for i, c := range p.chunks {
		out[i] = c.primary
	}
	return out
}

// Learnables returns the learnables of this rank's stage (of every chunk,
// chunk by chunk, with NewInterleaved). After TrainStep their gradients
// (gorgonia's dual values, read by Solver.Step) hold the batch's
// gradients. The caller owns the slice, not the nodes.
func (p *Pipeline) Learnables() gorgonia.Nodes { return slices.Clone(p.params) }

// StageIndex returns this rank's stage, in [0, NumStages).
func (p *Pipeline) StageIndex() int { return p.stage }

// NumStages returns the number of stages (of ranks in the pipeline).
func (p *Pipeline) NumStages() int { return p.nstages }

// VirtualStages returns the number of chunks per rank: 1, or v for
// NewInterleaved.
func (p *Pipeline) VirtualStages() int { return p.lay.v }

// IsFirst reports whether this rank holds the first (virtual) stage, whose
// inputs come from Data.Input.
func (p *Pipeline) IsFirst() bool { return p.chunks[0].first }

// IsLast reports whether this rank holds the last (virtual) stage, which
// computes the loss and hands outputs to Data.Output.
func (p *Pipeline) IsLast() bool { return p.chunks[len(p.chunks)-1].last }

// MicroBatches returns the number of micro-batches per batch.
func (p *Pipeline) MicroBatches() int { return p.cfg.micro }

// Schedule returns the training schedule.
func (p *Pipeline) Schedule() Schedule { return p.cfg.schedule }

// Input describes one micro-batch's input of this stage (of its first
// chunk with NewInterleaved).
func (p *Pipeline) Input() Desc {
	in := p.chunks[0].in
	return Desc{Shape: in.Shape.Clone(), Dtype: in.Dtype}
}

// Output describes one micro-batch's output of this stage (of its last
// chunk with NewInterleaved).
func (p *Pipeline) Output() Desc {
	out := p.chunks[len(p.chunks)-1].out
	return Desc{Shape: out.Shape.Clone(), Dtype: out.Dtype}
}

// Ranks returns the rank of every stage. The caller owns the slice.
func (p *Pipeline) Ranks() []int { return slices.Clone(p.ranks) }

// Close releases the pipeline's graphs. It does not close the group. It is
// idempotent; later calls fail with ErrClosed. It must not run
// concurrently with another call.
func (p *Pipeline) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	return nil
}
