package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gdist/gdist"
	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/ddp"
	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/tcp"
	"github.com/gdist/gdist/internal/benchutil"
	"github.com/gdist/gdist/internal/cli"
	"github.com/gdist/gdist/internal/launch"
)

// envJob carries a rank's job (JSON) from the parent to the re-executed
// child; its presence makes the program a rank.
const envJob = "GDIST_BENCH_JOB"

// errUsage reports bad command-line arguments (already printed).
var errUsage = errors.New("bench/ddp: usage")

func main() { cli.Main("bench/ddp", errUsage, program) }

// program is the whole program: a rank when envJob is set, else the benchmark, which
// starts the ranks.
func program(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if spec, ok := os.LookupEnv(envJob); ok {
		return rankMain(ctx, spec, stdout)
	}
	return benchMain(ctx, args, stdout, stderr)
}

// options are the benchmark's flags.
type options struct {
	part     string
	procs    int
	bind     bool
	timeout  time.Duration
	profile  string
	steps    int
	warmup   int
	reps     int
	batch    int
	compress string
	bucket   int

	oSteps, oWarmup, oReps int
	oBatch                 int
	oProcs                 int
	layers, width          int
	links                  []float64 // MB/s
	oBucket                int
	sockBuf                int
	small                  int
	transports             []string
}

// validTransports are the values of -transport: TCP over loopback, shared
// memory (dist/transport/shm), or whatever gdist.InitFromEnv picks with
// GDIST_TRANSPORT=auto.
var validTransports = []string{"tcp", "shm", "auto"}

