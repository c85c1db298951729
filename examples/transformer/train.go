package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/gdist/gdist/internal/chaos"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/ckpt"
	"github.com/gdist/gdist/dist/ddp"
	"github.com/gdist/gdist/dist/fsdp"
	"github.com/gdist/gdist/models/transformer"
	"github.com/gdist/gdist/train/checkpoint"
	"github.com/gdist/gdist/train/optim"
)

// errDiverged reports ranks whose parameters differ at the end of training.
var errDiverged = errors.New("transformer: parameters differ between ranks")

// trainConfig is what train needs besides the group and the data.
type trainConfig struct {
	Model       transformer.Config
	Batch       int // sequences per rank and step
	LR          float64
	Seed        uint64        // data order; rank r samples with PCG(Seed, r)
	Steps       int           // stop after this many steps (0: no limit)
	Duration    time.Duration // stop after this much time (0: no limit)
	EvalEvery   int           // validate every this many steps (and at the start and the end)
	EvalWindows int           // validation windows of Ctx+1 tokens, spread over the held-out tail

	// BucketCap is the size cap of a DDP gradient bucket in bytes, the
	// first bucket's included (0: package ddp's defaults, 1 MiB then 25
	// MiB, which put this small model in one bucket and so leave nothing
	// to overlap).
	BucketCap int

	// SameData makes every rank sample the batches rank 0 samples (tests:
	// DDP on N ranks then equals one process bit for bit).
	SameData bool
	// Shards > 1 (in a world of one) makes each step's batch the
	// concatenation of what Shards ranks with Batch/Shards sequences each
	// would sample (tests: one process then trains on exactly the global
	// batch of a Shards-rank job).
	Shards int

	// CkptDir, if set, is where training checkpoints are saved every
	// CkptEvery steps (0: only at the end) and resumed from.
	CkptDir   string
	CkptEvery int64

	// Pipeline trains with the model's layers split into one stage per
	// rank (package pipeline) instead of DDP; MicroBatches (>= 1, dividing
	// Batch) is the number of micro-batches per step.
	Pipeline     bool
	MicroBatches int

	// Shard is how the data-parallel ranks hold the training state: "" or
	// "none" (DDP), "zero1", "zero2" (ZeRO through package ddp) or "full"
	// (package fsdp, one unit per layer).
	Shard string
}

func (c trainConfig) validate() error {
	switch {
	case c.Batch < 1:
		return fmt.Errorf("transformer: batch %d < 1", c.Batch)
	case !(c.LR > 0):
		return fmt.Errorf("transformer: learning rate %g must be positive", c.LR)
	case c.Steps < 0 || c.Duration < 0:
		return fmt.Errorf("transformer: negative -steps or -duration")
	case c.Steps == 0 && c.Duration == 0:
		return fmt.Errorf("transformer: set -steps or -duration")
	case c.EvalEvery < 1:
		return fmt.Errorf("transformer: eval interval %d < 1", c.EvalEvery)
	case c.EvalWindows < 1:
		return fmt.Errorf("transformer: %d validation windows < 1", c.EvalWindows)
	case c.BucketCap < 0:
		return fmt.Errorf("transformer: bucket cap %d bytes < 0", c.BucketCap)
	case c.Shards > 1 && c.Batch%c.Shards != 0:
		return fmt.Errorf("transformer: batch %d not divisible into %d shards", c.Batch, c.Shards)
	case c.CkptEvery < 0:
		return fmt.Errorf("transformer: checkpoint interval %d < 0", c.CkptEvery)
	case c.Pipeline && (c.MicroBatches < 1 || c.Batch%c.MicroBatches != 0):
		return fmt.Errorf("transformer: batch %d not divisible into %d micro-batches", c.Batch, c.MicroBatches)
	}
	if err := c.checkShard(); err != nil {
		return err
	}
	return c.Model.Validate()
}

// point is one point of the loss curve.
type point struct {
	Step    int
	Elapsed time.Duration // since training started
	Train   float64       // mean training loss (all ranks) of the steps since the previous point; NaN at step 0
	Val     float64       // validation loss (all ranks' windows)
}

