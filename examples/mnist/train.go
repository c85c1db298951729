package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/gdist/gdist/internal/chaos"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/ckpt"
	"github.com/gdist/gdist/dist/ddp"
	"github.com/gdist/gdist/dist/fsdp"
	"github.com/gdist/gdist/internal/mnist"
	"github.com/gdist/gdist/models/mlp"
	mdata "github.com/gdist/gdist/train/data" // the package's tests have a func data
	"github.com/gdist/gdist/train/optim"
)

// sizes are the layer widths of the model: 784-256-128-10.
var sizes = []int{784, 256, 128, mnist.Classes}

// evalBatch is the batch size of the evaluation graph.
const evalBatch = 1000

// errDiverged reports ranks whose parameters differ at the end of training.
var errDiverged = errors.New("mnist: parameters differ between ranks")

// graphMu serialises Gorgonia graph construction, which touches package
// globals: the test runs several ranks in one process.
var graphMu sync.Mutex

// config is what train needs besides the group and the data.
type config struct {
	Epochs    int
	Batch     int // per rank
	LR        float64
	Seed      int64
	Compress  string // "", "f16" or "bf16"
	BucketCap int    // bytes; 0 means ddp's default
	// Shard is how the ranks hold the training state: "" or "none" (DDP),
	// "zero1", "zero2" (ZeRO through package ddp) or "full" (package
	// fsdp, one unit per layer).
	Shard string

	// CkptDir, if set, is where rank 0 saves a checkpoint every CkptEvery
	// steps (0: only at the end) and from which every rank resumes.
	CkptDir   string
	CkptEvery int64
	// CkptFresh starts afresh when CkptDir holds checkpoints but none
	// verifies (they are set aside as *.corrupt); without it that is an
	// error.
	CkptFresh bool

	// Cap the steps per epoch (-max-steps; 0: a full epoch) and, for
	// tests, the number of test images evaluated (0: all).
	MaxSteps  int
	TestLimit int
	// StopAfter > 0 makes train return errStopped right after that step,
	// as a crash would (tests of resuming).
	StopAfter int64
}

// errStopped is what train returns after config.StopAfter steps.
var errStopped = errors.New("mnist: stopped (test)")

// epochStats is one epoch as rank 0 reports it.
type epochStats struct {
	Epoch      int           // from 1
	Steps      int           // optimiser steps in the epoch
	Loss       float64       // mean training loss over the epoch and all ranks
	Acc        float64       // test accuracy, rank 0 only (NaN elsewhere)
	Throughput float64       // training samples/s, all ranks together
	Train      time.Duration // wall time of the epoch's training steps
	Comm       time.Duration // mean all-reduce (reduce-scatter) time per step; -1 when not measured (-shard full)
	Exposed    time.Duration // mean time per step spent waiting for collectives
}

// result is what train returns.
type result struct {
	Epochs    []epochStats
	Losses    []float64    // this rank's loss at every step, in order
	Check     ddp.Checksum // of the float32 parameters, each hashed as its 4 bytes
	Identical bool         // every rank has the same checksum (verified by collectives)
	Ckpt      ckpt.Stats   // rank 0's checkpoint writes (with CkptDir)
	// Sharded counts the sharded checkpoints saved (-shard zero1, zero2,
	// full) and the time they took, every rank writing its part.
	Sharded     int
	ShardedTime time.Duration
}

// hooks are optional callbacks train calls on rank 0 (nil ones are skipped).
type hooks struct {
	// ready is called once the model is built and wrapped, with the number
	// of parameters and of DDP buckets.
	ready func(params, buckets int)
	// start is called before each epoch with its number (from 1), the
	// steps of it done before a resume (0 unless resumed) and its steps.
	start func(epoch, from, steps int)
	// step is called after each step with the step number (from 1) and this
	// rank's loss.
	step func(step int, loss float64)
	// end is called after each epoch, after the evaluation.
	end func(e epochStats)
	// resumed is called when training resumes from a checkpoint, and when
	// it starts afresh over checkpoints that do not verify (CkptFresh).
	resumed func(r *ckpt.Resumed)
	// resumedSharded is resumed for a sharded checkpoint (-shard zero1,
	// zero2 or full).
	resumedSharded func(r *ckpt.ShardedResumed)
	// rescaled is called when the checkpoint resumed from was saved by a
	// job of another world size.
	rescaled func(saved, now int)
}

