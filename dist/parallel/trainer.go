package parallel

import (
	"context"
	"errors"
	"fmt"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/ddp"
	"github.com/gdist/gdist/dist/pipeline"
	"github.com/gdist/gdist/dist/tp"
	"github.com/gdist/gdist/models/transformer"
	"github.com/gdist/gdist/train/checkpoint"
)

// Trainer trains a transformer (models/transformer) on a Layout: data
// parallelism over the DP groups, a pipeline (dist/pipeline, GPipe) of
// tensor-parallel stages (dist/tp) over the PP groups. It computes what
// transformer.Trainer computes on one process for the same global batch,
// up to rounding: the same losses and, step after step, the same
// parameters. It is not safe for concurrent use; every rank makes the same
// calls.
type Trainer struct {
	groups    *Groups
	cfg       transformer.Config
	batch     int // global
	local     int // sequences per replica
	stage     [2]int
	lo, hi    int // vocabulary part
	micro     int
	solver    gorgonia.Solver
	steps     int
	ownGroups bool

	// Without a pipeline: one graph.
	st           *transformer.Stage
	in, tgt      *gorgonia.Node
	loss         *gorgonia.Node
	vm           gorgonia.VM
	ddp          *ddp.DDP
	lossVal      gorgonia.Value
	pipe         *pipeline.Pipeline
	params       gorgonia.Nodes
	inIDs, tgIDs []int
}

// NewTrainer builds this rank's part of a 3-D parallel trainer of cfg for
// a global batch of batch sequences (a multiple of DP times the
// micro-batches): a collective over pg, which every rank calls with the
// same arguments. It makes the Layout's mesh (see Groups), builds this
// rank's stage, split over its tensor-parallel group, and, with DP > 1,
// data-parallel gradient averaging over its DP group: DDP (dist/ddp)
// hooked into backprop without a pipeline, an all-reduce of the
// accumulated gradients after each pipeline step with one.
func NewTrainer(ctx context.Context, pg *dist.ProcessGroup, cfg transformer.Config, l Layout, batch int, opts ...Option) (*Trainer, error) {
	c, err := setup(pg, cfg, l, opts)
	if err != nil {
		return nil, err
	}
	if batch < 1 || batch%(l.DP*c.micro) != 0 {
		return nil, fmt.Errorf("parallel: batch %d does not split into %d replicas of %d micro-batches: %w", batch, l.DP, c.micro, ErrInvalidArgument)
	}
	gs, err := NewGroups(ctx, pg, l)
	if err != nil {
		return nil, err
	}
	t, err := newTrainer(ctx, gs, cfg, batch, c)
	if err != nil {
		gs.Close()
		return nil, err
	}
	t.ownGroups = true
	return t, nil
}

func newTrainer(ctx context.Context, gs *Groups, cfg transformer.Config, batch int, c config) (*Trainer, error) {
	l := gs.Layout
	t := &Trainer{groups: gs, cfg: cfg, batch: batch, local: batch / l.DP, micro: c.micro,
		stage: l.Stages(cfg.NumLayers())[gs.PP.Rank()]}
	t.lo, t.hi = transformer.VocabPart(cfg, gs.TP.Rank(), l.TP)
	var err error
	if t.solver, err = transformer.NewAdam(c.lr, c.clip); err != nil {
		return nil, err
	}
	var weights []checkpoint.Named
	if c.weights != nil {
		var err error
		if weights, err = stageWeights(c.weights, cfg, t.stage, gs.TP); err != nil {
			return nil, err
		}
	}
	build := func(g *gorgonia.ExprGraph, rows int) (*transformer.Stage, error) {
		var opts []transformer.StageOption
		if l.TP > 1 {
			opts = append(opts, tp.Placement(gs.TP))
		}
		st, err := transformer.NewStage(g, cfg, t.stage[0], t.stage[1], rows, opts...)
		if err != nil {
			return nil, err
		}
		if weights != nil {
			if err := st.SetWeights(weights); err != nil {
				return nil, err
			}
		}
		return st, nil
	}
	if l.PP == 1 {
		return t, t.buildSingle(ctx, c, build)
	}
	return t, t.buildPipeline(ctx, c, build)
}

