package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gdist/gdist"
	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/internal/benchutil"
	"github.com/gdist/gdist/internal/cli"
	"github.com/gdist/gdist/internal/launch"
)

// envJob carries a rank's job (JSON) from the parent to the re-executed
// child; its presence makes the program a rank.
const envJob = "GDIST_BENCH_JOB"

// errUsage reports bad command-line arguments (already printed).
var errUsage = errors.New("bench/zero: usage")

func main() { cli.Main("bench/zero", errUsage, program) }

func program(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if spec, ok := os.LookupEnv(envJob); ok {
		return rankMain(ctx, spec, stdout)
	}
	return benchMain(ctx, args, stdout, stderr)
}

// options are the benchmark's flags.
type options struct {
	part      string
	ranks     []int
	modes     []string
	memSizes  []int
	memBatch  int
	memSteps  int
	timeSizes [][]int
	timeBatch int
	rounds    int
	warmup    int
	reps      int
	bucket    int
	prefetch  bool
	transport string
	timeout   time.Duration
}

func benchMain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o options
	fs := flag.NewFlagSet("bench/zero", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.part, "part", "all", "what to run: memory, time or all")
	ranksList := fs.String("ranks", "1,2,4", "memory: world sizes")
	modesList := fs.String("modes", strings.Join(modes, ","), "modes to measure: ddp (plain DDP), zero1, zero2, full (FSDP, one unit per layer)")
	memSizes := fs.String("mem-sizes", "1024,1024,1024,1024,1024,1024,1024,10", "memory: the MLP's layer widths")
	fs.IntVar(&o.memBatch, "mem-batch", 16, "memory: batch per rank")
	fs.IntVar(&o.memSteps, "mem-steps", 3, "memory: steps probed (a garbage collection and a heap reading after every pass and every step)")
	timeSizes := fs.String("time-sizes", "784,256,128,10;1024,1024,1024,1024,1024,10", "time: the MLPs' layer widths, models separated by semicolons")
	fs.IntVar(&o.timeBatch, "time-batch", 64, "time: batch per rank")
	fs.IntVar(&o.rounds, "rounds", 100, "time: rounds per run, each one timed step of every mode (in a rotating order)")
	fs.IntVar(&o.warmup, "warmup", 10, "time: untimed steps of every mode first")
	fs.IntVar(&o.reps, "reps", 3, "time: runs (fresh processes); their rounds are pooled")
	fs.IntVar(&o.bucket, "bucket-cap", 1<<20, "DDP and ZeRO bucket cap in bytes (0: package ddp's defaults, 25 MiB with a 1 MiB first bucket)")
	fs.BoolVar(&o.prefetch, "prefetch", true, "full sharding: gather the next unit while the current one computes (false: one gather buffer, no prefetch)")
	fs.StringVar(&o.transport, "transport", "auto", "transport between the ranks: auto (shared memory on one host), tcp or shm")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Minute, "give up after this long")
	if err := cli.Parse(fs, args, errUsage); err != nil {
		return err
	}
	var err error
	if o.ranks, err = ints(*ranksList, ","); err != nil {
		return cli.Usagef(fs, errUsage, "-ranks: %v", err)
	}
	o.modes = strings.Split(*modesList, ",")
	for _, m := range o.modes {
		if !slices.Contains(modes, m) {
			return cli.Usagef(fs, errUsage, "-modes: %q is not one of %s", m, strings.Join(modes, ","))
		}
	}
	if o.memSizes, err = ints(*memSizes, ","); err != nil {
		return cli.Usagef(fs, errUsage, "-mem-sizes: %v", err)
	}
	for _, s := range strings.Split(*timeSizes, ";") {
		sz, err := ints(s, ",")
		if err != nil {
			return cli.Usagef(fs, errUsage, "-time-sizes: %v", err)
		}
		o.timeSizes = append(o.timeSizes, sz)
	}
	if o.reps < 1 || o.rounds < 1 || o.warmup < 0 || o.memSteps < 1 {
		return cli.Usagef(fs, errUsage, "-reps, -rounds and -mem-steps must be positive, -warmup not negative")
	}
	if o.part != "memory" && !slices.Contains(o.modes, "ddp") {
		return cli.Usagef(fs, errUsage, "-modes must include ddp, against which the others are measured")
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	fmt.Fprintf(stdout, "bench/zero: %s, load average %s at the start\n", time.Now().Format(time.DateTime), benchutil.LoadAvg())
	if o.part == "memory" || o.part == "all" {
		if err := memory(ctx, o, stdout, stderr); err != nil {
			return err
		}
	}
	if o.part == "time" || o.part == "all" {
		if err := stepTime(ctx, o, stdout, stderr); err != nil {
			return err
		}
	}
	if o.part != "memory" && o.part != "time" && o.part != "all" {
		return cli.Usagef(fs, errUsage, "-part %q: want memory, time or all", o.part)
	}
	fmt.Fprintf(stdout, "\nload average at the end: %s\n", benchutil.LoadAvg())
	return nil
}