// trainer holds one rank's model, data-parallel wrapper and machines.
type trainer struct {
	pg     *dist.ProcessGroup
	cfg    config
	m      *mlp.Model
	params gorgonia.Nodes
	w      wrapper  // d or f
	d      *ddp.DDP // DDP or ZeRO, or nil
	f      *fsdp.FSDP
	vm     gorgonia.VM
	adam   *optim.Adam     // the solver, whose state checkpoints save
	solver gorgonia.Solver // adam wrapped by the DDP or FSDP
	// savedWorld is the world size of the job that saved the checkpoint
	// resumed from (0 before a resume).
	savedWorld int
	saves      shardedSaves
	x, y       *gorgonia.Node
	xs, ys     []float32 // back x and y
	loss       gorgonia.Value

	// Evaluation (rank 0).
	em       *mlp.Model
	evm      gorgonia.VM
	ex       *gorgonia.Node
	exs      []float32
	elogits  gorgonia.Value
	eIndices []int
}

// ddpOptions turns the config's DDP settings into options.
func ddpOptions(cfg config) ([]ddp.Option, error) {
	var opts []ddp.Option
	switch cfg.Compress {
	case "", "none":
	case "f16":
		opts = append(opts, ddp.WithCompression(dist.Float16))
	case "bf16":
		opts = append(opts, ddp.WithCompression(dist.BFloat16))
	default:
		return nil, fmt.Errorf("mnist: -compress %q: want f16 or bf16", cfg.Compress)
	}
	if cfg.BucketCap < 0 {
		return nil, fmt.Errorf("mnist: -bucket-cap %d: must not be negative", cfg.BucketCap)
	}
	if cfg.BucketCap > 0 {
		opts = append(opts, ddp.WithBucketCap(cfg.BucketCap), ddp.WithFirstBucketCap(min(cfg.BucketCap, ddp.DefaultFirstBucketCap)))
	}
	return opts, nil
}

// newTrainer builds rank pg.Rank()'s training graph (and, on rank 0, the
// evaluation graph) and wraps the parameters in a DDP, which broadcasts them
// from rank 0.
func newTrainer(ctx context.Context, pg *dist.ProcessGroup, cfg config, test *mnist.Set) (*trainer, error) {
	if cfg.Epochs < 1 || cfg.Batch < 1 || !(cfg.LR > 0) {
		return nil, fmt.Errorf("mnist: need -epochs >= 1, -batch >= 1 and -lr > 0 (got %d, %d, %g)", cfg.Epochs, cfg.Batch, cfg.LR)
	}
	opts, err := ddpOptions(cfg)
	if err != nil {
		return nil, err
	}
	t := &trainer{pg: pg, cfg: cfg}

	graphMu.Lock()
	g := gorgonia.NewGraph()
	t.m, err = mlp.New(g, mlp.Config{Sizes: sizes, Batch: cfg.Batch, Seed: cfg.Seed})
	graphMu.Unlock()
	if err != nil {
		return nil, err
	}
	t.params = t.m.Learnables()
	// Wrap is a collective (it broadcasts rank 0's parameters): not under
	// graphMu, which another in-process rank may need to reach it.
	if err := t.wrap(ctx, opts); err != nil {
		return nil, err
	}

	graphMu.Lock()
	defer graphMu.Unlock()
	t.x, t.y = t.m.NewInputs()
	t.xs = make([]float32, cfg.Batch*sizes[0])
	t.ys = make([]float32, cfg.Batch*mnist.Classes)
	if err := bind(t.x, t.xs); err != nil {
		return nil, err
	}
	if err := bind(t.y, t.ys); err != nil {
		return nil, err
	}
	// Hooks at the point of use, so that bucket all-reduces start during
	// backprop.
	logits, err := t.m.ForwardHooked(t.x, t.w.Hook)
	if err != nil {
		return nil, err
	}
	loss, err := mlp.Loss(logits, t.y)
	if err != nil {
		return nil, err
	}
	gorgonia.Read(loss, &t.loss)
	if _, err := gorgonia.Grad(loss, t.params...); err != nil {
		return nil, fmt.Errorf("mnist: gradients: %w", err)
	}
	// Under ZeRO and full sharding the wrapper hands the solver its own
	// gradient pieces: no dual values, which would hold whole gradients.
	var vmOpts []gorgonia.VMOpt
	if sharding(cfg) == "none" {
		vmOpts = append(vmOpts, gorgonia.BindDualValues(t.params...))
	}
	t.vm = gorgonia.NewTapeMachine(g, vmOpts...)
	// train/optim's Adam steps bit for bit as gorgonia.NewAdamSolver with
	// the same settings, and its state can be saved.
	if t.adam, err = optim.NewAdam(optim.WithLearnRate(cfg.LR)); err != nil {
		t.vm.Close()
		return nil, err
	}
	if t.d != nil {
		t.solver = t.d.Solver(t.adam)
	} else {
		t.solver = t.f.Solver(t.adam)
	}

	if pg.Rank() == 0 {
		if err := t.buildEval(cfg, test); err != nil {
			t.vm.Close()
			return nil, err
		}
	}
	return t, nil
}