// stageWeights returns this member's part of the tensors of layers stage
// of the whole-model tensors ts.
func stageWeights(ts []checkpoint.Named, cfg transformer.Config, stage [2]int, g *dist.ProcessGroup) ([]checkpoint.Named, error) {
	var mine []checkpoint.Named
	for _, t := range ts {
		if l, ok := transformer.LayerOf(t.Name); ok && l >= stage[0] && l <= stage[1] {
			mine = append(mine, t)
		}
	}
	return transformer.Shard(mine, g.Rank(), g.WorldSize())
}

// loss is the loss of a last stage: the vocabulary-parallel cross-entropy
// over the tensor-parallel group, or the plain one.
func (t *Trainer) lossFunc() pipeline.LossFunc {
	if t.groups.Layout.TP > 1 {
		return tp.LossFunc(t.groups.TP)
	}
	return transformer.CrossEntropy
}

func (t *Trainer) buildSingle(ctx context.Context, c config, build func(*gorgonia.ExprGraph, int) (*transformer.Stage, error)) error {
	c.lock.Lock()
	g := gorgonia.NewGraph()
	st, err := build(g, t.local)
	c.lock.Unlock()
	if err != nil {
		return err
	}
	t.st = st
	var hook transformer.Hook
	if t.groups.Layout.DP > 1 {
		if t.ddp, err = ddp.Wrap(ctx, t.groups.DP, st.Learnables()); err != nil { // a collective: outside the lock
			return err
		}
		hook = t.ddp.Hook
	}
	c.lock.Lock()
	defer c.lock.Unlock()
	t.in, t.tgt = st.NewInput("input"), st.NewTargets("targets")
	out, err := st.ForwardHooked(t.in, hook)
	if err != nil {
		return err
	}
	if t.loss, err = t.lossFunc()(out, t.tgt); err != nil {
		return err
	}
	if _, err = gorgonia.Grad(t.loss, st.Learnables()...); err != nil {
		return fmt.Errorf("parallel: gradients: %w", err)
	}
	gorgonia.Read(t.loss, &t.lossVal)
	t.params = st.Learnables()
	t.vm = gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(t.params...))
	if t.ddp != nil {
		t.solver = t.ddp.Solver(t.solver)
	}
	return nil
}

func (t *Trainer) buildPipeline(ctx context.Context, c config, build func(*gorgonia.ExprGraph, int) (*transformer.Stage, error)) error {
	rows := t.local / t.micro
	popts := []pipeline.Option{pipeline.WithMicroBatches(t.micro), pipeline.WithInference(false), pipeline.WithBuildLock(c.lock)}
	if t.stage[1] == t.cfg.HeadLayer() {
		popts = append(popts, pipeline.WithLoss(t.lossFunc()), pipeline.WithTargetShape(rows*t.cfg.Ctx, t.hi-t.lo))
	}
	p, err := pipeline.New(ctx, t.groups.PP, func(g *gorgonia.ExprGraph) (pipeline.Stage, error) { return build(g, rows) }, popts...)
	if err != nil {
		return err
	}
	t.pipe = p
	t.params = p.Learnables()
	return nil
}

// Steps returns the number of successful Step calls.
func (t *Trainer) Steps() int { return t.steps }

// Groups returns the trainer's groups.
func (t *Trainer) Groups() *Groups { return t.groups }

// Step runs one training step on the global batch — inputs and targets of
// batch*Ctx token ids each, sequence-major, the same on every rank; replica
// d trains on sequences [d*batch/DP, (d+1)*batch/DP) — and returns the
// loss of the whole batch before the update, on every rank.
func (t *Trainer) Step(ctx context.Context, inputs, targets []int) (float64, error) {
	T := t.cfg.Ctx
	if len(inputs) != t.batch*T || len(targets) != t.batch*T {
		return 0, fmt.Errorf("parallel: step: %d inputs and %d targets for %d sequences of %d: %w", len(inputs), len(targets), t.batch, T, transformer.ErrShape)
	}
	d := t.groups.DP.Rank()
	t.inIDs = inputs[d*t.local*T : (d+1)*t.local*T]
	t.tgIDs = targets[d*t.local*T : (d+1)*t.local*T]
	var loss float64
	var err error
	if t.pipe == nil {
		loss, err = t.stepSingle()
	} else {
		loss, err = t.stepPipeline(ctx)
	}
	if err != nil {
		return 0, err
	}
	// The batch loss: the last stage's, on every stage, averaged over the replicas.
	lv := []float64{loss}
	if t.groups.Layout.PP > 1 {
		if err := t.groups.PP.AllReduce(ctx, dist.F64(lv), dist.Sum); err != nil {
			return 0, err
		}
	}
	if t.groups.Layout.DP > 1 {
		if err := t.groups.DP.AllReduce(ctx, dist.F64(lv), dist.Mean); err != nil {
			return 0, err
		}
	}
	t.steps++
	return lv[0], nil
}

