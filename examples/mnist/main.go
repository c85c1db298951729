package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"time"

	"github.com/gdist/gdist"
	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/ckpt"
	"github.com/gdist/gdist/internal/cli"
	"github.com/gdist/gdist/internal/mnist"
	iprogress "github.com/gdist/gdist/internal/progress"
)

func main() { cli.Main("mnist", errUsage, run) }

// Limits that tests set to keep a run short (0: none); see config.
var testMaxSteps, testTestLimit int

// errUsage reports bad command-line arguments (already printed).
var errUsage = errors.New("mnist: usage")

// run is the whole program: args are the command-line arguments without
// the program name.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	fs := flag.NewFlagSet("mnist", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg config
	fs.IntVar(&cfg.Epochs, "epochs", 3, "training epochs")
	fs.IntVar(&cfg.Batch, "batch", 64, "batch size per rank")
	fs.Float64Var(&cfg.LR, "lr", 1e-3, "Adam learning rate")
	fs.Int64Var(&cfg.Seed, "seed", 1, "seed of the initial weights and of the data order (the same on every rank)")
	data := fs.String("data", "", "directory holding the MNIST IDX files (default: the GoMNIST module's data/ directory)")
	plotPath := fs.String("plot", "", "write a loss and accuracy plot to this PNG file (rank 0)")
	fs.StringVar(&cfg.Compress, "compress", "", "all-reduce gradients as f16 or bf16 (default: float32)")
	fs.StringVar(&cfg.CkptDir, "ckpt-dir", "", "save checkpoints here (rank 0) and resume from the latest good one (every rank)")
	fs.Int64Var(&cfg.CkptEvery, "ckpt-every", 100, "with -ckpt-dir: save every this many steps (0: only at the end)")
	fs.BoolVar(&cfg.CkptFresh, "ckpt-fresh", false, "with -ckpt-dir: when checkpoints exist but none verifies, start afresh (setting them aside as *.corrupt) instead of failing")
	fs.StringVar(&cfg.Shard, "shard", "none", "shard the training state over the ranks: none (DDP), zero1 (optimizer state), zero2 (and gradients) or full (and parameters, one unit per layer)")
	fs.IntVar(&cfg.BucketCap, "bucket-cap", 0, "DDP bucket size cap in bytes (default: 25 MiB; the first bucket is capped at min(this, 1 MiB))")
	fs.IntVar(&cfg.MaxSteps, "max-steps", 0, "train at most this many steps per epoch, for a quick run (0: the whole epoch)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: [gdistrun -n N --] mnist [flags]\n\nData-parallel MLP training on MNIST.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "mnist: unexpected arguments %q\n", fs.Args())
		fs.Usage()
		return errUsage
	}
	if cfg.CkptEvery < 0 {
		fmt.Fprintf(stderr, "mnist: -ckpt-every %d: must not be negative\n", cfg.CkptEvery)
		return errUsage
	}
	if _, err := ddpOptions(cfg); err != nil {
		fmt.Fprintln(stderr, err)
		return errUsage
	}
	if err := checkShard(cfg); err != nil {
		fmt.Fprintln(stderr, err)
		return errUsage
	}
	if cfg.MaxSteps < 0 {
		fmt.Fprintf(stderr, "mnist: -max-steps %d: must not be negative\n", cfg.MaxSteps)
		return errUsage
	}
	if testMaxSteps > 0 {
		cfg.MaxSteps = testMaxSteps
	}
	cfg.TestLimit = testTestLimit
	cli.SetProcs()

	// Load the data before joining the job, so that a missing data set
	// fails every rank at once.
	dir, err := mnist.Locate(*data)
	if err != nil {
		return err // a *mnist.NotFoundError names where it looked and the -data flag
	}
	trainSet, testSet, err := mnist.Load(dir)
	if err != nil {
		return err
	}

	pg, err := gdist.InitFromEnv(ctx)
	if err != nil {
		return err
	}
	defer cli.Close(&err, pg)

	leader := pg.Rank() == 0
	out := io.Discard
	if leader {
		out = stdout
	}
	tty := iprogress.IsTerminal(stderr)
	var bar progress
	start := time.Now()
	h := hooks{
		ready: func(params, buckets int) {
			comp := cfg.Compress
			if comp == "" {
				comp = "none"
			}
			fmt.Fprintf(out, "mnist: %d rank(s)%s, GOMAXPROCS %d each; %d train and %d test images from %s\n",
				pg.WorldSize(), routes(pg), runtime.GOMAXPROCS(0), trainSet.N, testSet.N, dir)
			if s := sharding(cfg); s == "full" {
				fmt.Fprintf(out, "mnist: MLP %v float32, %d parameters in %d FSDP unit(s), fully sharded; batch %d per rank (%d global); Adam lr %g; %d epoch(s)\n",
					sizes, params, buckets, cfg.Batch, cfg.Batch*pg.WorldSize(), cfg.LR, cfg.Epochs)
			} else {
				fmt.Fprintf(out, "mnist: MLP %v float32, %d parameters in %d DDP bucket(s), sharding %s, compression %s; batch %d per rank (%d global); Adam lr %g; %d epoch(s)\n",
					sizes, params, buckets, s, comp, cfg.Batch, cfg.Batch*pg.WorldSize(), cfg.LR, cfg.Epochs)
			}
		},
		start: func(epoch, from, steps int) {
			bar = newProgress(stderr, tty, epoch, cfg.Epochs, from, steps, cfg.Batch*pg.WorldSize())
		},
		step: func(step int, loss float64) { bar.step(step, loss) },
		resumed: func(r *ckpt.Resumed) {
			if r.Fresh() {
				fmt.Fprintf(out, "mnist: -ckpt-fresh: starting afresh over %d checkpoint(s) that do not verify, set aside as *.corrupt\n", len(r.Skipped))
			} else {
				fmt.Fprintf(out, "mnist: resumed from %s (step %d, epoch %d)\n", r.Path, r.Step, r.State.Epoch+1)
			}
			for _, s := range r.Skipped {
				fmt.Fprintf(out, "mnist: passed over %s: %v\n", s.Path, s.Err)
			}
		},
		resumedSharded: func(r *ckpt.ShardedResumed) {
			fmt.Fprintf(out, "mnist: resumed from %s (step %d, epoch %d; saved by %d rank(s), %s)\n", r.Path, r.Step, r.State.Epoch+1, r.World, r.Layout)
		},
		rescaled: func(saved, now int) {
			fmt.Fprintf(out, "mnist: the checkpoint was saved by %d rank(s), training goes on on %d: the rest of the epoch is dealt among %d ranks, the global batch is now %d\n",
				saved, now, now, cfg.Batch*now)
		},
		end: func(e epochStats) {
			bar.finish()
			comm := "comm " + ms(e.Comm) + "/step, exposed"
			if e.Comm < 0 {
				comm = "waited for collectives"
			}
			fmt.Fprintf(out, "epoch %d/%d  loss %.4f  test accuracy %.2f%%  %.0f samples/s  (%d steps in %.1fs)  %s %s/step\n",
				e.Epoch, cfg.Epochs, e.Loss, 100*e.Acc, e.Throughput, e.Steps, e.Train.Seconds(), comm, ms(e.Exposed))
		},
	}
	res, err := train(ctx, pg, trainSet, testSet, cfg, h)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "parameters identical on all %d ranks (sum %.9g, sum of squares %.9g, fnv64a %016x)\n",
		pg.WorldSize(), res.Check.Sum, res.Check.SumSq, res.Check.Hash)
	if leader && cfg.CkptDir != "" && res.Sharded > 0 {
		fmt.Fprintf(out, "mnist: %d sharded checkpoint(s) saved to %s, every rank writing its part; training waited %s per save\n",
			res.Sharded, cfg.CkptDir, ms(res.ShardedTime/time.Duration(res.Sharded)))
	} else if leader && cfg.CkptDir != "" {
		st := res.Ckpt
		fmt.Fprintf(out, "mnist: %d checkpoint(s) saved to %s; training waited %s per save (the copy), writes took %s each\n",
			st.Saves, cfg.CkptDir, ms(st.Copy/time.Duration(max(st.Saves, 1))), ms(st.Write/time.Duration(max(st.Writes, 1))))
	}
	if leader && len(res.Epochs) == 0 {
		fmt.Fprintf(out, "mnist: the checkpoint in %s is of a finished run: nothing to train; parameters fnv64a %016x\n", cfg.CkptDir, res.Check.Hash)
	} else if leader {
		last := res.Epochs[len(res.Epochs)-1]
		fmt.Fprintf(out, "mnist: final test accuracy %.2f%% after %d epoch(s); total %.1fs; parameters fnv64a %016x\n",
			100*last.Acc, len(res.Epochs), time.Since(start).Seconds(), res.Check.Hash)
		if *plotPath != "" {
			if err := writePlot(*plotPath, res); err != nil {
				return err
			}
			fmt.Fprintf(out, "mnist: wrote %s\n", *plotPath)
		}
	}
	return nil
}

// ms formats d in milliseconds.
func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 2, 64) + "ms"
}

// routes says how rank 0 reaches its peers, when the transport tells
// (gdist.InitFromEnv's hybrid transport does: shared memory within a host,
// TCP across hosts).
func routes(pg *dist.ProcessGroup) string {
	if v, ok := pg.Transport().(interface{ Summary() string }); ok && pg.WorldSize() > 1 {
		return " (" + v.Summary() + ")"
	}
	return ""
}