// trainResult is what train returns (the same on every rank).
type trainResult struct {
	Curve        []point
	Losses       []float64 // mean loss over the ranks at every step
	Steps        int
	TrainTime    time.Duration // time in training steps (validation excluded)
	TokensPerSec float64       // tokens trained on per second, all ranks together
	Interrupted  bool          // stopped early because ctx ended (on some rank)
	Start        int           // the step training resumed from (0: a fresh start)
	Weights      []checkpoint.Named
	Check        ddp.Checksum
	// Stages are the fnv64a hashes of every stage's parameters, in stage
	// order (pipeline training only; Check is then this stage's).
	Stages []uint64
	Ckpt   ckpt.Stats // this rank's checkpoint saves (with CkptDir)
	// DDP sums package ddp's statistics over the steps (zero on one rank):
	// Comm - Exposed is the all-reduce time hidden behind backprop.
	DDP ddp.Stats
	// FSDP sums package fsdp's statistics over the steps (-shard full).
	FSDP fsdp.Stats
	// Sharded counts the sharded checkpoints saved (-shard zero1, zero2,
	// full) and the time the ranks spent saving them.
	Sharded     int
	ShardedTime time.Duration
}

// trainHooks are optional callbacks train calls on rank 0.
type trainHooks struct {
	// ready is called once the model is built (and wrapped in a DDP) with
	// its number of parameters and of DDP buckets (0 on one rank).
	ready func(params, buckets int)
	// step is called after every step with the step number, the loss (the
	// mean over ranks), the fraction of the run done and the throughput so
	// far in tokens/s.
	step func(step int, loss, frac, tokPerSec float64)
	// eval is called after every validation.
	eval func(p point)
	// resumed is called when training resumes from a checkpoint.
	resumed func(r *ckpt.Resumed)
	// resumedSharded is resumed for a sharded checkpoint (-shard).
	resumedSharded func(r *ckpt.ShardedResumed)
}

