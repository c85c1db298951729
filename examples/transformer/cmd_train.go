package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/gdist/gdist"
	"github.com/gdist/gdist/dist/ckpt"
	"github.com/gdist/gdist/dist/parallel"
	"github.com/gdist/gdist/internal/cli"
	iprogress "github.com/gdist/gdist/internal/progress"
	"github.com/gdist/gdist/models/transformer"
)

// defaultCkpt is where train saves and generate loads by default (out/ is
// gitignored).
var defaultCkpt = filepath.Join("out", "opticks.gdc")

// runTrain is the train command.
func runTrain(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	fs := flag.NewFlagSet("train", flag.ContinueOnError)
	fs.SetOutput(stderr)
	def := transformer.DefaultConfig(0)
	var cfg trainConfig
	textPath := fs.String("text", "", "training text, UTF-8 (default: $(go env GOROOT)/src/testdata/Isaac.Newton-Opticks.txt)")
	out := fs.String("out", defaultCkpt, "write the model here (rank 0): a gdist checkpoint, or safetensors if the name ends in .safetensors")
	plotPath := fs.String("plot", "", "write a PNG of the loss curves here (rank 0)")
	fs.IntVar(&cfg.Steps, "steps", 0, "stop after this many steps (0: no limit)")
	fs.DurationVar(&cfg.Duration, "duration", 3*time.Minute, "stop after this much time (0: no limit; default 0 when only -steps is given)")
	fs.Float64Var(&cfg.LR, "lr", 3e-3, "Adam learning rate")
	fs.IntVar(&cfg.Batch, "batch", 16, "sequences per step and rank")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the initial weights and of the batches (rank r samples with stream r)")
	fs.IntVar(&cfg.EvalEvery, "eval-every", 100, "validate every this many steps")
	fs.IntVar(&cfg.EvalWindows, "eval-windows", 64, "validation windows (of ctx+1 characters) spread over the held-out tail")
	fs.StringVar(&cfg.CkptDir, "ckpt-dir", "", "save training checkpoints here and resume from the newest good one")
	fs.Int64Var(&cfg.CkptEvery, "ckpt-every", 100, "with -ckpt-dir: save every this many steps (0: only at the end)")
	fs.BoolVar(&cfg.Pipeline, "pipeline", false, "under gdistrun: split the model into one pipeline stage per rank instead of DDP")
	fs.IntVar(&cfg.MicroBatches, "micro-batches", 4, "with -pipeline: micro-batches per step (must divide -batch)")
	var layout parallel.Layout
	fs.IntVar(&layout.DP, "dp", 0, "3-D parallelism: data-parallel replicas (with -pp and -tp; dp*pp*tp = ranks)")
	fs.IntVar(&layout.PP, "pp", 0, "3-D parallelism: pipeline stages per replica")
	fs.IntVar(&layout.TP, "tp", 0, "3-D parallelism: tensor-parallel ranks per stage")
	fs.StringVar(&cfg.Shard, "shard", "none", "under gdistrun: shard the training state over the ranks: none (DDP), zero1 (optimizer state), zero2 (and gradients) or full (and parameters, one unit per layer)")
	bucketKB := fs.Int("bucket-kb", 256, "DDP: gradient bucket size cap in KiB; buckets all-reduce during backprop (0: package ddp's defaults, one bucket for the default model)")
	valFrac := fs.Float64("val-frac", 0.1, "fraction of the text, at its end, held out for validation")
	fs.IntVar(&def.Ctx, "ctx", def.Ctx, "model: context length (characters)")
	fs.IntVar(&def.Dim, "dim", def.Dim, "model: embedding width")
	fs.IntVar(&def.Heads, "heads", def.Heads, "model: attention heads")
	fs.IntVar(&def.Layers, "layers", def.Layers, "model: transformer blocks")
	fs.IntVar(&def.MLPHidden, "mlp", def.MLPHidden, "model: MLP hidden width")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: [gdistrun -n N --] transformer train [flags]

Trains the model on the text; under gdistrun each rank trains on its own
batches and DDP averages the gradients. Rank 0 saves the checkpoint.
With -dp, -pp and -tp (their product the number of ranks) the ranks form
a 3-D mesh: DP replicas of a PP-stage pipeline whose stages are split over
TP tensor-parallel ranks; -batch is then the global batch, and the saved
checkpoint is the single-process model's.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["steps"] && !set["duration"] {
		cfg.Duration = 0
	}
	if cfg.Steps == 0 && cfg.Duration == 0 {
		return usageError(fs, stderr, "-steps and -duration are both 0: training would never stop")
	}
	if *out == "" {
		return usageError(fs, stderr, "-out is empty")
	}
	if *bucketKB < 0 {
		return usageError(fs, stderr, "-bucket-kb %d is negative", *bucketKB)
	}
	cfg.BucketCap = *bucketKB << 10
	threeD := layout != (parallel.Layout{})
	if threeD && cfg.sharding() != "none" {
		return usageError(fs, stderr, "-shard %s shards data-parallel training, not -dp/-pp/-tp", cfg.Shard)
	}
	if threeD {
		layout.DP, layout.PP, layout.TP = max(layout.DP, 1), max(layout.PP, 1), max(layout.TP, 1)
		if !set["micro-batches"] {
			cfg.MicroBatches = 1
			if layout.PP > 1 {
				cfg.MicroBatches = layout.PP
			}
		}
	}
	cli.SetProcs()

	// Read the text before joining the job, so that a missing file fails
	// every rank at once.
	text, path, err := loadText(*textPath)
	if err != nil {
		return err
	}
	c, err := newCorpus(text, *valFrac, def.Ctx)
	if err != nil {
		return err
	}
	model := def
	model.Vocab = c.Vocab.Size()
	model.Seed = cfg.Seed
	cfg.Model = model
	if err := cfg.validate(); err != nil {
		return usageError(fs, stderr, "%v", err)
	}

	pg, err := gdist.InitFromEnv(ctx)
	if err != nil {
		return err
	}
	defer cli.Close(&err, pg)
	leader := pg.Rank() == 0
	w := io.Discard
	if leader {
		w = stdout
	}

	if threeD {
		fmt.Fprintf(w, "train: %d rank(s) as %v, GOMAXPROCS %d each; model ctx %d, dim %d, %d heads, %d layers, mlp %d, %v: %d parameters; global batch %d in %d micro-batch(es) per replica\n",
			pg.WorldSize(), layout, runtime.GOMAXPROCS(0), model.Ctx, model.Dim, model.Heads, model.Layers, model.MLPHidden, model.Dtype,
			model.NumParams(), cfg.Batch, cfg.MicroBatches)
		weights, steps, elapsed, err := train3D(ctx, pg, c, cfg, layout, w, cfg.EvalEvery)
		if err != nil {
			return err
		}
		if !leader {
			return nil
		}
		fmt.Fprintf(w, "train: %d steps in %.1fs, %.0f tokens/s\n", steps, elapsed.Seconds(), float64(steps*cfg.Batch*model.Ctx)/elapsed.Seconds())
		if err := saveModel(*out, &transformer.Checkpoint{Config: model, Vocab: c.Vocab, Step: int64(steps), Tensors: weights}); err != nil {
			return err
		}
		fmt.Fprintf(w, "train: saved %s (the single-process model, gathered from every rank)\n", *out)
		return nil
	}

	bar := newProgress(w, stderr, iprogress.IsTerminal(stderr))
	h := trainHooks{
		ready: func(params, buckets int) {
			fmt.Fprintf(w, "train: %d rank(s), GOMAXPROCS %d each; %s: %d characters, vocabulary %d, %d training and %d validation tokens\n",
				pg.WorldSize(), runtime.GOMAXPROCS(0), path, len([]rune(text)), model.Vocab, len(c.Train), len(c.Val))
			ddpNote, global := "", cfg.Batch*pg.WorldSize()
			switch {
			case cfg.Pipeline:
				ddpNote, global = fmt.Sprintf(", a pipeline of %d stages with %d micro-batches", pg.WorldSize(), cfg.MicroBatches), cfg.Batch
			case cfg.sharding() == "full":
				ddpNote = fmt.Sprintf(", fully sharded in %d unit(s)", buckets)
			case cfg.sharding() != "none":
				ddpNote = fmt.Sprintf(", %s in %d bucket(s)", map[string]string{"zero1": "ZeRO-1", "zero2": "ZeRO-2"}[cfg.sharding()], buckets)
			case buckets > 0:
				ddpNote = fmt.Sprintf(", DDP in %d bucket(s)", buckets)
			}
			fmt.Fprintf(w, "train: model ctx %d, dim %d, %d heads, %d layers, mlp %d, %v: %d parameters%s; batch %d per rank (%d global); Adam lr %g; %s\n",
				model.Ctx, model.Dim, model.Heads, model.Layers, model.MLPHidden, model.Dtype, params, ddpNote,
				cfg.Batch, global, cfg.LR, stopRule(cfg))
		},
		step: bar.step,
		eval: bar.eval,
		resumedSharded: func(r *ckpt.ShardedResumed) {
			note := ""
			if r.World != pg.WorldSize() {
				note = fmt.Sprintf("; each rank's batch stream starts afresh on %d ranks", pg.WorldSize())
			}
			fmt.Fprintf(w, "train: resumed from %s (step %d; saved by %d rank(s), %s%s)\n", r.Path, r.Step, r.World, r.Layout, note)
		},
		resumed: func(r *ckpt.Resumed) {
			fmt.Fprintf(w, "train: resumed from %s (step %d)\n", r.Path, r.Step)
			for _, s := range r.Skipped {
				fmt.Fprintf(w, "train: passed over %s: %v\n", s.Path, s.Err)
			}
		},
	}
	res, err := train(ctx, pg, c, cfg, h)
	bar.finish()
	if err != nil {
		return err
	}
	if !leader {
		return nil
	}
	if res.Interrupted {
		fmt.Fprintf(w, "train: interrupted at step %d\n", res.Steps)
	}
	resumed := ""
	if res.Start > 0 {
		resumed = fmt.Sprintf(" (steps %d to %d, after resuming)", res.Start+1, res.Steps)
	}
	fmt.Fprintf(w, "train: %d steps%s in %.1fs, %.0f tokens/s (%.2f steps/s)\n", res.Steps-res.Start, resumed,
		res.TrainTime.Seconds(), res.TokensPerSec, float64(res.Steps-res.Start)/res.TrainTime.Seconds())
	fmt.Fprint(w, curveTable(res.Curve, 12))
	if cfg.CkptDir != "" && res.Sharded > 0 {
		fmt.Fprintf(w, "train: %d sharded checkpoint(s) saved to %s, every rank writing its part; training waited %.1f ms per save\n",
			res.Sharded, cfg.CkptDir, res.ShardedTime.Seconds()*1e3/float64(res.Sharded))
	} else if cfg.CkptDir != "" {
		st := res.Ckpt
		fmt.Fprintf(w, "train: %d checkpoint(s) saved to %s; training waited %.2f ms per save (the copy), writes took %.1f ms each\n",
			st.Saves, cfg.CkptDir, st.Copy.Seconds()*1e3/float64(max(st.Saves, 1)), st.Write.Seconds()*1e3/float64(max(st.Writes, 1)))
	}
	if cfg.Pipeline {
		hashes := make([]string, len(res.Stages))
		for i, h := range res.Stages {
			hashes[i] = fmt.Sprintf("%016x", h)
		}
		fmt.Fprintf(w, "train: pipeline of %d stages, parameters per stage fnv64a %s\n", pg.WorldSize(), strings.Join(hashes, " "))
		fmt.Fprintf(w, "train: -out is not written by a pipeline (no rank holds the whole model); the stages' checkpoints are in -ckpt-dir\n")
		return nil
	}
	if pg.WorldSize() > 1 {
		if cfg.sharding() == "full" {
			fmt.Fprintln(w, fsdpSummary(res))
		} else {
			fmt.Fprintln(w, ddpSummary(res))
		}
		fmt.Fprintf(w, "train: parameters identical on all %d ranks (fnv64a %016x)\n", pg.WorldSize(), res.Check.Hash)
	}
	ck := &transformer.Checkpoint{Config: model, Vocab: c.Vocab, Step: int64(res.Steps), Tensors: res.Weights}
	if err := saveModel(*out, ck); err != nil {
		return err
	}
	fmt.Fprintf(w, "train: saved %s\n", *out)
	if *plotPath != "" {
		if err := writePlot(*plotPath, res); err != nil {
			return err
		}
		fmt.Fprintf(w, "train: wrote %s\n", *plotPath)
	}
	return nil
}

