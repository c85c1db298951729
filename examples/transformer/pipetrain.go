package main

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/gdist/gdist/internal/chaos"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/ckpt"
	"github.com/gdist/gdist/dist/pipeline"
	"github.com/gdist/gdist/models/transformer"
	"github.com/gdist/gdist/train/checkpoint"
	"github.com/gdist/gdist/train/optim"
)

// trainPipeline trains cfg.Model split into one stage per rank (package
// pipeline, GPipe schedule, cfg.MicroBatches micro-batches per step): rank
// r holds and updates only stage r's layers, with its own Adam. Every
// stage draws the same global batch of cfg.Batch windows from PCG(Seed, 0)
// (the first stage feeds the inputs, the last the targets), so the run
// trains what one process with batch cfg.Batch would, up to rounding. The
// ranks agree every step, through one all-reduce of the loss, on whether to
// stop. There is no validation: no rank holds the whole model.
//
// With cfg.CkptDir each stage saves its own layers, Adam state, step and
// generator state to CkptDir/stage<r> (dist/ckpt WithStage), and all
// stages resume from the newest step every stage has intact.
func trainPipeline(ctx context.Context, pg *dist.ProcessGroup, c *corpus, cfg trainConfig, h trainHooks) (*trainResult, error) {
	rank, world := pg.Rank(), pg.WorldSize()
	cctx := context.WithoutCancel(ctx)
	if world < 2 {
		return nil, fmt.Errorf("transformer: pipeline training needs 2 or more ranks (under gdistrun), not %d", world)
	}
	if cfg.Model.TiedHead {
		return nil, fmt.Errorf("%w: a tied head keeps layer 0 and layer %d in one stage", errSplit, cfg.Model.HeadLayer())
	}
	if cfg.SameData || cfg.Shards > 1 {
		return nil, fmt.Errorf("transformer: SameData and Shards are for data-parallel training")
	}
	stages, err := stageRanges(cfg.Model.NumLayers(), world, nil)
	if err != nil {
		return nil, err
	}
	layers := stages[rank]
	micro := cfg.Batch / cfg.MicroBatches
	build := func(g *gorgonia.ExprGraph) (pipeline.Stage, error) {
		return transformer.NewStage(g, cfg.Model, layers[0], layers[1], micro)
	}
	p, err := pipeline.New(cctx, pg, build, pipeline.WithMicroBatches(cfg.MicroBatches),
		pipeline.WithLoss(transformer.CrossEntropy), pipeline.WithInference(false), pipeline.WithBuildLock(&graphMu))
	if err != nil {
		return nil, err
	}
	defer p.Close()
	st := p.Stage().(*transformer.Stage)
	adam, err := optim.NewAdam(optim.WithLearnRate(cfg.LR), optim.WithClip(1))
	if err != nil {
		return nil, err
	}
	if rank == 0 && h.ready != nil {
		h.ready(cfg.Model.NumParams(), 0)
	}

	pcfg := cfg
	pcfg.SameData = true // every stage draws the global batch
	sampler := newSampler(pcfg, 0)
	rs := &resumable{params: p.Learnables(), adam: adam, sampler: sampler,
		run: runConfig{Format: "gdist.transformer.pipeline", Model: cfg.Model, Batch: cfg.Batch, LR: cfg.LR, Seed: cfg.Seed,
			World: world, Layers: layers, Micro: cfg.MicroBatches}}
	res := &trainResult{}
	var m *ckpt.Manager
	if cfg.CkptDir != "" {
		opts := []ckpt.Option{ckpt.WithStage(rank)}
		if cfg.CkptEvery > 0 {
			opts = append(opts, ckpt.WithEvery(cfg.CkptEvery))
		}
		if m, err = ckpt.New(pg, cfg.CkptDir, opts...); err != nil {
			return nil, err
		}
		defer m.Close()
		start, r, err := rs.resume(cctx, m, st)
		if err != nil {
			return nil, err
		}
		res.Start = int(start)
		if rank == 0 && h.resumed != nil && !r.Fresh() {
			h.resumed(r)
		}
	}

	T := cfg.Model.Ctx
	var in, tgt []int
	fill := func(ids []int) func(mb int, d *tensor.Dense) error {
		return func(mb int, d *tensor.Dense) error {
			return transformer.FillOneHot(d, ids[mb*micro*T:(mb+1)*micro*T])
		}
	}
	begin := time.Now()
	tokensPerStep := float64(cfg.Batch * T)
	kill := chaos.Step(rank)
	saved := -1
	res.Steps = res.Start
	var sinceEval float64
	finished := cfg.Steps > 0 && res.Start >= cfg.Steps
	for step := res.Start + 1; !finished; step++ {
		if in, tgt, err = sampler.sample(c.Train); err != nil {
			return nil, err
		}
		t0 := time.Now()
		loss, err := p.TrainStep(cctx, pipeline.Data{Input: fill(in), Target: fill(tgt)})
		if err != nil {
			return nil, fmt.Errorf("step %d: %w", step, err)
		}
		if err := adam.Step(gorgonia.NodesToValueGrads(p.Learnables())); err != nil {
			return nil, fmt.Errorf("step %d: %w", step, err)
		}
		stop := (cfg.Steps > 0 && step >= cfg.Steps) ||
			(cfg.Duration > 0 && time.Since(begin) >= cfg.Duration) ||
			ctx.Err() != nil
		// One all-reduce per step: the loss (only the last stage's is not
		// 0) and whether any stage wants to stop.
		agree := []float64{loss, 0}
		if stop {
			agree[1] = 1
		}
		if err := pg.AllReduce(cctx, dist.F64(agree), dist.Sum); err != nil {
			return nil, fmt.Errorf("step %d: %w", step, err)
		}
		res.TrainTime += time.Since(t0)
		if math.IsNaN(agree[0]) || math.IsInf(agree[0], 0) {
			return nil, fmt.Errorf("transformer: step %d: loss is %v", step, agree[0])
		}
		res.Losses = append(res.Losses, agree[0])
		res.Steps = step
		sinceEval += agree[0]
		stop = agree[1] > 0
		if m != nil {
			ok, err := m.Step(cctx, int64(step), func() (*checkpoint.State, error) { return rs.state(int64(step)) })
			if err != nil {
				return nil, fmt.Errorf("step %d: %w", step, err)
			}
			if ok {
				saved = step
			}
		}
		if int64(step) == kill {
			chaos.KillSelf()
		}
		if rank == 0 && h.step != nil {
			frac := 0.0
			if cfg.Steps > 0 {
				frac = float64(step) / float64(cfg.Steps)
			}
			if cfg.Duration > 0 {
				frac = max(frac, float64(time.Since(begin))/float64(cfg.Duration))
			}
			h.step(step, agree[0], min(frac, 1), float64(step-res.Start)*tokensPerStep/res.TrainTime.Seconds())
		}
		if stop || step%cfg.EvalEvery == 0 {
			prev := res.Start
			if len(res.Curve) > 0 {
				prev = res.Curve[len(res.Curve)-1].Step
			}
			pt := point{Step: step, Elapsed: time.Since(begin), Train: sinceEval / float64(step-prev), Val: math.NaN()}
			res.Curve = append(res.Curve, pt)
			if rank == 0 && h.eval != nil {
				h.eval(pt)
			}
			sinceEval = 0
		}
		if stop {
			break
		}
	}
	res.Interrupted = ctx.Err() != nil
	res.TokensPerSec = float64(res.Steps-res.Start) * tokensPerStep / res.TrainTime.Seconds()
	if m != nil {
		if err := finalSave(cctx, m, rs, res.Steps, saved); err != nil {
			return nil, err
		}
		res.Ckpt = m.Stats()
	}
	res.Weights = st.Weights()
	if res.Check, err = checksumOf(res.Weights); err != nil {
		return nil, err
	}
	// Every rank learns every stage's hash.
	all := make([]float64, 2*world)
	own := []float64{float64(res.Check.Hash >> 32), float64(res.Check.Hash & 0xFFFFFFFF)}
	if err := pg.AllGather(cctx, dist.F64(all), dist.F64(own)); err != nil {
		return nil, err
	}
	for s := range world {
		res.Stages = append(res.Stages, uint64(all[2*s])<<32|uint64(all[2*s+1]))
	}
	return res, nil
}