// train trains cfg.Model on c, data-parallel over pg's ranks (DDP) when
// there are several: every rank calls it with the same cfg. Every rank
// samples its own batches (seeded by rank) and DDP averages the gradients,
// so the ranks stay identical; at the end they check that through
// collectives (errDiverged otherwise).
//
// Training stops after cfg.Steps steps or cfg.Duration, or when ctx ends on
// any rank: the ranks agree on the last step through an all-reduce, so that
// they stop together, and train returns the result with Interrupted set
// rather than an error.
func train(ctx context.Context, pg *dist.ProcessGroup, c *corpus, cfg trainConfig, h trainHooks) (*trainResult, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Pipeline {
		return trainPipeline(ctx, pg, c, cfg, h)
	}
	rank, world := pg.Rank(), pg.WorldSize()
	// Collectives and steps run to completion when ctx ends: the ranks
	// first agree to stop. A lost peer still fails them promptly.
	cctx := context.WithoutCancel(ctx)

	if cfg.Shards > 1 && world > 1 {
		return nil, fmt.Errorf("transformer: %d data shards need a world of one, not %d", cfg.Shards, world)
	}
	graphMu.Lock()
	st, err := transformer.NewStage(gorgonia.NewGraph(), cfg.Model, 0, cfg.Model.HeadLayer(), cfg.Batch)
	graphMu.Unlock()
	if err != nil {
		return nil, err
	}
	// train/optim's Adam steps bit for bit as Gorgonia's AdamSolver with
	// the same settings, and its state can be saved.
	adam, err := optim.NewAdam(optim.WithLearnRate(cfg.LR), optim.WithClip(1))
	if err != nil {
		return nil, err
	}
	var solver gorgonia.Solver = adam
	var topts []transformer.TrainerOption
	buckets := 0
	dp := &dataParallel{cfg: cfg}
	if world > 1 || cfg.sharding() != "none" {
		// The wrapper takes the parameters before the forward pass exists,
		// so that the trainer can put its hook at every use of a
		// parameter: DDP's (and ZeRO's) buckets then start their
		// all-reduce (reduce-scatter) as soon as backprop has produced
		// their gradients, and FSDP gathers each layer just before it
		// computes. Wrapping is a collective (it broadcasts rank 0's
		// parameters): not under graphMu, which another in-process rank
		// may need to reach it.
		if err := dp.wrap(cctx, pg, st); err != nil {
			return nil, err
		}
		defer dp.close()
		topts = append(topts, transformer.WithHook(dp.w.Hook), transformer.WithDualValues(dp.d != nil && cfg.sharding() == "none"))
		solver = dp.solver(adam)
		buckets = dp.buckets()
	}
	topts = append(topts, transformer.WithSolver(solver))
	graphMu.Lock()
	tr, err := transformer.NewTrainerFor(st, topts...)
	graphMu.Unlock()
	if err != nil {
		return nil, err
	}
	defer tr.Close()
	ev, err := newEvaluator(cfg.Model, c.Val, cfg.EvalWindows, rank, world)
	if err != nil {
		return nil, err
	}
	defer ev.close()
	if rank == 0 && h.ready != nil {
		h.ready(cfg.Model.NumParams(), buckets)
	}
	weights := func() ([]checkpoint.Named, error) { return dp.weights(cctx, tr) }

	sampler := newSampler(cfg, rank)
	rs := &resumable{params: st.Learnables(), adam: adam, sampler: sampler,
		run: runConfig{Format: "gdist.transformer.train", Model: cfg.Model, Batch: cfg.Batch, LR: cfg.LR, Seed: cfg.Seed,
			World: world, SameData: cfg.SameData, Shards: cfg.Shards, Layers: [2]int{0, cfg.Model.HeadLayer()}}}
	res := &trainResult{}
	var m *ckpt.Manager
	sharded := cfg.CkptDir != "" && cfg.sharding() != "none"
	if sharded {
		start, err := dp.resumeSharded(cctx, rs, h)
		if err != nil {
			return nil, err
		}
		res.Start = int(start)
	}
	if cfg.CkptDir != "" && !sharded {
		// Every rank draws its own batches: WithRankRNG saves every
		// rank's generator state.
		opts := []ckpt.Option{ckpt.WithRankRNG()}
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
	begin := time.Now()
	validate := func(step int, trainLoss float64) error {
		ws, err := weights()
		if err != nil {
			return err
		}
		val, err := ev.loss(cctx, pg, ws)
		if err != nil {
			return err
		}
		p := point{Step: step, Elapsed: time.Since(begin), Train: trainLoss, Val: val}
		res.Curve = append(res.Curve, p)
		if rank == 0 && h.eval != nil {
			h.eval(p)
		}
		return nil
	}
	if err := validate(res.Start, math.NaN()); err != nil {
		return nil, err
	}

	tokensPerStep := float64(cfg.Batch * cfg.Model.Ctx * world)
	var sinceEval float64
	kill := chaos.Step(rank)
	saved := -1
	res.Steps = res.Start
	finished := cfg.Steps > 0 && res.Start >= cfg.Steps // a finished run, resumed
	for step := res.Start + 1; !finished; step++ {
		in, tgt, err := sampler.sample(c.Train)
		if err != nil {
			return nil, err
		}
		t0 := time.Now()
		loss, err := tr.Step(cctx, in, tgt)
		if err != nil {
			if dp.w != nil && dp.w.Err() != nil {
				err = dp.w.Err() // matchable; Gorgonia's wrapping of errors raised in the machine is not
			}
			return nil, fmt.Errorf("step %d: %w", step, err)
		}
		dp.addStats(res)
		if d := dp.d; d != nil {
			ds := d.Stats()
			res.DDP.Passes += ds.Passes
			res.DDP.Buckets += ds.Buckets
			res.DDP.Bytes += ds.Bytes
			res.DDP.Compute += ds.Compute
			res.DDP.Comm += ds.Comm
			res.DDP.Exposed += ds.Exposed
		}
		stop := (cfg.Steps > 0 && step >= cfg.Steps) ||
			(cfg.Duration > 0 && time.Since(begin) >= cfg.Duration) ||
			ctx.Err() != nil
		// One all-reduce per step: the loss for the log and whether any
		// rank wants to stop.
		agree := []float64{loss, 0}
		if stop {
			agree[1] = 1
		}
		if err := pg.AllReduce(cctx, dist.F64(agree), dist.Sum); err != nil {
			return nil, fmt.Errorf("step %d: %w", step, err)
		}
		res.TrainTime += time.Since(t0)
		mean := agree[0] / float64(world)
		if math.IsNaN(mean) || math.IsInf(mean, 0) {
			return nil, fmt.Errorf("transformer: step %d: loss is %v", step, mean)
		}
		res.Losses = append(res.Losses, mean)
		res.Steps = step
		sinceEval += mean
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
		if sharded && cfg.CkptEvery > 0 && int64(step)%cfg.CkptEvery == 0 {
			if err := dp.saveSharded(cctx, rs, int64(step), res); err != nil {
				return nil, fmt.Errorf("step %d: %w", step, err)
			}
			saved = step
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
			h.step(step, mean, min(frac, 1), float64(step-res.Start)*tokensPerStep/res.TrainTime.Seconds())
		}
		if stop || step%cfg.EvalEvery == 0 {
			n := step - res.Curve[len(res.Curve)-1].Step
			if err := validate(step, sinceEval/float64(n)); err != nil {
				return nil, err
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
	if sharded && res.Steps != saved && res.Steps > 0 {
		if err := dp.saveSharded(cctx, rs, int64(res.Steps), res); err != nil {
			return nil, err
		}
	}
	if res.Weights, err = weights(); err != nil {
		return nil, err
	}
	res.Check, err = checksumOf(res.Weights)
	if err != nil {
		return nil, err
	}
	same, err := ddp.SameReplicas(cctx, pg, res.Check)
	if err != nil {
		return nil, err
	}
	if !same {
		return res, fmt.Errorf("%w: rank %d has sum %v, sum of squares %v, hash %016x", errDiverged, rank, res.Check.Sum, res.Check.SumSq, res.Check.Hash)
	}
	return res, nil
}

// evaluator computes the validation loss: the mean next-token
// cross-entropy over fixed windows of the held-out text, shared among the
// ranks.
type evaluator struct {
	cfg     transformer.Config
	val     []int
	offsets []int // this rank's windows
	st      *transformer.Stage
	in      *gorgonia.Node
	logits  *gorgonia.Node
	vm      gorgonia.VM
	ids     []int
}

// evalBatch is the largest batch of the validation graph.
const evalBatch = 16

// newEvaluator spreads windows windows of Ctx+1 tokens evenly over val and
// builds a forward graph for rank's share (windows rank, rank+world, ...).
func newEvaluator(cfg transformer.Config, val []int, windows, rank, world int) (*evaluator, error) {
	T := cfg.Ctx
	if len(val) <= T {
		return nil, fmt.Errorf("transformer: %d validation tokens for windows of %d", len(val), T+1)
	}
	e := &evaluator{cfg: cfg, val: val}
	span := len(val) - T - 1 // last valid offset
	for i := rank; i < windows; i += world {
		off := 0
		if windows > 1 {
			off = i * span / (windows - 1)
		}
		e.offsets = append(e.offsets, off)
	}
	if len(e.offsets) == 0 {
		return e, nil // this rank only takes part in the all-reduce
	}
	batch := min(evalBatch, len(e.offsets))
	graphMu.Lock()
	defer graphMu.Unlock()
	g := gorgonia.NewGraph()
	st, err := transformer.NewStage(g, cfg, 0, cfg.HeadLayer(), batch)
	if err != nil {
		return nil, err
	}
	e.st = st
	e.in = st.NewInput("input")
	if e.logits, err = st.Forward(e.in); err != nil {
		return nil, err
	}
	e.vm = gorgonia.NewTapeMachine(g)
	e.ids = make([]int, batch*T)
	return e, nil
}

// loss returns the validation loss of the model of the given weights, a
// collective: every rank calls it at the same point.
func (e *evaluator) loss(ctx context.Context, pg *dist.ProcessGroup, weights []checkpoint.Named) (float64, error) {
	sums := []float64{0, 0} // cross-entropy summed over positions; positions
	if e.st != nil {
		if err := e.st.SetWeights(weights); err != nil {
			return 0, err
		}
		T, V, B := e.cfg.Ctx, e.cfg.Vocab, e.st.Batch()
		for lo := 0; lo < len(e.offsets); lo += B {
			offs := e.offsets[lo:min(lo+B, len(e.offsets))]
			for b := range B {
				off := offs[min(b, len(offs)-1)] // a short last batch repeats its last window
				copy(e.ids[b*T:(b+1)*T], e.val[off:off+T])
			}
			if err := transformer.FillOneHot(e.in.Value().(*tensor.Dense), e.ids); err != nil {
				return 0, err
			}
			if err := e.vm.RunAll(); err != nil {
				e.vm.Reset()
				return 0, fmt.Errorf("transformer: validation: %w", err)
			}
			logits, err := transformer.Float64s(e.logits)
			e.vm.Reset()
			if err != nil {
				return 0, err
			}
			for b, off := range offs {
				ce, err := transformer.MeanCrossEntropy(logits[b*T*V:(b+1)*T*V], V, e.val[off+1:off+T+1])
				if err != nil {
					return 0, err
				}
				sums[0] += ce * float64(T)
				sums[1] += float64(T)
			}
		}
	}
	if err := pg.AllReduce(ctx, dist.F64(sums), dist.Sum); err != nil {
		return 0, fmt.Errorf("transformer: validation: %w", err)
	}
	return sums[0] / sums[1], nil
}

func (e *evaluator) close() {
	if e.vm != nil {
		e.vm.Close()
	}
}

// checksumOf sums the parameters (in float64) and hashes the float64 bits of
// every element, in order.
func checksumOf(ts []checkpoint.Named) (ddp.Checksum, error) {
	a := ddp.Accumulator{Widen: true}
	for _, t := range ts {
		if err := a.Add(t.Tensor.Data()); err != nil {
			return ddp.Checksum{}, fmt.Errorf("transformer: parameter %s: %w", t.Name, err)
		}
	}
	return a.Checksum(), nil
}