func benchMain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o options
	fs := flag.NewFlagSet("bench/ddp", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.part, "part", "all", "what to run: scaling, overlap or all")
	fs.IntVar(&o.procs, "procs", 1, "scaling: GOMAXPROCS of every rank")
	fs.BoolVar(&o.bind, "bind", false, "scaling: bind rank r to one CPU, the r-th (Linux; what gdistrun -bind-to core does), in every configuration")
	fs.DurationVar(&o.timeout, "timeout", 15*time.Minute, "give up after this long")
	fs.StringVar(&o.profile, "cpuprofile", "", "write a CPU profile of every rank's timed steps into this directory (and, with GDIST_BENCH_TRACE=1 in the environment, an execution trace)")
	fs.IntVar(&o.steps, "steps", 150, "scaling: timed steps per run")
	fs.IntVar(&o.warmup, "warmup", 20, "scaling: untimed steps first")
	fs.IntVar(&o.reps, "reps", 5, "scaling: runs per configuration (interleaved; the fastest and the median are reported)")
	fs.IntVar(&o.batch, "batch", 64, "scaling: batch per rank")
	fs.StringVar(&o.compress, "compress", "", "scaling: DDP gradient compression, f16 or bf16")
	fs.IntVar(&o.bucket, "bucket-cap", 0, "scaling: DDP bucket cap in bytes (0: default, 25 MiB with a 1 MiB first bucket; the first bucket is capped at min(this, 1 MiB))")
	fs.IntVar(&o.oSteps, "overlap-steps", 6, "overlap: timed steps per run")
	fs.IntVar(&o.oWarmup, "overlap-warmup", 2, "overlap: untimed steps first")
	fs.IntVar(&o.oReps, "overlap-reps", 3, "overlap: runs per configuration (interleaved; the fastest is reported)")
	fs.IntVar(&o.oBatch, "overlap-batch", 128, "overlap: batch per rank")
	fs.IntVar(&o.oProcs, "overlap-procs", 2, "overlap: GOMAXPROCS of every rank (with 1, communication goroutines wait for the P the backward pass holds)")
	fs.IntVar(&o.layers, "layers", 8, "overlap: layers of the deep model")
	fs.IntVar(&o.width, "width", 1024, "overlap: width of every layer")
	linkList := fs.String("link", "400,1000", "overlap: comma-separated bandwidths of each rank's outgoing link in MB/s, one table each (1 MB = 1e6 bytes; 0: unlimited)")
	fs.IntVar(&o.sockBuf, "socket-buffer", 0, "kernel socket buffer size of the ranks' TCP connections in bytes (0: the kernel's auto-tuning)")
	fs.IntVar(&o.small, "small", -1, "all-reduce small-message threshold in bytes: recursive doubling below it, ring above (-1: dist.DefaultSmallThreshold)")
	fs.IntVar(&o.oBucket, "overlap-bucket-cap", 0, "overlap: DDP bucket cap in bytes (0: one layer per bucket)")
	trList := fs.String("transport", "tcp", "scaling: comma-separated transports of the 2-rank runs, interleaved with the others: tcp, shm (shared memory, Linux) or auto (gdist.InitFromEnv with GDIST_TRANSPORT=auto); overlap: the first one")
	if err := cli.Parse(fs, args, errUsage); err != nil {
		return err
	}
	for _, tr := range strings.Split(*trList, ",") {
		if !slices.Contains(validTransports, tr) {
			return cli.Usagef(fs, errUsage, "-transport %q: want some of %s", *trList, strings.Join(validTransports, ","))
		}
		o.transports = append(o.transports, tr)
	}
	for _, f := range strings.Split(*linkList, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v < 0 {
			return cli.Usagef(fs, errUsage, "-link %q: want comma-separated MB/s values >= 0", *linkList)
		}
		o.links = append(o.links, v)
	}
	if o.procs < 1 || o.oProcs < 1 || o.steps < 1 || o.reps < 1 || o.oSteps < 1 || o.oReps < 1 || o.layers < 1 || o.width < 1 {
		return cli.Usagef(fs, errUsage, "-procs, -overlap-procs, -steps, -reps, -overlap-steps, -overlap-reps, -layers and -width must be positive")
	}
	switch o.part {
	case "all", "scaling", "overlap":
	default:
		return cli.Usagef(fs, errUsage, "-part %q: want scaling, overlap or all", o.part)
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	if o.profile != "" {
		if err := os.MkdirAll(o.profile, 0o755); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "bench/ddp: %s/%s, %d CPUs, %s; ranks are separate processes over loopback TCP; load average %s\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), benchutil.LoadAvg())
	if o.part != "overlap" {
		if err := scaling(ctx, o, stdout, stderr); err != nil {
			return err
		}
	}
	if o.part != "scaling" {
		if err := overlap(ctx, o, stdout, stderr); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "\nload average at the end: %s\n", benchutil.LoadAvg())
	return nil
}

// run is one configuration's result: every rank's outcome.
type run []outcome

func (r run) world() int { return r[0].World }

// elapsed is the slowest rank's time for the timed steps.
func (r run) elapsed() float64 {
	e := 0.0
	for _, o := range r {
		e = max(e, o.Elapsed)
	}
	return e
}

// throughput is samples/s over all ranks.
func (r run) throughput(batch int) float64 {
	return float64(r.world()*batch*r[0].Steps) / r.elapsed()
}

// mean is the mean over ranks of f, per step in ms.
func (r run) mean(f func(outcome) float64) float64 {
	var s float64
	for _, o := range r {
		s += o.perStep(f(o))
	}
	return s / float64(len(r))
}

// cpuPct is the mean over ranks of the CPU time a rank used as a percentage
// of the wall time of the timed steps: a compute-bound rank with
// GOMAXPROCS=1 shows about 100; less means it waited (for a peer, or for a
// CPU another process held).
func (r run) cpuPct() float64 {
	var s float64
	for _, o := range r {
		s += 100 * o.CPU / o.Elapsed
	}
	return s / float64(len(r))
}

func (r run) stepMs() float64 { return 1e3 * r.elapsed() / float64(r[0].Steps) }

// byThroughput returns runs sorted by throughput, slowest first.
func byThroughput(runs []run, batch int) []run {
	s := slices.Clone(runs)
	slices.SortStableFunc(s, func(a, b run) int {
		return cmp.Compare(a.throughput(batch), b.throughput(batch))
	})
	return s
}

// bestAndMedian returns the fastest run and the run of median throughput.
// On a shared machine other load only ever slows a run down, so the
// fastest run is the best estimate of the undisturbed figure.
func bestAndMedian(runs []run, batch int) (best, med run) {
	s := byThroughput(runs, batch)
	return s[len(s)-1], s[len(s)/2]
}

// scaling is part (a): the MNIST MLP at world sizes 1 and 2.
func scaling(ctx context.Context, o options, stdout, stderr io.Writer) error {
	base := job{Sizes: []int{784, 256, 128, 10}, Batch: o.batch, Steps: o.steps, Warmup: o.warmup,
		Compress: o.compress, BucketCap: o.bucket, SocketBuffer: o.sockBuf, Small: o.smallThreshold()}
	if o.bucket > 0 { // as the mnist example does: the first bucket is no larger
		base.FirstBucketCap = min(o.bucket, ddp.DefaultFirstBucketCap)
	}
	type cfg struct {
		label string
		world int
		j     job
	}
	plain, ddp1 := base, base
	plain.Name, plain.Plain, plain.Compress, plain.BucketCap = "plain-w1", true, "", 0
	ddp1.Name = "ddp-w1"
	cfgs := []cfg{{"plain Gorgonia (no DDP)", 1, plain}, {"DDP", 1, ddp1}}
	for _, tr := range o.transports {
		ddp2 := base
		ddp2.Name, ddp2.Raw, ddp2.Transport = "ddp-w2-"+tr, true, tr
		cfgs = append(cfgs, cfg{"DDP, " + tr, 2, ddp2})
	}
	runs := make([][]run, len(cfgs))
	for rep := range o.reps {
		for i, c := range cfgs {
			fmt.Fprintf(stderr, "scaling: %s, %d rank(s), run %d/%d\n", c.label, c.world, rep+1, o.reps)
			j := c.j
			if o.profile != "" {
				j.CPUProfile = filepath.Join(o.profile, fmt.Sprintf("%s-rep%d", j.Name, rep))
			}
			r, err := startRanks(ctx, c.world, o.procs, o.bind, j, stderr)
			if err != nil {
				return fmt.Errorf("%s on %d rank(s): %w", c.label, c.world, err)
			}
			runs[i] = append(runs[i], r)
		}
	}

	comp := o.compress
	if comp == "" {
		comp = "float32"
	}
	fmt.Fprintf(stdout, "\n(a) Scaling: MNIST MLP 784-256-128-10 (%d parameters), batch %d per rank, synthetic data, gradients all-reduced as %s,\n",
		runs[0][0][0].Params, o.batch, comp)
	fmt.Fprintf(stdout, "    GOMAXPROCS=%d per rank;", o.procs)
	if o.bind {
		fmt.Fprintf(stdout, " each rank bound to one CPU (-bind);")
	}
	fmt.Fprintf(stdout, " %d timed steps after %d warm-up, %d interleaved runs per configuration; times per step of the fastest run, means over ranks\n\n",
		o.steps, o.warmup, o.reps)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "configuration\tranks\tbuckets\tbest samples/s\tmedian\tstep ms\tcompute ms\tcomm ms\texposed ms\tcpu %\tall runs (samples/s)\t")
	best := make([]run, len(cfgs))
	med := make([]run, len(cfgs))
	for i, c := range cfgs {
		best[i], med[i] = bestAndMedian(runs[i], o.batch)
		m := best[i]
		var all []string
		for _, r := range runs[i] {
			all = append(all, strconv.FormatFloat(r.throughput(o.batch), 'f', 0, 64))
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%.0f\t%.2f\t%.2f\t%.2f\t%.2f\t%.0f\t%s\t\n", c.label, c.world, m[0].Buckets,
			m.throughput(o.batch), med[i].throughput(o.batch), m.stepMs(),
			m.mean(func(o outcome) float64 { return o.Compute }), m.mean(func(o outcome) float64 { return o.Comm }),
			m.mean(func(o outcome) float64 { return o.Exposed }), m.cpuPct(), strings.Join(all, " "))
	}
	tw.Flush()
	cpu := func(r run) float64 { // CPU ms per step per rank
		var s float64
		for _, o := range r {
			s += o.perStep(o.CPU)
		}
		return s / float64(len(r))
	}
	for k, tr := range o.transports {
		i := 2 + k
		eff := func(rs []run) (float64, float64) {
			t1p, t1d, t2 := rs[0].throughput(o.batch), rs[1].throughput(o.batch), rs[i].throughput(o.batch)
			return t2 / (2 * t1p), t2 / (2 * t1d)
		}
		bp, bd := eff(best)
		mp, md := eff(med)
		fmt.Fprintf(stdout, "\nscaling efficiency thr(2)/(2*thr(1)) over %s (%s), target >= 0.90 (PyTorch DDP/gloo ~0.81):\n", tr, best[i][0].Transport)
		fmt.Fprintf(stdout, "  fastest runs: %.3f against plain Gorgonia on 1 process, %.3f against DDP on 1 rank\n", bp, bd)
		fmt.Fprintf(stdout, "  median runs:  %.3f against plain Gorgonia on 1 process, %.3f against DDP on 1 rank\n", mp, md)
		fmt.Fprintf(stdout, "  CPU time per step and rank (fastest runs): %.2f ms plain, %.2f ms DDP 1 rank, %.2f ms DDP 2 ranks: CPU-bound efficiency %.3f / %.3f\n",
			cpu(best[0]), cpu(best[1]), cpu(best[i]), cpu(best[0])/cpu(best[i]), cpu(best[1])/cpu(best[i]))
		if rw := best[i][0].Raw; rw != nil {
			comm := best[i].mean(func(o outcome) float64 { return o.Comm })
			fmt.Fprintf(stdout, "  raw sockets between the same 2 processes: latency %.1f us (half RTT, 8 B), stream %.2f GB/s, ring exchange of %d B (2 rounds of %d B each way) %.3f ms\n",
				rw.LatencyUs, rw.StreamGBps, rw.ExchangeBytes, rw.ExchangeBytes/2, rw.ExchangeMs)
			fmt.Fprintf(stdout, "  DDP all-reduce per step %.3f ms = %.2fx the raw exchange\n", comm, comm/rw.ExchangeMs)
		}
	}
	fmt.Fprintf(stdout, "note: %d CPUs; 2 ranks x GOMAXPROCS=%d use %d of them; a cpu %% well below 100 means a rank waited (for its peer or for a CPU)\n",
		runtime.NumCPU(), o.procs, 2*o.procs)
	return nil
}

