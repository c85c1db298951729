// Command pipeline measures pipeline-parallel throughput: samples per second
// against the number of micro-batches m for 1, 2 and 4 stages, each stage a
// separate OS process with GOMAXPROCS=1, and the bubble fraction each stage
// measures (idle time / wall time, from the pipeline's own timestamps) next
// to GPipe's (p-1)/(m+p-1).
//
// The model is an MLP of equal square layers (tanh) with an MSE loss, so
// every stage does the same work. The ideal throughput of p stages at m
// micro-batches is p x T1(m) x (1 - (p-1)/(m+p-1)), where T1(m) is the
// one-stage throughput at the same micro-batch size; the report prints the
// measured throughput as a ratio to it.
//
// Columns: samples/s of the run; T1(m), the one-stage throughput at the
// same m; ideal = p x T1(m) x (1 - GPipe); ratio = samples/s / ideal;
// bubble, the mean over stages of the measured idle fraction (wall time of
// the calls minus the time the stage computed, over the wall time); GPipe,
// (p-1)/(m+p-1); held MB, for training, the live heap of the first stage
// when it starts its last forward (the activations in flight) above its
// heap after the step; the idle fraction and CPU time / wall time of each
// stage (below 1 when a process did not get a whole core: the machine is
// shared, or there are more stages than cores). Consecutive Infer calls
// overlap (stage 0 starts the next batch while the last stage finishes
// this one), so for inference GPipe's bubble is an upper bound.
//
// # Usage
//
//	go run ./bench/pipeline                        # the sweep: p = 1, 2, 4; m = 1..16
//	go run ./bench/pipeline -stages 2 -micro 8,16 -modes gpipe,1f1b,recompute,infer
//
// The command starts its own ranks (itself, with -worker) over TCP on
// loopback. Under gdistrun, run the workers directly:
//
//	GOMAXPROCS=1 gdistrun -n 2 -- go run ./bench/pipeline -worker
//
// Each worker also measures a raw-socket baseline between ranks 0 and 1 —
// one activation message each way over a plain TCP connection between the
// same processes — and the same over dist point-to-point messages, so the
// cost of moving a micro-batch between stages can be compared with its
// compute time.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist"
	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/pipeline"
	"github.com/gdist/gdist/dist/pipeline/pipelinetest"
	"github.com/gdist/gdist/internal/benchutil"
	"github.com/gdist/gdist/internal/cli"
	"github.com/gdist/gdist/internal/launch"
	"github.com/gdist/gdist/internal/rawtcp"
)

type options struct {
	worker bool
	stages []int
	micro  []int
	modes  []string
	layers int
	width  int
	batch  int
	steps  int
	warmup int
	repeat int
	trace  bool
	dtype  string
}

// sizes are the MLP's widths: o.layers square layers of width o.width.
func (o options) sizes() []int {
	s := make([]int, o.layers+1)
	for i := range s {
		s[i] = o.width
	}
	return s
}

// result is what a worker reports for one (mode, m), one line per rank.
type result struct {
	Mode  string  `json:"mode"`
	P     int     `json:"p"`
	M     int     `json:"m"`
	Rank  int     `json:"rank"`
	Wall  float64 `json:"wall"`  // seconds for the timed steps
	Calls float64 `json:"calls"` // sum of the calls' wall time
	Busy  float64 `json:"busy"`  // sum of the calls' busy time
	CPU   float64 `json:"cpu"`   // CPU seconds the process used during the timed steps
	Held  float64 `json:"held"`  // first stage, training: live heap (MB) when the last forward starts, above the heap after the step
	Steps int     `json:"steps"`
	Batch int     `json:"batch"`
}

// commResult is the baseline measured between ranks 0 and 1.
type commResult struct {
	Bytes   int     `json:"bytes"`
	RawUS   float64 `json:"raw_us"`  // one-way time of one activation over a plain TCP socket
	DistUS  float64 `json:"dist_us"` // the same over dist point-to-point messages
	Samples int     `json:"samples"`
}