// buildEval builds the evaluation graph: the same model with a big batch
// and no gradients. Called with graphMu held.
func (t *trainer) buildEval(cfg config, test *mnist.Set) error {
	n := test.N
	if cfg.TestLimit > 0 {
		n = min(n, cfg.TestLimit)
	}
	b := min(evalBatch, max(n, 1))
	eg := gorgonia.NewGraph()
	em, err := mlp.New(eg, mlp.Config{Sizes: sizes, Batch: b, Seed: cfg.Seed})
	if err != nil {
		return err
	}
	t.em = em
	// Only an input: NewInputs would add a target node the graph never binds.
	t.ex = gorgonia.NewMatrix(eg, tensor.Float32, gorgonia.WithShape(b, sizes[0]), gorgonia.WithName("x"))
	t.exs = make([]float32, b*sizes[0])
	if err := bind(t.ex, t.exs); err != nil {
		return err
	}
	logits, err := em.Forward(t.ex)
	if err != nil {
		return err
	}
	gorgonia.Read(logits, &t.elogits)
	t.evm = gorgonia.NewTapeMachine(eg)
	t.eIndices = make([]int, n)
	for i := range t.eIndices {
		t.eIndices[i] = i
	}
	return nil
}

// bind makes backing the value of the matrix node n.
func bind(n *gorgonia.Node, backing []float32) error {
	return gorgonia.Let(n, tensor.New(tensor.WithShape(n.Shape()...), tensor.WithBacking(backing)))
}

func (t *trainer) close() {
	t.vm.Close()
	if t.evm != nil {
		t.evm.Close()
	}
}

// evaluate copies weights (the training parameters, see trainer.weights)
// into the evaluation model and returns the accuracy on the test set (rank
// 0 only).
func (t *trainer) evaluate(test *mnist.Set, weights []tensor.Tensor) (float64, error) {
	for k, p := range t.em.Learnables() {
		dst, src := p.Value().Data().([]float32), weights[k].Data().([]float32)
		copy(dst, src)
	}
	b := t.ex.Shape()[0]
	ys := make([]float32, b*mnist.Classes) // Batch wants it; the labels come from test.Labels
	correct := 0
	for lo := 0; lo < len(t.eIndices); lo += b {
		idx := t.eIndices[lo:min(lo+b, len(t.eIndices))]
		n := len(idx)
		// A short last batch fills the first n rows; the rest are stale and ignored.
		if err := mnist.Batch(test, idx, t.exs[:n*sizes[0]], ys[:n*mnist.Classes]); err != nil {
			return 0, err
		}
		if err := t.evm.RunAll(); err != nil {
			return 0, fmt.Errorf("mnist: evaluation: %w", err)
		}
		logits := t.elogits.Data().([]float32)
		labels := make([]uint8, n)
		for j, i := range idx {
			labels[j] = test.Labels[i]
		}
		correct += mlp.Correct(logits[:n*mnist.Classes], mnist.Classes, labels)
		t.evm.Reset()
	}
	return float64(correct) / float64(max(len(t.eIndices), 1)), nil
}