// overlap is part (b): a deep model on a slow link, overlap on and off,
// for every link speed of -link.
func overlap(ctx context.Context, o options, stdout, stderr io.Writer) error {
	sizes := make([]int, o.layers+1)
	for i := range sizes {
		sizes[i] = o.width
	}
	bucket := o.oBucket
	if bucket == 0 {
		bucket = 4 * (o.width*o.width + o.width) // one layer (weights and bias) per bucket
	}
	for li, link := range o.links {
		base := job{Sizes: sizes, Batch: o.oBatch, Steps: o.oSteps, Warmup: o.oWarmup, BucketCap: bucket, FirstBucketCap: bucket,
			LinkMBps: link, SocketBuffer: o.sockBuf, Small: o.smallThreshold(), Transport: o.transports[0]}
		on, off, upfront := base, base, base
		on.Name = "overlap-on"
		off.Name, off.NoOverlap = "overlap-off", true
		upfront.Name, upfront.Upfront = "hooks-upfront", true
		type cfg struct {
			label string
			j     job
		}
		cfgs := []cfg{
			{"on (hooks at point of use)", on},
			{"off (WithOverlap(false))", off},
			{"on, hooks created up front", upfront},
		}
		runs := make([][]run, len(cfgs))
		for rep := range o.oReps {
			for i, c := range cfgs {
				fmt.Fprintf(stderr, "overlap: link %g MB/s, %s, run %d/%d\n", link, c.label, rep+1, o.oReps)
				j := c.j
				if o.profile != "" {
					j.CPUProfile = filepath.Join(o.profile, fmt.Sprintf("%s-link%g-rep%d", j.Name, link, rep))
				}
				r, err := startRanks(ctx, 2, o.oProcs, false, j, stderr)
				if err != nil {
					return fmt.Errorf("overlap %s: %w", c.label, err)
				}
				runs[i] = append(runs[i], r)
			}
		}
		first := runs[0][0][0]
		if li == 0 {
			fmt.Fprintf(stdout, "\n(b) Overlap: %d layers of %dx%d float32 (%d parameters, %.1f MB of gradients per step) in %d buckets of <= %d B,\n",
				o.layers, o.width, o.width, first.Params, float64(first.Bytes)/1e6, first.Buckets, bucket)
			fmt.Fprintf(stdout, "    batch %d per rank, 2 ranks with GOMAXPROCS=%d; %d timed steps after %d warm-up, %d interleaved runs per configuration;\n",
				o.oBatch, o.oProcs, o.oSteps, o.oWarmup, o.oReps)
			fmt.Fprintf(stdout, "    times per step of the fastest run (means over ranks) and the median over runs of the exposed time\n")
		}
		linkDesc := "unlimited link"
		if link > 0 {
			linkDesc = fmt.Sprintf("each rank's outgoing link limited to %g MB/s: %.1f ms of link time per step for a 2-rank ring all-reduce of the gradients",
				link, float64(first.Bytes)/(link*1e6)*1e3)
		}
		fmt.Fprintf(stdout, "\n  %s\n\n", linkDesc)
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "overlap\tstep ms\tcompute ms\tcomm ms\texposed ms\texposed/comm\tmedian exposed ms\tsamples/s\tcpu %\tcompute/exposed by rank\t")
		best := make([]run, len(cfgs))
		medExp := make([]float64, len(cfgs))
		for i, c := range cfgs {
			best[i], _ = bestAndMedian(runs[i], o.oBatch)
			m := best[i]
			var exps []float64
			for _, r := range runs[i] {
				exps = append(exps, r.mean(func(o outcome) float64 { return o.Exposed }))
			}
			slices.Sort(exps)
			medExp[i] = exps[len(exps)/2]
			comm := m.mean(func(o outcome) float64 { return o.Comm })
			exp := m.mean(func(o outcome) float64 { return o.Exposed })
			var byRank []string
			for _, ro := range m {
				byRank = append(byRank, fmt.Sprintf("%.0f/%.0f", ro.perStep(ro.Compute), ro.perStep(ro.Exposed)))
			}
			fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%.1f\t%.2f\t%.1f\t%.0f\t%.0f\t%s\t\n", c.label, m.stepMs(),
				m.mean(func(o outcome) float64 { return o.Compute }), comm, exp, exp/comm, medExp[i], m.throughput(o.oBatch), m.cpuPct(),
				strings.Join(byRank, " "))
		}
		tw.Flush()
		eOn := best[0].mean(func(o outcome) float64 { return o.Exposed })
		eOff := best[1].mean(func(o outcome) float64 { return o.Exposed })
		fmt.Fprintf(stdout, "\n  exposed comm, overlap on / off: %.2f (fastest runs), %.2f (medians); target <= 0.5; step time on / off: %.2f\n",
			eOn/eOff, medExp[0]/medExp[1], best[0].stepMs()/best[1].stepMs())
	}
	return nil
}