// ddpSummary describes rank 0's gradient all-reduces per step: how long
// they were in flight (from launch, mid-backprop, to completion, which
// includes waiting for slower ranks to get there) and how long the step
// waited for them after backprop (exposed).
func ddpSummary(res *trainResult) string {
	st, n := res.DDP, float64(max(res.Steps, 1))
	ms := func(d time.Duration) float64 { return d.Seconds() * 1e3 / n }
	hidden := 0.0
	if st.Comm > 0 {
		hidden = max(0, 100*float64(st.Comm-st.Exposed)/float64(st.Comm))
	}
	return fmt.Sprintf("train: DDP per step: forward+backward %.1f ms; %.0f all-reduce(s) of %.0f KB in all, in flight %.1f ms (%.0f%% during backprop), %.1f ms exposed after it",
		ms(st.Compute), float64(st.Buckets)/n, float64(st.Bytes)/n/1e3, ms(st.Comm), hidden, ms(st.Exposed))
}

// stopRule describes when training stops.
func stopRule(cfg trainConfig) string {
	switch {
	case cfg.Steps > 0 && cfg.Duration > 0:
		return fmt.Sprintf("stop after %d steps or %s", cfg.Steps, cfg.Duration)
	case cfg.Steps > 0:
		return fmt.Sprintf("stop after %d steps", cfg.Steps)
	}
	return fmt.Sprintf("stop after %s", cfg.Duration)
}

// curveTable formats at most max points of the loss curve (always the
// first and the last, the others evenly spread).
func curveTable(curve []point, maxPoints int) string {
	var b strings.Builder
	b.WriteString("loss curve (cross-entropy in nats/char; train: mean over the steps since the previous validation):\n")
	b.WriteString("   step     time   train     val\n")
	for _, i := range spread(len(curve), maxPoints) {
		p := curve[i]
		train := "      -"
		if !math.IsNaN(p.Train) {
			train = fmt.Sprintf("%7.3f", p.Train)
		}
		val := "      -"
		if !math.IsNaN(p.Val) {
			val = fmt.Sprintf("%7.3f", p.Val)
		}
		fmt.Fprintf(&b, "  %5d  %7s %s %s\n", p.Step, p.Elapsed.Round(time.Second), train, val)
	}
	return b.String()
}

// spread returns at most k indices of 0..n-1, evenly spread, including the
// first and the last.
func spread(n, k int) []int {
	if n <= k {
		out := make([]int, n)
		for i := range out {
			out[i] = i
		}
		return out
	}
	out := make([]int, 0, k)
	for i := range k {
		out = append(out, i*(n-1)/(k-1))
	}
	return out
}