// ints parses a list of positive integers.
func ints(s, sep string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, sep) {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 1 {
			return nil, fmt.Errorf("%q is not a list of positive integers", s)
		}
		out = append(out, v)
	}
	return out, nil
}

// run starts j on world ranks (GOMAXPROCS 1 each) and returns their
// outcomes.
func run(ctx context.Context, world int, j job, stderr io.Writer) ([]outcome, error) {
	spec, err := json.Marshal(j)
	if err != nil {
		return nil, err
	}
	return benchutil.RunRanks[outcome](ctx, launch.Job{Spec: launch.Spec{NProc: world}, Procs: 1,
		RankEnv: func(int) []string { return []string{envJob + "=" + string(spec)} }}, stderr)
}

const mb = 1 << 20

// memory is part (a): for each world size and mode, the bytes a rank holds
// and its peak live heap, next to DDP's.
func memory(ctx context.Context, o options, stdout, stderr io.Writer) error {
	fmt.Fprintf(stdout, "\nMemory per rank: MLP %v (float32), batch %d per rank, Adam, DDP/ZeRO bucket cap %d B, full sharding prefetching %t; rank 0's bytes after %d steps,\n", o.memSizes, o.memBatch, o.bucket, o.prefetch, o.memSteps)
	fmt.Fprintf(stdout, "counted from the tensors (MiB); peak heap: the largest live heap after a garbage collection following a pass or a step (MiB)\n\n")
	w := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "ranks\tmode\tparams\tgathered\tgrads\tbuckets\toptimizer\tmachine grads\tpeak heap\tparams/DDP\tgrads/DDP\toptimizer/DDP\theap/DDP\t")
	for _, n := range o.ranks {
		var base *outcome
		for _, mode := range o.modes {
			j := job{Mode: mode, Sizes: o.memSizes, Batch: o.memBatch, Steps: o.memSteps, BucketCap: o.bucket, NoPrefetch: !o.prefetch, Transport: o.transport}
			res, err := run(ctx, n, j, stderr)
			if err != nil {
				return fmt.Errorf("memory, %d ranks, %s: %w", n, mode, err)
			}
			r := res[0]
			if mode == "ddp" {
				base = &r
			}
			ratio := func(a, b int64) string {
				if base == nil || b == 0 {
					return "-"
				}
				return fmt.Sprintf("%.3f", float64(a)/float64(b))
			}
			var heapRatio string = "-"
			if base != nil {
				heapRatio = fmt.Sprintf("%.3f", float64(r.PeakHeap)/float64(base.PeakHeap))
			}
			fmt.Fprintf(w, "%d\t%s\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.1f\t%s\t%s\t%s\t%s\t\n", n, mode,
				float64(r.ParamBytes)/mb, float64(r.GatheredBytes)/mb, float64(r.GradBytes)/mb, float64(r.BucketBytes)/mb,
				float64(r.OptBytes)/mb, float64(r.MachineGradBytes)/mb, float64(r.PeakHeap)/mb,
				ratio(r.ParamBytes, baseOf(base, func(o *outcome) int64 { return o.ParamBytes })),
				ratio(r.GradBytes, baseOf(base, func(o *outcome) int64 { return o.GradBytes })),
				ratio(r.OptBytes, baseOf(base, func(o *outcome) int64 { return o.OptBytes })), heapRatio)
		}
	}
	w.Flush()
	fmt.Fprintf(stdout, "\nparams: the parameter values a rank holds (full sharding: its pieces); gathered: full sharding's two gather buffers;\n")
	fmt.Fprintf(stdout, "grads: the gradients the solver reads (DDP: the parameters' dual values; ZeRO, full: this rank's averaged pieces);\n")
	fmt.Fprintf(stdout, "buckets: DDP and ZeRO-1's bucket buffers, ZeRO-2 and full sharding's two staging buffers; optimizer: Adam's moments;\n")
	fmt.Fprintf(stdout, "machine grads: the parameter gradients Gorgonia's TapeMachine keeps as node values, in every mode\n")
	return nil
}