func (t *Trainer) stepSingle() (float64, error) {
	if err := t.fill(t.in.Value().(*tensor.Dense), t.inIDs); err != nil {
		return 0, err
	}
	if err := t.fill(t.tgt.Value().(*tensor.Dense), t.tgIDs); err != nil {
		return 0, err
	}
	defer t.vm.Reset()
	if err := t.vm.RunAll(); err != nil {
		if t.ddp != nil && t.ddp.Err() != nil {
			return 0, t.ddp.Err()
		}
		return 0, fmt.Errorf("parallel: step: %w", err)
	}
	loss, err := scalar(t.lossVal)
	if err != nil {
		return 0, err
	}
	if err := t.solver.Step(gorgonia.NodesToValueGrads(t.params)); err != nil {
		return 0, fmt.Errorf("parallel: solver: %w", err)
	}
	return loss, nil
}

func scalar(v gorgonia.Value) (float64, error) {
	switch x := v.Data().(type) {
	case float64:
		return x, nil
	case float32:
		return float64(x), nil
	}
	return 0, fmt.Errorf("parallel: loss of type %T", v.Data())
}

// fill writes this member's part of the one-hot ids into dst.
func (t *Trainer) fill(dst *tensor.Dense, ids []int) error {
	return transformer.FillOneHotPart(dst, ids, t.lo, t.hi, t.cfg.Vocab)
}

func (t *Trainer) stepPipeline(ctx context.Context) (float64, error) {
	rows := t.local / t.micro * t.cfg.Ctx
	loss, err := t.pipe.TrainStep(ctx, pipeline.Data{
		Input:  func(mb int, in *tensor.Dense) error { return t.fill(in, t.inIDs[mb*rows:(mb+1)*rows]) },
		Target: func(mb int, tg *tensor.Dense) error { return t.fill(tg, t.tgIDs[mb*rows:(mb+1)*rows]) },
	})
	if err != nil {
		return 0, err
	}
	if t.groups.Layout.DP > 1 {
		if err := averageGradients(ctx, t.groups.DP, t.params); err != nil {
			return 0, err
		}
	}
	if err := t.solver.Step(gorgonia.NodesToValueGrads(t.params)); err != nil {
		return 0, fmt.Errorf("parallel: solver: %w", err)
	}
	return loss, nil
}

// averageGradients replaces the gradient of every node with its mean over
// g: one all-reduce of all of them, packed into one buffer (the model has
// one dtype).
func averageGradients(ctx context.Context, g *dist.ProcessGroup, nodes gorgonia.Nodes) error {
	var grads []*tensor.Dense
	n := 0
	for _, p := range nodes {
		gv, err := p.Grad()
		if err != nil {
			return fmt.Errorf("parallel: gradient of %s: %w", p.Name(), err)
		}
		d, ok := gv.(*tensor.Dense)
		if !ok {
			return fmt.Errorf("parallel: gradient of %s is a %T", p.Name(), gv)
		}
		grads = append(grads, d)
		n += d.Shape().TotalSize()
	}
	if len(grads) == 0 {
		return nil
	}
	switch grads[0].Data().(type) {
	case []float64:
		return averageInto[float64](ctx, g, grads, n)
	case []float32:
		return averageInto[float32](ctx, g, grads, n)
	}
	return errors.New("parallel: gradients of an unsupported dtype")
}