// step runs one forward and backward pass on the batch train[idx], averages
// the gradients over the ranks and updates the parameters. It returns this
// rank's loss.
func (t *trainer) step(set *mnist.Set, idx []int) (float64, error) {
	if err := mnist.Batch(set, idx, t.xs, t.ys); err != nil {
		return 0, err
	}
	defer t.vm.Reset()
	if err := t.vm.RunAll(); err != nil {
		if derr := t.w.Err(); derr != nil {
			return 0, derr // matchable; Gorgonia's wrapping is not
		}
		return 0, fmt.Errorf("mnist: forward/backward: %w", err)
	}
	loss := float64(t.loss.Data().(float32))
	if err := t.solver.Step(gorgonia.NodesToValueGrads(t.params)); err != nil {
		return 0, fmt.Errorf("mnist: optimiser step: %w", err)
	}
	if math.IsNaN(loss) || math.IsInf(loss, 0) {
		return 0, fmt.Errorf("mnist: loss is %v", loss)
	}
	return loss, nil
}

// train runs data-parallel training on pg: every rank must call it with the
// same cfg. Each epoch each rank trains on its shard of a fresh permutation
// of trainSet; after it rank 0 evaluates on testSet. At the end every rank
// checks, through collectives, that all ranks hold identical parameters; a
// difference is an error matching errDiverged. h's callbacks run on rank 0.
func train(ctx context.Context, pg *dist.ProcessGroup, trainSet, testSet *mnist.Set, cfg config, h hooks) (*result, error) {
	sampler, err := mdata.New(trainSet.N, pg.Rank(), pg.WorldSize(), mdata.WithSeed(cfg.Seed), mdata.WithDropLast(true))
	if err != nil {
		return nil, err
	}
	t, err := newTrainer(ctx, pg, cfg, testSet)
	if err != nil {
		return nil, err
	}
	defer t.close()

	leader := pg.Rank() == 0
	if leader && h.ready != nil {
		n := 0
		for _, p := range t.params {
			n += p.Shape().TotalSize()
		}
		h.ready(n, t.buckets())
	}
	res := &result{}
	var (
		step    int64   // steps taken, over all epochs
		saved   int64   // the step of the last checkpoint
		lossSum float64 // this rank's loss summed over the epoch's steps so far
		m       *ckpt.Manager
	)
	sharded := cfg.CkptDir != "" && sharding(cfg) != "none"
	if cfg.CkptDir != "" && !sharded {
		// Every rank holds the whole state, and restore carries the
		// sampler's position over to another number of ranks.
		opts := []ckpt.Option{ckpt.WithWorldChange()}
		if cfg.CkptEvery > 0 {
			opts = append(opts, ckpt.WithEvery(cfg.CkptEvery))
		}
		if cfg.CkptFresh {
			opts = append(opts, ckpt.WithStartFreshOverDamaged())
		}
		if m, err = ckpt.New(pg, cfg.CkptDir, opts...); err != nil {
			return nil, err
		}
		defer m.Close()
		r, err := m.Resume(ctx)
		if err != nil {
			return nil, err
		}
		if !r.Fresh() {
			if lossSum, err = t.restore(r, sampler); err != nil {
				return nil, err
			}
			step = r.Step
		}
		if leader && h.resumed != nil && (!r.Fresh() || len(r.Skipped) > 0) {
			h.resumed(r)
		}
		// Every rank must now hold what rank 0 holds: parameters, solver
		// state, step, epoch and sampler position.
		if err := t.verifyState(ctx, m, step, sampler, lossSum); err != nil {
			return nil, err
		}
	}
	if sharded {
		r, sum, err := t.resumeSharded(ctx, sampler)
		if err != nil {
			return nil, err
		}
		if !r.Fresh() {
			step, lossSum = r.Step, sum
			if leader && h.resumedSharded != nil {
				h.resumedSharded(r)
			}
		}
	}
	if leader && h.rescaled != nil && t.savedWorld != 0 && t.savedWorld != pg.WorldSize() {
		h.rescaled(t.savedWorld, pg.WorldSize())
	}
	kill := chaos.Step(pg.Rank())
	first := sampler.Epoch() + 1
	if step == 0 {
		first = 1
	}
	for epoch := first; epoch <= cfg.Epochs; epoch++ {
		sampler.SetEpoch(epoch - 1) // keeps a resumed position in this epoch
		steps := sampler.Len() / cfg.Batch
		if cfg.MaxSteps > 0 {
			steps = min(steps, cfg.MaxSteps)
		}
		if steps == 0 {
			return nil, fmt.Errorf("mnist: %d training images per rank is less than one batch of %d", sampler.Len(), cfg.Batch)
		}
		_, next := sampler.Pos()
		done := next / cfg.Batch // steps of this epoch before a resume
		if leader && h.start != nil {
			h.start(epoch, done, steps)
		}
		var comm, exposed time.Duration
		begin := time.Now()
		for s := done; s < steps; s++ {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			loss, err := t.step(trainSet, sampler.Next(cfg.Batch))
			if err != nil {
				return nil, fmt.Errorf("epoch %d step %d: %w", epoch, s+1, err)
			}
			step++
			c, e := t.commStats()
			comm += c
			exposed += e
			lossSum += loss
			res.Losses = append(res.Losses, loss)
			if leader && h.step != nil {
				h.step(s+1, loss)
			}
			var ok bool
			switch {
			case m != nil:
				ok, err = t.maybeSave(ctx, m, step, epoch, sampler, lossSum)
			case sharded:
				ok, err = t.maybeSaveSharded(ctx, step, epoch, sampler, lossSum)
			}
			if err != nil {
				return nil, err
			}
			if ok {
				saved = step
			}
			if step == kill {
				chaos.KillSelf()
			}
			if step == cfg.StopAfter {
				return nil, errStopped
			}
		}
		elapsed := time.Since(begin)

		// The epoch's mean loss over all ranks (a collective: every rank).
		mean := []float64{lossSum / float64(steps)}
		lossSum = 0
		if err := pg.AllReduce(ctx, dist.F64(mean), dist.Mean); err != nil {
			return nil, fmt.Errorf("epoch %d: averaging the loss: %w", epoch, err)
		}
		es := epochStats{
			Epoch:      epoch,
			Steps:      steps,
			Loss:       mean[0],
			Acc:        math.NaN(),
			Throughput: float64((steps-done)*cfg.Batch*pg.WorldSize()) / elapsed.Seconds(),
			Train:      elapsed,
			Comm:       comm / time.Duration(max(steps-done, 1)),
			Exposed:    exposed / time.Duration(max(steps-done, 1)),
		}
		weights, err := t.weights(ctx) // a collective under full sharding
		if err != nil {
			return nil, err
		}
		if comm < 0 {
			es.Comm = -1
		}
		if leader {
			if es.Acc, err = t.evaluate(testSet, weights); err != nil {
				return nil, err
			}
			if h.end != nil {
				h.end(es)
			}
		}
		res.Epochs = append(res.Epochs, es)
	}

	if m != nil {
		// The final state, positioned after the last epoch, so that running
		// the job again finds it done.
		if sampler.Epoch() < cfg.Epochs {
			sampler.SetEpoch(cfg.Epochs)
			saved = -1
		}
		if saved != step {
			st, err := t.liveState(step, cfg.Epochs, sampler, 0)
			if err != nil {
				return nil, err
			}
			if err := m.Save(ctx, step, st); err != nil {
				return nil, err
			}
		}
		if err := m.Close(); err != nil {
			return nil, err
		}
		res.Ckpt = m.Stats()
	}
	if sharded {
		if sampler.Epoch() < cfg.Epochs {
			sampler.SetEpoch(cfg.Epochs)
			saved = -1
		}
		if saved != step {
			if err := t.saveSharded(ctx, step, cfg.Epochs, sampler, 0); err != nil {
				return nil, err
			}
		}
		res.Sharded, res.ShardedTime = t.saves.n, t.saves.took
	}
	weights, err := t.weights(ctx)
	if err != nil {
		return nil, err
	}
	var acc ddp.Accumulator
	for _, w := range weights {
		acc.Float32s(w.Data().([]float32))
	}
	res.Check = acc.Checksum()
	res.Identical, err = ddp.SameReplicas(ctx, pg, res.Check)
	if err != nil {
		return nil, err
	}
	if !res.Identical {
		return res, fmt.Errorf("%w: rank %d has sum %v, sum of squares %v, hash %016x", errDiverged, pg.Rank(), res.Check.Sum, res.Check.SumSq, res.Check.Hash)
	}
	return res, nil
}