// startRanks runs j on world rank processes (this program, re-executed
// through package launch, GOMAXPROCS=procs each, bound to one CPU each
// with bind) and returns their outcomes
// in rank order. If a rank fails the others are stopped. The ranks' stderr
// goes to stderr, prefixed by rank.
func startRanks(ctx context.Context, world, procs int, bind bool, j job, stderr io.Writer) (run, error) {
	specs := make([]string, world)
	for r := range world {
		jr := j
		if jr.CPUProfile != "" {
			jr.CPUProfile = fmt.Sprintf("%s-rank%d.pprof", j.CPUProfile, r)
			if o := os.Getenv("GDIST_BENCH_TRACE"); o == "1" {
				jr.Trace = fmt.Sprintf("%s-rank%d.trace", j.CPUProfile, r)
			}
		}
		spec, err := json.Marshal(jr)
		if err != nil {
			return nil, err
		}
		specs[r] = string(spec)
	}
	outs, err := benchutil.RunRanks[outcome](ctx, launch.Job{Spec: launch.Spec{NProc: world}, Procs: procs, Bind: bind,
		RankEnv: func(r int) []string { return []string{envJob + "=" + specs[r]} }}, stderr)
	return run(outs), err
}

// smallThreshold is the -small flag for a job: nil for the default.
func (o options) smallThreshold() *int {
	if o.small < 0 {
		return nil
	}
	return &o.small
}