func baseOf(b *outcome, f func(*outcome) int64) int64 {
	if b == nil {
		return 0
	}
	return f(b)
}

// stepTime is part (b): the step time of every mode on 2 ranks, paired
// with DDP's: every rank process builds the model under every mode and
// runs rounds of one step of each (see timeJob), so that a step and the
// DDP step it is compared with run under the same load.
func stepTime(ctx context.Context, o options, stdout, stderr io.Writer) error {
	for _, sizes := range o.timeSizes {
		fmt.Fprintf(stdout, "\nStep time on 2 ranks (GOMAXPROCS 1 each, -transport %s): MLP %v (float32), batch %d per rank, Adam, bucket cap %d B;\n", o.transport, sizes, o.timeBatch, o.bucket)
		fmt.Fprintf(stdout, "%d run(s) of %d rounds, each round one step of every mode (after %d untimed steps each); a step's time is the slower rank's;\n", o.reps, o.rounds, o.warmup)
		fmt.Fprintf(stdout, "ratio: the step's time over the DDP step's of the same round (median and quartiles over the rounds); CPU: the same of the CPU time the ranks used\n\n")
		wall := make(map[string][]float64)
		ratio := make(map[string][]float64)
		cpu := make(map[string][]float64)
		for rep := range o.reps {
			j := job{Modes: o.modes, Sizes: sizes, Batch: o.timeBatch, Rounds: o.rounds, Warmup: o.warmup, BucketCap: o.bucket, NoPrefetch: !o.prefetch, Transport: o.transport}
			res, err := run(ctx, 2, j, stderr)
			if err != nil {
				return fmt.Errorf("time, run %d: %w", rep+1, err)
			}
			for r := range o.rounds {
				at := func(m string, f func(outcome) []float64) float64 {
					v := 0.0
					for _, rk := range res {
						v = max(v, f(rk)[r])
					}
					return v
				}
				base := at("ddp", func(x outcome) []float64 { return x.Wall["ddp"] })
				baseCPU := 0.0
				for _, rk := range res {
					baseCPU += rk.CPU["ddp"][r]
				}
				for _, m := range o.modes {
					w := at(m, func(x outcome) []float64 { return x.Wall[m] })
					c := 0.0
					for _, rk := range res {
						c += rk.CPU[m][r]
					}
					wall[m] = append(wall[m], w)
					ratio[m] = append(ratio[m], w/base)
					cpu[m] = append(cpu[m], c/baseCPU)
				}
			}
		}
		w := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(w, "mode\tstep ms (median)\tratio to DDP (median)\tquartiles\tCPU ratio (median)\t")
		for _, m := range o.modes {
			q := quartiles(ratio[m])
			fmt.Fprintf(w, "%s\t%.2f\t%.3f\t%.3f-%.3f\t%.3f\t\n", m, quartiles(wall[m])[1], q[1], q[0], q[2], quartiles(cpu[m])[1])
		}
		w.Flush()
	}
	return nil
}

// quartiles returns the first quartile, the median and the third quartile
// of v.
func quartiles(v []float64) [3]float64 {
	s := slices.Sorted(slices.Values(v))
	n := len(s)
	return [3]float64{s[n/4], s[n/2], s[(3*n)/4]}
}

// rankMain is a rank: it joins the job and runs the job's spec.
func rankMain(ctx context.Context, spec string, stdout io.Writer) (err error) {
	var j job
	if err := json.Unmarshal([]byte(spec), &j); err != nil {
		return fmt.Errorf("%s: %w", envJob, err)
	}
	var pg *dist.ProcessGroup
	if os.Getenv("WORLD_SIZE") == "1" {
		ts, err := transport.NewLocal(1)
		if err != nil {
			return err
		}
		if pg, err = dist.New(ts[0]); err != nil {
			return err
		}
	} else {
		if err := os.Setenv(gdist.EnvTransport, j.Transport); err != nil {
			return err
		}
		jctx, cancel := context.WithTimeout(ctx, time.Minute)
		pg, err = gdist.InitFromEnv(jctx)
		cancel()
		if err != nil {
			return err
		}
	}
	defer cli.Close(&err, pg)
	o, err := runJob(ctx, pg, j)
	if err != nil {
		return err
	}
	// No rank closes its links while a peer still measures.
	if err := pg.Barrier(ctx); err != nil {
		return err
	}
	return benchutil.Report(stdout, o)
}