// errUsage reports bad command-line arguments (already printed).
var errUsage = errors.New("pipeline: usage")

func main() { cli.Main("pipeline", errUsage, run) }

// run is the program: the sweep, which starts the workers, or with -worker
// one rank.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("pipeline", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if o.worker {
		if err := worker(ctx, o); err != nil {
			return fmt.Errorf("worker: %w", err)
		}
		return nil
	}
	return sweep(ctx, o, stdout, stderr)
}

func parseFlags(fs *flag.FlagSet, args []string) (options, error) {
	var o options
	fs.BoolVar(&o.worker, "worker", false, "run as one rank (RANK, WORLD_SIZE, ... from the environment)")
	stages := fs.String("stages", "1,2,4", "numbers of stages to measure")
	micro := fs.String("micro", "1,2,4,8,16", "numbers of micro-batches to measure")
	modes := fs.String("modes", "gpipe,infer", "schedules: gpipe, 1f1b, recompute (GPipe with re-materialisation), infer")
	fs.IntVar(&o.layers, "layers", 8, "MLP layers (divisible by every number of stages)")
	fs.IntVar(&o.width, "width", 256, "MLP width")
	fs.IntVar(&o.batch, "batch", 128, "samples per step (divisible by every number of micro-batches)")
	fs.IntVar(&o.steps, "steps", 6, "timed steps per configuration")
	fs.IntVar(&o.warmup, "warmup", 2, "untimed steps per configuration")
	fs.IntVar(&o.repeat, "repeat", 3, "timed windows of -steps steps per configuration; the fastest is reported (the machine may be shared)")
	fs.StringVar(&o.dtype, "dtype", "float32", "float32 or float64")
	fs.BoolVar(&o.trace, "trace", false, "print every rank's compute intervals of its last timed step")
	if err := cli.Parse(fs, args, errUsage); err != nil {
		return o, err
	}
	var err error
	if o.stages, err = ints(*stages); err != nil {
		return o, cli.Usagef(fs, errUsage, "-stages: %v", err)
	}
	if o.micro, err = ints(*micro); err != nil {
		return o, cli.Usagef(fs, errUsage, "-micro: %v", err)
	}
	o.modes = strings.Split(*modes, ",")
	for _, m := range o.micro {
		if o.batch%m != 0 {
			return o, cli.Usagef(fs, errUsage, "batch %d is not divisible by %d micro-batches", o.batch, m)
		}
	}
	if o.dtype != "float32" && o.dtype != "float64" {
		return o, cli.Usagef(fs, errUsage, "-dtype %q: want float32 or float64", o.dtype)
	}
	return o, nil
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad number %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// ---- orchestrator ----

func sweep(ctx context.Context, o options, stdout, stderr io.Writer) error {
	fmt.Fprintf(stdout, "# pipeline bench: MLP %d x %d %s (tanh, MSE), batch %d, %d timed steps (+%d warm-up), GOMAXPROCS=1 per rank, %d CPUs\n",
		o.layers, o.width, o.dtype, o.batch, o.steps, o.warmup, runtime.NumCPU())
	all := map[string][]result{} // mode -> results of every rank
	var comm []commResult
	for _, p := range o.stages {
		if o.layers%p != 0 {
			return fmt.Errorf("%d layers do not split into %d equal stages", o.layers, p)
		}
		rs, cs, err := startWorkers(ctx, o, p, stderr)
		if err != nil {
			return fmt.Errorf("%d stages: %w", p, err)
		}
		for _, r := range rs {
			all[r.Mode] = append(all[r.Mode], r)
		}
		comm = append(comm, cs...)
	}
	for _, c := range comm {
		fmt.Fprintf(stdout, "# one activation (%d B) between ranks 0 and 1, one way: raw TCP %.1f us, dist p2p %.1f us (%.2fx raw), median of %d round trips\n",
			c.Bytes, c.RawUS, c.DistUS, c.DistUS/c.RawUS, c.Samples)
	}
	if plain := all["plain"]; len(plain) > 0 {
		r := plain[0]
		fmt.Fprintf(stdout, "# plain Gorgonia, whole model and batch in one graph, one process: %.1f samples/s\n",
			float64(r.Steps*r.Batch)/r.Wall)
	}
	for _, mode := range o.modes {
		report(stdout, mode, all[mode], o)
	}
	return nil
}

// report prints one mode's table.
func report(w io.Writer, mode string, rs []result, o options) {
	type key struct{ p, m int }
	wall := map[key]float64{}
	held := map[key]float64{}
	busy := map[key][]float64{} // per-rank busy fraction
	cpu := map[key][]float64{}  // per-rank CPU time / wall time
	for _, r := range rs {
		k := key{r.P, r.M}
		wall[k] = math.Max(wall[k], r.Wall)
		if len(busy[k]) < r.P {
			busy[k] = make([]float64, r.P)
			cpu[k] = make([]float64, r.P)
		}
		busy[k][r.Rank] = r.Busy / r.Calls
		if r.Rank == 0 {
			held[k] = r.Held
		}
		cpu[k][r.Rank] = r.CPU / r.Wall
	}
	tput := func(k key) float64 { return float64(o.steps*o.batch) / wall[k] }
	fmt.Fprintf(w, "\n## %s\n", mode)
	fmt.Fprintf(w, "%3s %3s %12s %12s %12s %7s %9s %9s %8s  %-24s %s\n",
		"p", "m", "samples/s", "T1(m)", "ideal", "ratio", "bubble", "GPipe", "held MB", "idle fraction per stage", "cpu/wall per stage")
	for _, p := range o.stages {
		for _, m := range o.micro {
			k := key{p, m}
			if wall[k] == 0 {
				continue
			}
			theory := float64(p-1) / float64(m+p-1)
			idle := make([]string, p)
			cpus := make([]string, p)
			mean := 0.0
			for i, b := range busy[k] {
				idle[i] = fmt.Sprintf("%.3f", 1-b)
				cpus[i] = fmt.Sprintf("%.2f", cpu[k][i])
				mean += (1 - b) / float64(p)
			}
			t1, ideal, ratio := "-", "-", "-"
			if w1 := wall[key{1, m}]; w1 > 0 {
				base := tput(key{1, m})
				id := float64(p) * base * (1 - theory)
				t1, ideal, ratio = fmt.Sprintf("%.1f", base), fmt.Sprintf("%.1f", id), fmt.Sprintf("%.2f", tput(k)/id)
			}
			fmt.Fprintf(w, "%3d %3d %12.1f %12s %12s %7s %9.3f %9.3f %8.2f  %-24s %s\n",
				p, m, tput(k), t1, ideal, ratio, mean, theory, held[k], strings.Join(idle, " "), strings.Join(cpus, " "))
		}
	}
}

// startWorkers runs p workers (this program with -worker, through package
// launch, GOMAXPROCS=1 each) and collects their result lines; their other
// output goes to stderr, prefixed by rank.
func startWorkers(ctx context.Context, o options, p int, stderr io.Writer) ([]result, []commResult, error) {
	args := []string{"-worker",
		"-micro", join(o.micro), "-modes", strings.Join(o.modes, ","),
		"-layers", strconv.Itoa(o.layers), "-width", strconv.Itoa(o.width), "-batch", strconv.Itoa(o.batch),
		"-steps", strconv.Itoa(o.steps), "-warmup", strconv.Itoa(o.warmup), "-repeat", strconv.Itoa(o.repeat),
		"-dtype", o.dtype, "-trace=" + strconv.FormatBool(o.trace)}
	var (
		mu sync.Mutex
		rs []result
		cs []commResult
	)
	errs := launch.Synced(stderr)
	r, err := launch.Start(ctx, launch.Job{
		Spec:  launch.Spec{NProc: p},
		Args:  args,
		Procs: 1,
		Output: func(rank int) (io.Writer, io.Writer) {
			prefix := fmt.Sprintf("[p=%d rank %d] ", p, rank)
			other := launch.NewPrefixWriter(errs, prefix)
			stdout := launch.LineFunc(func(line string) {
				mu.Lock()
				defer mu.Unlock()
				if v, ok := strings.CutPrefix(line, "RESULT "); ok {
					var x result
					if json.Unmarshal([]byte(v), &x) == nil {
						rs = append(rs, x)
						return
					}
				}
				if v, ok := strings.CutPrefix(line, "COMM "); ok {
					var x commResult
					if json.Unmarshal([]byte(v), &x) == nil {
						cs = append(cs, x)
						return
					}
				}
				fmt.Fprintf(errs, "%s%s\n", prefix, line)
			})
			return stdout, other
		},
	})
	if err != nil {
		return nil, nil, err
	}
	err = r.Wait()
	mu.Lock()
	defer mu.Unlock()
	return rs, cs, err
}

func join(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

// ---- worker ----

func worker(ctx context.Context, o options) (err error) {
	g, err := gdist.InitFromEnv(ctx)
	if err != nil {
		return err
	}
	defer cli.Close(&err, g)
	p := g.WorldSize()
	if o.layers%p != 0 {
		return fmt.Errorf("%d layers do not split into %d equal stages", o.layers, p)
	}
	dt := tensor.Float32
	if o.dtype == "float64" {
		dt = tensor.Float64
	}
	if p > 1 {
		// The activation of the largest micro-batch measured.
		bytes := o.batch / slices.Min(o.micro) * o.width * int(dt.Size())
		if err := commBaseline(ctx, g, bytes); err != nil {
			return fmt.Errorf("comm baseline: %w", err)
		}
	}
	if p == 1 {
		if err := plain(ctx, o, dt); err != nil {
			return fmt.Errorf("plain: %w", err)
		}
	}
	base := uint32(0x10000000)
	for _, mode := range o.modes {
		for _, m := range o.micro {
			r, err := measure(ctx, g, o, dt, mode, m, base)
			if err != nil {
				return fmt.Errorf("%s m=%d: %w", mode, m, err)
			}
			base += pipeline.TagSpan
			emit("RESULT", r)
		}
	}
	return nil
}

func emit(prefix string, v any) {
	b, _ := json.Marshal(v)
	fmt.Printf("%s %s\n", prefix, b)
}

// measure runs one configuration and returns this rank's timings.
func measure(ctx context.Context, g *dist.ProcessGroup, o options, dt tensor.Dtype, mode string, m int, tagBase uint32) (result, error) {
	p, rank := g.WorldSize(), g.Rank()
	rows := o.batch / m
	per := o.layers / p
	build := func(gr *gorgonia.ExprGraph) (pipeline.Stage, error) {
		return pipelinetest.NewMLPStage(gr, o.sizes(), rank*per, (rank+1)*per, rows, dt), nil
	}
	opts := []pipeline.Option{pipeline.WithMicroBatches(m), pipeline.WithLoss(pipelinetest.MSE), pipeline.WithTagBase(tagBase)}
	switch mode {
	case "gpipe":
	case "1f1b":
		opts = append(opts, pipeline.WithSchedule(pipeline.OneFOneB))
	case "recompute":
		opts = append(opts, pipeline.WithRecompute(true))
	case "infer":
		opts = append(opts, pipeline.WithTraining(false))
	default:
		return result{}, fmt.Errorf("unknown mode %q", mode)
	}
	if mode != "infer" {
		opts = append(opts, pipeline.WithInference(false))
	}
	pl, err := pipeline.New(ctx, g, build, opts...)
	if err != nil {
		return result{}, err
	}
	defer pl.Close()
	x, y := batchData(o.batch, o.width, dt)
	data := pipeline.Data{
		Input:  func(mb int, in *tensor.Dense) error { return copyRows(in, x, mb) },
		Target: func(mb int, t *tensor.Dense) error { return copyRows(t, y, mb) },
	}
	solver := gorgonia.NewVanillaSolver(gorgonia.WithLearnRate(1e-3))
	step := func() error {
		if mode == "infer" {
			return pl.Infer(ctx, data)
		}
		if _, err := pl.TrainStep(ctx, data); err != nil {
			return err
		}
		return solver.Step(gorgonia.NodesToValueGrads(pl.Learnables()))
	}
	for range o.warmup {
		if err := step(); err != nil {
			return result{}, err
		}
	}
	// Timed windows; all ranks keep the window whose slowest rank was the
	// fastest (the machine may be shared with other work).
	var best result
	bestWall := math.Inf(1)
	for range max(o.repeat, 1) {
		runtime.GC()
		if err := g.Barrier(ctx); err != nil {
			return result{}, err
		}
		r := result{Mode: mode, P: p, M: m, Rank: rank, Steps: o.steps, Batch: o.batch}
		cpu0 := benchutil.CPUTime()
		start := time.Now()
		for range o.steps {
			if err := step(); err != nil {
				return result{}, err
			}
			st := pl.Stats()
			r.Calls += st.Wall().Seconds()
			r.Busy += st.Busy.Seconds()
		}
		r.Wall = time.Since(start).Seconds()
		r.CPU = (benchutil.CPUTime() - cpu0).Seconds()
		slowest := []float64{r.Wall}
		if err := g.AllReduce(ctx, dist.F64(slowest), dist.Max); err != nil {
			return result{}, err
		}
		if slowest[0] < bestWall {
			best, bestWall = r, slowest[0]
		}
	}
	if o.trace {
		st := pl.Stats()
		var b strings.Builder
		for _, e := range st.Events {
			fmt.Fprintf(&b, " %s%d[%.2f,%.2f]", e.Kind, e.MicroBatch, msOf(e.Start), msOf(e.End))
		}
		fmt.Fprintf(os.Stderr, "trace %s p=%d m=%d rank %d call [%.2f,%.2f] ms:%s\n", mode, p, m, rank,
			msOf(st.Start), msOf(st.End), b.String())
	}
	if mode != "infer" && pl.IsFirst() {
		// One more step, to see how much memory the activations in flight
		// hold when the first stage starts its last forward.
		var held uint64
		in := data.Input
		data.Input = func(mb int, t *tensor.Dense) error {
			if mb == m-1 {
				held = liveHeap()
			}
			return in(mb, t)
		}
		if err := step(); err != nil {
			return result{}, err
		}
		best.Held = (float64(held) - float64(liveHeap())) / (1 << 20)
	} else if mode != "infer" {
		if err := step(); err != nil {
			return result{}, err
		}
	}
	return best, g.Barrier(ctx)
}

// msOf returns t's milliseconds within its second of the Unix clock, so
// that traces of different processes line up.
func msOf(t time.Time) float64 { return float64(t.UnixNano()%1e9) / 1e6 }

// liveHeap returns the bytes of live heap objects after a collection.
func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// plain trains the whole model on the whole batch in one graph, without
// the pipeline, and reports it as mode "plain".
func plain(ctx context.Context, o options, dt tensor.Dtype) error {
	gr := gorgonia.NewGraph()
	st := pipelinetest.NewMLPStage(gr, o.sizes(), 0, o.layers, o.batch, dt)
	x, y := batchData(o.batch, o.width, dt)
	xn := gorgonia.NewMatrix(gr, dt, gorgonia.WithShape(o.batch, o.width), gorgonia.WithName("x"), gorgonia.WithValue(x))
	yn := gorgonia.NewMatrix(gr, dt, gorgonia.WithShape(o.batch, o.width), gorgonia.WithName("y"), gorgonia.WithValue(y))
	out, err := st.Forward(xn)
	if err != nil {
		return err
	}
	loss, err := pipelinetest.MSE(out, yn)
	if err != nil {
		return err
	}
	params := st.Learnables()
	if _, err := gorgonia.Grad(loss, params...); err != nil {
		return err
	}
	vm := gorgonia.NewTapeMachine(gr, gorgonia.BindDualValues(params...))
	defer vm.Close()
	solver := gorgonia.NewVanillaSolver(gorgonia.WithLearnRate(1e-3))
	step := func() error {
		if err := vm.RunAll(); err != nil {
			return err
		}
		vm.Reset()
		return solver.Step(gorgonia.NodesToValueGrads(params))
	}
	for range o.warmup {
		if err := step(); err != nil {
			return err
		}
	}
	runtime.GC()
	start := time.Now()
	for range o.steps {
		if err := step(); err != nil {
			return err
		}
	}
	w := time.Since(start).Seconds()
	emit("RESULT", result{Mode: "plain", P: 1, M: 1, Wall: w, Calls: w, Busy: w, Steps: o.steps, Batch: o.batch})
	return ctx.Err()
}

// tagAddr and tagPing are the baseline's tags.
const tagAddr, tagPing = 1, 2

// commBaseline measures, between ranks 0 and 1, the one-way time of one
// message of `bytes` bytes over a plain TCP connection (package rawtcp)
// and over dist point-to-point messages: half the median round trip. Rank
// 0 reports both.
func commBaseline(ctx context.Context, g *dist.ProcessGroup, bytes int) error {
	const rounds = 200
	rank := g.Rank()
	if rank > 1 {
		return g.Barrier(ctx)
	}
	peer := 1 - rank
	c, err := rawtcp.Connect(ctx, g, rank, peer, tagAddr)
	if err != nil {
		return err
	}
	defer c.Close()
	raw, err := c.PingPong(ctx, bytes, 0, rounds)
	if err != nil {
		return err
	}
	buf := make([]byte, bytes)
	dp := make([]time.Duration, 0, rounds)
	for range rounds {
		start := time.Now()
		if rank == 0 {
			if err := g.Send(ctx, peer, tagPing, buf); err != nil {
				return err
			}
		}
		b, err := g.Recv(ctx, peer, tagPing)
		if err != nil {
			return err
		}
		if len(b) != bytes {
			return errors.New("short message")
		}
		if rank == 1 {
			if err := g.Send(ctx, peer, tagPing, buf); err != nil {
				return err
			}
		}
		dp = append(dp, time.Since(start))
	}
	if rank == 0 {
		emit("COMM", commResult{Bytes: bytes, RawUS: us(raw.Median) / 2, DistUS: us(rawtcp.Summarize(dp).Median) / 2, Samples: rounds})
	}
	return g.Barrier(ctx)
}

// us returns d in microseconds.
func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// ---- model ----

// batchData returns a fixed batch of inputs and targets.
func batchData(batch, width int, dt tensor.Dtype) (x, y *tensor.Dense) {
	xs := make([]float64, batch*width)
	ys := make([]float64, batch*width)
	for i := range xs {
		xs[i] = math.Sin(0.11 * float64(i))
		ys[i] = math.Cos(0.07 * float64(i))
	}
	return pipelinetest.Dense(dt, []int{batch, width}, xs), pipelinetest.Dense(dt, []int{batch, width}, ys)
}

// copyRows copies micro-batch mb's rows of src into dst.
func copyRows(dst, src *tensor.Dense, mb int) error {
	switch d := dst.Data().(type) {
	case []float32:
		copy(d, src.Data().([]float32)[mb*len(d):])
	case []float64:
		copy(d, src.Data().([]float64)[mb*len(d):])
	default:
		return fmt.Errorf("data of type %T", d)
	}
	return nil
}