// rankMain is a rank: it joins the job described by the environment, runs
// the job in spec and prints its outcome.
func rankMain(ctx context.Context, spec string, stdout io.Writer) error {
	var j job
	if err := json.Unmarshal([]byte(spec), &j); err != nil {
		return fmt.Errorf("%s: %w", envJob, err)
	}
	rank, err1 := strconv.Atoi(os.Getenv("RANK"))
	world, err2 := strconv.Atoi(os.Getenv("WORLD_SIZE"))
	if err := errors.Join(err1, err2); err != nil {
		return fmt.Errorf("RANK and WORLD_SIZE: %w", err)
	}
	var gopts []dist.Option
	if j.Small != nil {
		gopts = append(gopts, dist.WithSmallThreshold(*j.Small))
	}
	if j.Transport == "" {
		j.Transport = "tcp"
	}
	if world > 1 && j.LinkMBps == 0 {
		// The product path: gdist.InitFromEnv with GDIST_TRANSPORT set to tcp,
		// shm or auto.
		if err := os.Setenv(gdist.EnvTransport, j.Transport); err != nil {
			return err
		}
		jctx, cancel := context.WithTimeout(ctx, time.Minute)
		pg, err := gdist.InitFromEnv(jctx, gdist.WithGroupOptions(gopts...), gdist.WithTCPOptions(tcp.WithSocketBuffer(j.SocketBuffer)))
		cancel()
		if err != nil {
			return err
		}
		return runAndClose(ctx, pg, j, stdout)
	}
	// One rank, or a TCP link limited by a token bucket (the overlap part).
	if j.LinkMBps > 0 && j.Transport != "tcp" {
		return fmt.Errorf("-transport %s cannot be combined with a link limit (tcp only)", j.Transport)
	}
	var t transport.Transport
	if world == 1 {
		ls, err := transport.NewLocal(1)
		if err != nil {
			return err
		}
		t = ls[0]
	} else {
		jctx, cancel := context.WithTimeout(ctx, time.Minute)
		tt, err := tcp.Rendezvous(jctx, rank, world, net.JoinHostPort(os.Getenv("MASTER_ADDR"), os.Getenv("MASTER_PORT")),
			tcp.WithToken([]byte(os.Getenv("GDIST_TOKEN"))), tcp.WithSocketBuffer(j.SocketBuffer))
		cancel()
		if err != nil {
			return err
		}
		t = tt
	}
	if j.LinkMBps > 0 {
		lt, err := limit(t, j.LinkMBps*1e6)
		if err != nil {
			t.Close()
			return err
		}
		t = lt
	}
	pg, err := dist.New(t, gopts...)
	if err != nil {
		t.Close()
		return err
	}
	return runAndClose(ctx, pg, j, stdout)
}

// runAndClose is runAndReport, then pg.Close, whose error is reported too.
func runAndClose(ctx context.Context, pg *dist.ProcessGroup, j job, stdout io.Writer) (err error) {
	defer cli.Close(&err, pg)
	return runAndReport(ctx, pg, j, stdout)
}

// runAndReport runs j on pg and prints this rank's outcome.
func runAndReport(ctx context.Context, pg *dist.ProcessGroup, j job, stdout io.Writer) error {
	o, err := runJob(ctx, pg, j)
	if err != nil {
		return err
	}
	o.Procs = runtime.GOMAXPROCS(0)
	o.Transport = fmt.Sprintf("%T", pg.Transport())
	if v, ok := pg.Transport().(interface{ Summary() string }); ok {
		o.Transport = j.Transport + ": " + v.Summary()
	}
	if lt, ok := pg.Transport().(*limited); ok {
		o.Transport = fmt.Sprintf("%T over %T", lt, lt.Transport)
	}
	// A last barrier so that no rank closes its links while a peer still
	// measures.
	if err := pg.Barrier(ctx); err != nil {
		return err
	}
	return benchutil.Report(stdout, o)
}