func averageInto[T float32 | float64](ctx context.Context, g *dist.ProcessGroup, grads []*tensor.Dense, n int) error {
	buf := make([]T, 0, n)
	for _, d := range grads {
		buf = append(buf, d.Data().([]T)...)
	}
	var b dist.Buffer
	switch v := any(buf).(type) {
	case []float64:
		b = dist.F64(v)
	case []float32:
		b = dist.F32(v)
	}
	if err := g.AllReduce(ctx, b, dist.Mean); err != nil {
		return fmt.Errorf("parallel: averaging gradients: %w", err)
	}
	at := 0
	for _, d := range grads {
		at += copy(d.Data().([]T), buf[at:])
	}
	return nil
}

// Weights returns the whole model's parameters, as the single-process
// model names and shapes them, on every rank: each stage's parts gathered
// over its tensor-parallel group (tp.GatherWeights), then the stages'
// layers over the pipeline. A collective over the job; the tensors are new.
func (t *Trainer) Weights(ctx context.Context) ([]checkpoint.Named, error) {
	var parts []checkpoint.Named
	for _, p := range t.params {
		parts = append(parts, checkpoint.Named{Name: p.Name(), Tensor: p.Value().(*tensor.Dense)})
	}
	return gatherModel(ctx, t.groups, t.cfg, parts)
}

// gatherModel joins every rank's parts into the whole model on every rank.
func gatherModel(ctx context.Context, gs *Groups, cfg transformer.Config, parts []checkpoint.Named) ([]checkpoint.Named, error) {
	whole := parts
	if gs.Layout.TP > 1 {
		var err error
		if whole, err = tp.GatherWeights(ctx, gs.TP, parts); err != nil {
			return nil, err
		}
	}
	if gs.Layout.PP == 1 {
		return cloneAll(whole), nil
	}
	stages := gs.Layout.Stages(cfg.NumLayers())
	counts := make([]int, len(stages))
	for s, r := range stages {
		for _, name := range transformer.ParamNames(cfg, r[0], r[1]) {
			shape, _ := transformer.ParamShape(cfg, name)
			counts[s] += shape.TotalSize()
		}
	}
	total := 0
	for _, c := range counts {
		total += c
	}
	mine := make([]float64, 0, counts[gs.PP.Rank()])
	for _, w := range whole {
		switch d := w.Tensor.(*tensor.Dense).Data().(type) {
		case []float64:
			mine = append(mine, d...)
		case []float32:
			for _, v := range d {
				mine = append(mine, float64(v))
			}
		}
	}
	all := make([]float64, total)
	if err := gs.PP.AllGatherV(ctx, dist.F64(all), dist.F64(mine), counts); err != nil {
		return nil, fmt.Errorf("parallel: gathering the stages: %w", err)
	}
	var out []checkpoint.Named
	at := 0
	for _, name := range transformer.ParamNames(cfg, 0, cfg.HeadLayer()) {
		shape, _ := transformer.ParamShape(cfg, name)
		n := shape.TotalSize()
		var back any = append([]float64(nil), all[at:at+n]...)
		if cfg.Dtype == transformer.Float32 {
			f := make([]float32, n)
			for i, v := range all[at : at+n] {
				f[i] = float32(v)
			}
			back = f
		}
		out = append(out, checkpoint.Named{Name: name, Tensor: tensor.New(tensor.WithShape(shape...), tensor.WithBacking(back))})
		at += n
	}
	return out, nil
}

func cloneAll(ts []checkpoint.Named) []checkpoint.Named {
	out := make([]checkpoint.Named, len(ts))
	for i, t := range ts {
		out[i] = checkpoint.Named{Name: t.Name, Tensor: t.Tensor.(*tensor.Dense).Clone().(*tensor.Dense)}
	}
	return out
}

// Close releases the trainer (and the mesh it made).
func (t *Trainer) Close() error {
	var errs []error
	if t.ddp != nil {
		errs = append(errs, t.ddp.Close())
	}
	if t.vm != nil {
		errs = append(errs, t.vm.Close())
	}
	if t.pipe != nil {
		errs = append(errs, t.pipe.Close())
	}
	if t.ownGroups {
		errs = append(errs, t.groups.Close())
	}
	return errors.Join(errs...)
}
