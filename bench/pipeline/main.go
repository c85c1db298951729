// Command pipeline measures pipeline-parallel throughput: samples per second
// of every schedule against the number of micro-batches m for 1, 2 (and 4)
// stages, each stage a separate OS process with GOMAXPROCS=1, next to plain
// Gorgonia (the whole model and batch in one graph, one process) measured
// in the same job; the bubble each stage measures next to the schedule's
// formula and to a simulation of the schedule with the measured pass
// times (pipeline.Predict); and the number of micro-batches it recommends.
//
// The model is an MLP of equal square layers (tanh) with an MSE loss, so
// every stage does the same work. The machine may be shared, so the whole
// sweep runs in rounds (-rounds), one job per number of stages in each,
// the jobs' order alternating; every figure is the median over the rounds,
// and every ratio the median of the ratios paired within a round. Within a
// job, the schedules of one m take turns: -repeat timed windows of each,
// interleaved, and each keeps its fastest window (the one whose slowest
// rank was the fastest), so that schedules compared with each other ran
// under the same load.
//
// Columns: samples/s; /plain, the ratio to plain Gorgonia measured at the
// start of the same job (rank 0 alone, the others waiting); /ideal, the
// ratio to p x the one-stage throughput at the same m in the same round;
// bubble, the mean over stages of the measured idle fraction (wall time of
// the calls minus the time the stage computed, over the wall time);
// formula, the schedule's textbook bubble — (p-1)/(m+p-1) for GPipe and
// 1F1B, (p-1)/(vm+p-1) interleaved, (p-1)/(3m+p-1) for ZB-H1 with equal
// pass times — and sim, the bubble of the schedule simulated with the pass
// times the stages measured; mem MB, the live heap rank 0's pipeline holds
// (its graphs and their values); CPU time / wall time per stage (below 1
// when a process did not get a whole core). Consecutive Infer calls overlap
// (stage 0 starts the next batch while the last stage finishes this one),
// so for inference GPipe's bubble is an upper bound.
//
// Inference on p stages is also given against one stage (paired per
// round), next to a control measured in the same p-stage job at each m,
// its windows taking turns with inference's: the whole model on one
// stage, on rank 0 alone (the others waiting) and on every rank at once,
// each rank in a group of its own. The ratio of the two is what the
// machine gives p processes at once at that moment, which bounds what p
// stages can gain over one; inference over the control's processes at
// once is the part of that the pipeline keeps.
//
// # Usage
//
//	go run ./bench/pipeline                        # p = 1, 2; m = 1..32; every schedule; 5 rounds
//	go run ./bench/pipeline -stages 1,2 -micro 4,8,16 -modes 1f1b,zb-h1 -rounds 9
//	go run ./bench/pipeline -stages 2 -micro 8 -modes 1f1b -rounds 1 -timeline out/pl.json
//
// The command starts its own ranks (itself, with -worker) through
// internal/launch; they meet with gdist.InitFromEnv, so on one host the
// stages talk over shared memory. Under gdistrun, run the workers directly:
//
//	GOMAXPROCS=1 gdistrun -n 2 -- go run ./bench/pipeline -worker
//
// Every job also measures, between ranks 0 and 1, one activation message
// (-comm-bytes, 128 KiB by default) each way over a plain TCP connection
// between the same processes and over dist point-to-point messages
// (Send and RecvInto, as the stages use them).
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
	"runtime/pprof"
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
	worker     bool
	stages     []int
	micro      []int
	modes      []string
	chunks     int
	layers     int
	width      int
	batch      int
	steps      int
	warmup     int
	repeat     int
	rounds     int
	commBytes  int
	trace      bool
	dtype      string
	timeline   string
	cpuprofile string
}

// sizes are the MLP's widths: o.layers square layers of width o.width.
func (o options) sizes() []int {
	s := make([]int, o.layers+1)
	for i := range s {
		s[i] = o.width
	}
	return s
}

// modes the bench knows: the schedules, GPipe with recomputation, and
// inference.
var knownModes = []string{"gpipe", "1f1b", "zb-h1", "interleaved", "recompute", "infer"}

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
	MemMB float64 `json:"mem"`   // live heap the pipeline holds after warm-up, MB
	Steps int     `json:"steps"`
	Batch int     `json:"batch"`
	// Mean pass durations (seconds) over the timed steps: forward,
	// backward (or input gradient), weights, the last stage's
	// forward+backward.
	F, B, W, FB float64
}

// commResult is the activation baseline measured between ranks 0 and 1.
type commResult struct {
	P       int     `json:"p"`
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
		if err := worker(ctx, o, stdout); err != nil {
			return fmt.Errorf("worker: %w", err)
		}
		return nil
	}
	return sweep(ctx, o, stdout, stderr)
}

func parseFlags(fs *flag.FlagSet, args []string) (options, error) {
	var o options
	fs.BoolVar(&o.worker, "worker", false, "run as one rank (RANK, WORLD_SIZE, ... from the environment)")
	stages := fs.String("stages", "1,2", "numbers of stages to measure")
	micro := fs.String("micro", "1,2,4,8,16,32", "numbers of micro-batches to measure")
	modes := fs.String("modes", "gpipe,1f1b,zb-h1,interleaved,infer", "schedules: gpipe, 1f1b, zb-h1, interleaved (-chunks per rank), recompute (GPipe with re-materialisation), infer")
	fs.IntVar(&o.chunks, "chunks", 2, "chunks (virtual stages) per rank of the interleaved schedule")
	fs.IntVar(&o.layers, "layers", 8, "MLP layers (divisible by every number of stages, and by stages x chunks for interleaved)")
	fs.IntVar(&o.width, "width", 256, "MLP width")
	fs.IntVar(&o.batch, "batch", 128, "samples per step (divisible by every number of micro-batches)")
	fs.IntVar(&o.steps, "steps", 6, "timed steps per configuration and round")
	fs.IntVar(&o.warmup, "warmup", 2, "untimed steps per configuration and round")
	fs.IntVar(&o.repeat, "repeat", 3, "timed windows of -steps steps per configuration and round, interleaved across the schedules of one m; the fastest is kept")
	fs.IntVar(&o.rounds, "rounds", 5, "rounds: every job of the sweep once per round, in alternating order; figures are medians over rounds")
	fs.IntVar(&o.commBytes, "comm-bytes", 128<<10, "size of the activation message of the point-to-point baseline")
	fs.StringVar(&o.dtype, "dtype", "float32", "float32 or float64")
	fs.BoolVar(&o.trace, "trace", false, "print every rank's compute intervals of its last timed step")
	fs.StringVar(&o.timeline, "timeline", "", "write each rank's timeline (dist.WithTimeline) of the last round's jobs to this path ({rank} and {p} are replaced)")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write each worker's CPU profile of the last round to this path ({rank} and {p} are replaced)")
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
	for _, m := range o.modes {
		if !slices.Contains(knownModes, m) {
			return o, cli.Usagef(fs, errUsage, "-modes: unknown mode %q (want some of %s)", m, strings.Join(knownModes, ","))
		}
	}
	for _, m := range o.micro {
		if o.batch%m != 0 {
			return o, cli.Usagef(fs, errUsage, "batch %d is not divisible by %d micro-batches", o.batch, m)
		}
	}
	for _, p := range o.stages {
		if o.layers%p != 0 {
			return o, cli.Usagef(fs, errUsage, "%d layers do not split into %d equal stages", o.layers, p)
		}
	}
	if o.dtype != "float32" && o.dtype != "float64" {
		return o, cli.Usagef(fs, errUsage, "-dtype %q: want float32 or float64", o.dtype)
	}
	if o.chunks < 2 || o.rounds < 1 || o.steps < 1 || o.warmup < 0 || o.repeat < 1 || o.commBytes < 1 {
		return o, cli.Usagef(fs, errUsage, "need -chunks >= 2, -rounds, -steps, -repeat, -comm-bytes >= 1 and -warmup >= 0")
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

// fits reports whether mode can run p stages of o's model at m
// micro-batches, and why not.
func fits(o options, mode string, p, m int) (bool, string) {
	if mode == "interleaved" {
		if o.layers%(p*o.chunks) != 0 {
			return false, fmt.Sprintf("%d layers do not split into %d x %d virtual stages", o.layers, p, o.chunks)
		}
		if m%p != 0 {
			return false, fmt.Sprintf("m = %d is not a multiple of %d stages", m, p)
		}
	}
	return true, ""
}

// ---- orchestrator ----

// key names a configuration.
type key struct {
	mode string
	p, m int
}

// round holds one round's results.
type round struct {
	res   map[key][]result // every rank's
	plain map[int]float64  // samples/s of plain Gorgonia, by the p of the job that measured it
	comm  map[int]commResult
}

func sweep(ctx context.Context, o options, stdout, stderr io.Writer) error {
	fmt.Fprintf(stdout, "# pipeline bench: MLP %d x %d %s (tanh, MSE), batch %d, %d timed steps (+%d warm-up) per configuration, %d rounds, GOMAXPROCS=1 per rank, %d CPUs; load %s\n",
		o.layers, o.width, o.dtype, o.batch, o.steps, o.warmup, o.rounds, runtime.NumCPU(), loadavg())
	var rounds []round
	for r := range o.rounds {
		rd := round{res: map[key][]result{}, plain: map[int]float64{}, comm: map[int]commResult{}}
		order := slices.Clone(o.stages)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, p := range order {
			rs, cs, err := startWorkers(ctx, o, p, r == o.rounds-1, stderr)
			if err != nil {
				return fmt.Errorf("round %d, %d stages: %w", r+1, p, err)
			}
			for _, x := range rs {
				if x.Mode == "plain" {
					rd.plain[p] = float64(x.Steps*x.Batch) / x.Wall
					continue
				}
				k := key{x.Mode, x.P, x.M}
				rd.res[k] = append(rd.res[k], x)
			}
			for _, c := range cs {
				rd.comm[c.P] = c
			}
		}
		rounds = append(rounds, rd)
		fmt.Fprintf(stderr, "pipeline: round %d of %d done (load %s)\n", r+1, o.rounds, loadavg())
	}
	report(stdout, o, rounds)
	fmt.Fprintf(stdout, "# load at the end: %s\n", loadavg())
	return nil
}

// loadavg returns the first three fields of /proc/loadavg, or "?".
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if f := strings.Fields(string(b)); len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "?"
}

func median(v []float64) float64 {
	v = slices.DeleteFunc(slices.Clone(v), math.IsNaN)
	if len(v) == 0 {
		return math.NaN()
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// tput returns the samples/s of a configuration in one round: the slowest
// rank's.
func tput(rs []result) float64 {
	if len(rs) == 0 {
		return math.NaN()
	}
	wall := 0.0
	for _, r := range rs {
		wall = max(wall, r.Wall)
	}
	return float64(rs[0].Steps*rs[0].Batch) / wall
}

// schedule returns the pipeline schedule of a training mode.
func schedule(mode string) (pipeline.Schedule, bool) {
	switch mode {
	case "recompute":
		return pipeline.GPipe, true
	case "infer":
		return pipeline.GPipe, false
	}
	s, err := pipeline.ParseSchedule(mode)
	return s, err == nil
}

// formula returns the textbook bubble of mode on p stages at m.
func formula(o options, mode string, p, m int) float64 {
	P, M := float64(p), float64(m)
	switch mode {
	case "interleaved":
		return (P - 1) / (float64(o.chunks)*M + P - 1)
	case "zb-h1":
		return (P - 1) / (3*M + P - 1)
	}
	return (P - 1) / (M + P - 1)
}

// simulated returns the bubble pipeline.Predict gives mode on p stages at
// m with the pass times the ranks measured (NaN for inference).
func simulated(o options, mode string, p, m int, rs []result) float64 {
	s, ok := schedule(mode)
	if !ok || mode == "infer" || len(rs) == 0 {
		return math.NaN()
	}
	var c pipeline.PassCosts
	sec := func(x float64) time.Duration { return time.Duration(x * 1e9) }
	for _, r := range rs {
		c.Forward = max(c.Forward, sec(r.F))
		c.Backward = max(c.Backward, sec(r.B))
		c.Weights = max(c.Weights, sec(r.W))
		c.ForwardBackward = max(c.ForwardBackward, sec(r.FB))
	}
	v := 1
	if mode == "interleaved" {
		v = o.chunks
	}
	pr, err := pipeline.Predict(s, p, v, m, c)
	if err != nil {
		return math.NaN()
	}
	return pr.Bubble
}

// report prints one table per mode, then the recommendation.
func report(w io.Writer, o options, rounds []round) {
	for _, p := range o.stages {
		var raw, dp []float64
		for _, rd := range rounds {
			if c, ok := rd.comm[p]; ok {
				raw, dp = append(raw, c.RawUS), append(dp, c.DistUS)
			}
		}
		if len(raw) > 0 {
			ratios := make([]float64, len(raw))
			for i := range raw {
				ratios[i] = dp[i] / raw[i]
			}
			fmt.Fprintf(w, "# p=%d: one activation (%d B) between ranks 0 and 1, one way: raw TCP %.1f us, dist p2p %.1f us: %.2fx raw (median over rounds of the paired ratio; range %.2f-%.2f)\n",
				p, o.commBytes, median(raw), median(dp), median(ratios), slices.Min(ratios), slices.Max(ratios))
		}
	}
	var plains []float64
	for _, rd := range rounds {
		for _, p := range o.stages {
			plains = append(plains, rd.plain[p])
		}
	}
	fmt.Fprintf(w, "# plain Gorgonia, whole model and batch in one graph, one process: %.1f samples/s (median of every job's)\n", median(plains))
	type best struct {
		mode string
		m    int
		tput float64
		vs   float64
	}
	bests := map[int]best{}
	for _, mode := range o.modes {
		fmt.Fprintf(w, "\n## %s\n", mode)
		fmt.Fprintf(w, "%3s %3s %10s %7s %7s %8s %8s %8s %7s  %-22s %s\n",
			"p", "m", "samples/s", "/plain", "/ideal", "bubble", "formula", "sim", "mem MB", "idle fraction per stage", "cpu/wall per stage")
		minOver := math.Inf(1)
		for _, p := range o.stages {
			for _, m := range o.micro {
				k := key{mode, p, m}
				var tp, vsPlain, vsIdeal, bub, simb, mem []float64
				idle := make([][]float64, p)
				cpu := make([][]float64, p)
				for _, rd := range rounds {
					rs := rd.res[k]
					if len(rs) != p {
						continue
					}
					t := tput(rs)
					tp = append(tp, t)
					vsPlain = append(vsPlain, t/rd.plain[p])
					one := tput(rd.res[key{mode, 1, m}])
					vsIdeal = append(vsIdeal, t/(float64(p)*one*(1-formula(o, mode, p, m))))
					mean := 0.0
					for _, r := range rs {
						f := 1 - r.Busy/r.Calls
						idle[r.Rank] = append(idle[r.Rank], f)
						cpu[r.Rank] = append(cpu[r.Rank], r.CPU/r.Wall)
						mean += f / float64(p)
						if r.Rank == 0 {
							mem = append(mem, r.MemMB)
						}
					}
					bub = append(bub, mean)
					simb = append(simb, simulated(o, mode, p, m, rs))
				}
				if len(tp) == 0 {
					continue
				}
				is, cs := make([]string, p), make([]string, p)
				for i := range p {
					is[i], cs[i] = fmt.Sprintf("%.3f", median(idle[i])), fmt.Sprintf("%.2f", median(cpu[i]))
				}
				t, vp := median(tp), median(vsPlain)
				sim := "-"
				if x := median(simb); !math.IsNaN(x) {
					sim = fmt.Sprintf("%.3f", x)
				}
				fmt.Fprintf(w, "%3d %3d %10.1f %6.2fx %6.2fx %8.3f %8.3f %8s %7.1f  %-22s %s\n",
					p, m, t, vp, median(vsIdeal), median(bub), formula(o, mode, p, m), sim, median(mem),
					strings.Join(is, " "), strings.Join(cs, " "))
				if p > 1 && mode != "infer" {
					if b := bests[p]; vp > b.vs {
						bests[p] = best{mode, m, t, vp}
					}
					if m >= 4 && m <= 32 {
						minOver = min(minOver, vp)
					}
				}
			}
		}
		if !math.IsInf(minOver, 1) {
			fmt.Fprintf(w, "# %s: lowest /plain over m in 4..32: %.2fx\n", mode, minOver)
		}
	}
	for _, p := range o.stages {
		if p == 1 {
			continue
		}
		of := func(mode string, p, n int) func(int) (key, int) {
			return func(m int) (key, int) { return key{mode, p, m}, n }
		}
		if slices.Contains(o.modes, "gpipe") && slices.Contains(o.modes, "1f1b") {
			fmt.Fprintf(w, "\n# p=%d: 1F1B / GPipe (median of paired rounds): %s\n", p,
				pairedRatios(o, rounds, of("1f1b", p, p), of("gpipe", p, p)))
		}
		if slices.Contains(o.modes, "infer") && slices.Contains(o.stages, 1) {
			fmt.Fprintf(w, "# p=%d: inference / one stage (median of paired rounds): %s\n", p,
				pairedRatios(o, rounds, of("infer", p, p), of("infer", 1, 1)))
		}
		if c := pairedRatios(o, rounds, of("infer", p, p), of(soloAlone, p, 1)); c != "" {
			fmt.Fprintf(w, "# p=%d: inference / one stage alone in the same job (the control's; median of rounds): %s\n", p, c)
		}
		if c := pairedRatios(o, rounds, of(soloTogether, p, 1), of(soloAlone, p, 1)); c != "" {
			fmt.Fprintf(w, "# p=%d: control, %d one-stage processes at once / one alone, the ceiling of the line above (median of rounds): %s\n",
				p, p, c)
		}
		if c := pairedRatios(o, rounds, of("infer", p, p), of(soloTogether, p, 1)); c != "" {
			fmt.Fprintf(w, "# p=%d: inference / the control's %d processes at once, the part of the ceiling the pipeline keeps (median of rounds): %s\n",
				p, p, c)
		}
	}
	for _, p := range o.stages {
		if b, ok := bests[p]; ok {
			fmt.Fprintf(w, "# recommended for %d stages of this model and batch: %s with m = %d: %.1f samples/s, %.2fx plain Gorgonia\n",
				p, b.mode, b.m, b.tput, b.vs)
		}
	}
}

// pairedRatios gives, for every m, the median over the rounds of the
// throughput of num's results over den's in the same round (num and den
// give the key and the number of results a complete measurement has;
// rounds without both are left out), as "m=4 1.02x, m=8 ...".
func pairedRatios(o options, rounds []round, num, den func(m int) (key, int)) string {
	var parts []string
	for _, m := range o.micro {
		kn, nn := num(m)
		kd, nd := den(m)
		var r []float64
		for _, rd := range rounds {
			if a, b := rd.res[kn], rd.res[kd]; len(a) == nn && len(b) == nd {
				r = append(r, tput(a)/tput(b))
			}
		}
		if len(r) > 0 {
			parts = append(parts, fmt.Sprintf("m=%d %.2fx", m, median(r)))
		}
	}
	return strings.Join(parts, ", ")
}

// startWorkers runs p workers (this program with -worker, through package
// launch, GOMAXPROCS=1 each) and collects their result lines; their other
// output goes to stderr, prefixed by rank. last says whether this is the
// last round (which writes timelines and profiles when asked).
func startWorkers(ctx context.Context, o options, p int, last bool, stderr io.Writer) ([]result, []commResult, error) {
	args := []string{"-worker",
		"-micro", join(o.micro), "-modes", strings.Join(o.modes, ","), "-chunks", strconv.Itoa(o.chunks),
		"-layers", strconv.Itoa(o.layers), "-width", strconv.Itoa(o.width), "-batch", strconv.Itoa(o.batch),
		"-steps", strconv.Itoa(o.steps), "-warmup", strconv.Itoa(o.warmup), "-repeat", strconv.Itoa(o.repeat),
		"-comm-bytes", strconv.Itoa(o.commBytes), "-dtype", o.dtype, "-trace=" + strconv.FormatBool(o.trace)}
	var env []string
	if last {
		if o.timeline != "" {
			env = append(env, "GDIST_TIMELINE="+strings.ReplaceAll(o.timeline, "{p}", strconv.Itoa(p)))
		}
		if o.cpuprofile != "" {
			args = append(args, "-cpuprofile", strings.ReplaceAll(o.cpuprofile, "{p}", strconv.Itoa(p)))
		}
	}
	var (
		mu sync.Mutex
		rs []result
		cs []commResult
	)
	errs := launch.Synced(stderr)
	r, err := launch.Start(ctx, launch.Job{
		Spec:  launch.Spec{NProc: p},
		Args:  args,
		Env:   env,
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

func worker(ctx context.Context, o options, stdout io.Writer) (err error) {
	g, err := gdist.InitFromEnv(ctx)
	if err != nil {
		return err
	}
	defer cli.Close(&err, g)
	if o.cpuprofile != "" {
		f, err := os.Create(strings.ReplaceAll(o.cpuprofile, "{rank}", strconv.Itoa(g.Rank())))
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	emit := func(prefix string, v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(stdout, "%s %s\n", prefix, b)
	}
	p := g.WorldSize()
	if o.layers%p != 0 {
		return fmt.Errorf("%d layers do not split into %d equal stages", o.layers, p)
	}
	dt := tensor.Float32
	if o.dtype == "float64" {
		dt = tensor.Float64
	}
	if p > 1 {
		c, err := commBaseline(ctx, g, o.commBytes)
		if err != nil {
			return fmt.Errorf("comm baseline: %w", err)
		}
		if g.Rank() == 0 {
			emit("COMM", c)
		}
	}
	// Plain Gorgonia on rank 0, the others waiting.
	if g.Rank() == 0 {
		r, err := plain(ctx, o, dt)
		if err != nil {
			return fmt.Errorf("plain: %w", err)
		}
		r.P = p
		emit("RESULT", r)
	}
	if err := g.Barrier(ctx); err != nil {
		return err
	}
	var solo *dist.ProcessGroup
	if p > 1 && slices.Contains(o.modes, "infer") {
		if solo, err = g.Split(ctx, g.Rank(), 0); err != nil {
			return fmt.Errorf("group of one: %w", err)
		}
	}
	base := uint32(0x10000000)
	for _, m := range o.micro {
		var modes []string
		for _, mode := range o.modes {
			if ok, _ := fits(o, mode, p, m); ok {
				modes = append(modes, mode)
			}
		}
		if len(modes) == 0 {
			continue
		}
		rs, err := measure(ctx, g, solo, o, dt, modes, m, &base)
		if err != nil {
			return fmt.Errorf("m=%d: %w", m, err)
		}
		for _, r := range rs {
			emit("RESULT", r)
		}
	}
	return nil
}

// Modes of the control the jobs of more than one stage measure next to
// inference: the whole model on one stage (a group of one member), on
// rank 0 while the others wait, and on every rank at once. Their windows
// take turns with the schedules' (see measure); a control's result, on
// rank 0 only, has the Wall that gives its throughput: the window's for
// one rank alone, and for every rank at once the slowest rank's divided
// by the number of ranks (each ran the window's samples).
const (
	soloAlone    = "solo-alone"
	soloTogether = "solo-together"
)

// newPipeline builds this rank's part of the model for mode at m.
func newPipeline(ctx context.Context, g *dist.ProcessGroup, o options, dt tensor.Dtype, mode string, m int, tagBase uint32) (*pipeline.Pipeline, error) {
	p, rank := g.WorldSize(), g.Rank()
	rows := o.batch / m
	opts := []pipeline.Option{pipeline.WithMicroBatches(m), pipeline.WithLoss(pipelinetest.MSE), pipeline.WithTagBase(tagBase)}
	if mode == "infer" {
		opts = append(opts, pipeline.WithTraining(false))
	} else {
		opts = append(opts, pipeline.WithInference(false))
	}
	switch mode {
	case "recompute":
		opts = append(opts, pipeline.WithRecompute(true))
	case "1f1b", "zb-h1":
		s, _ := pipeline.ParseSchedule(mode)
		opts = append(opts, pipeline.WithSchedule(s))
	case "interleaved":
		per := o.layers / (p * o.chunks)
		return pipeline.NewInterleaved(ctx, g, o.chunks, func(gr *gorgonia.ExprGraph, vs int) (pipeline.Stage, error) {
			return pipelinetest.NewMLPStage(gr, o.sizes(), vs*per, (vs+1)*per, rows, dt), nil
		}, opts...)
	}
	per := o.layers / p
	return pipeline.New(ctx, g, func(gr *gorgonia.ExprGraph) (pipeline.Stage, error) {
		return pipelinetest.NewMLPStage(gr, o.sizes(), rank*per, (rank+1)*per, rows, dt), nil
	}, opts...)
}

// config is one configuration being measured: a pipeline built for one
// schedule at one m, and the fastest window measured so far.
type config struct {
	mode     string
	pl       *pipeline.Pipeline
	step     func() error
	waits    bool // this rank waits out the windows (a control on rank 0 alone)
	mem      float64
	best     result
	bestWall float64
}

// measure builds one pipeline per schedule in modes at m (tag ranges from
// *base on) and returns this rank's timings of each. The schedules' timed
// windows interleave (one window of each in turn, -repeat times, the
// first schedule rotating), so that they are compared under the same load;
// with solo (each rank's group of one) and inference among the modes, so
// do the control's windows of the whole model on one stage (soloAlone,
// soloTogether), so that inference is compared with them under the same
// load too;
// each keeps the window whose slowest rank was the fastest.
func measure(ctx context.Context, g, solo *dist.ProcessGroup, o options, dt tensor.Dtype, modes []string, m int, base *uint32) (rs []result, err error) {
	var ss []*config
	defer func() {
		for _, s := range ss {
			if cerr := s.pl.Close(); err == nil && cerr != nil {
				err = fmt.Errorf("%s: close: %w", s.mode, cerr)
			}
		}
	}()
	x, y := batchData(o.batch, o.width, dt)
	data := pipeline.Data{
		Input:  func(mb int, in *tensor.Dense) error { return copyRows(in, x, mb) },
		Target: func(mb int, t *tensor.Dense) error { return copyRows(t, y, mb) },
	}
	for _, mode := range modes {
		heap0 := liveHeap()
		pl, err := newPipeline(ctx, g, o, dt, mode, m, *base)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", mode, err)
		}
		if *base += pipeline.TagSpan; *base+pipeline.TagSpan > dist.TagReservedBase {
			*base = 0x10000000
		}
		s := &config{mode: mode, pl: pl, bestWall: math.Inf(1)}
		ss = append(ss, s)
		solver := gorgonia.NewVanillaSolver(gorgonia.WithLearnRate(1e-3))
		s.step = func() error {
			if mode == "infer" {
				return pl.Infer(ctx, data)
			}
			if _, err := pl.TrainStep(ctx, data); err != nil {
				return err
			}
			return solver.Step(gorgonia.NodesToValueGrads(pl.Learnables()))
		}
		for range o.warmup {
			if err := s.step(); err != nil {
				return nil, fmt.Errorf("%s: %w", mode, err)
			}
		}
		s.mem = (float64(liveHeap()) - float64(heap0)) / (1 << 20)
	}
	if ok, _ := fits(o, "infer", 1, m); solo != nil && ok && slices.Contains(modes, "infer") {
		for i, mode := range []string{soloAlone, soloTogether} {
			pl, err := newPipeline(ctx, solo, o, dt, "infer", m, 0x10000000+uint32(i)*pipeline.TagSpan)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", mode, err)
			}
			s := &config{mode: mode, pl: pl, bestWall: math.Inf(1), waits: mode == soloAlone && g.Rank() != 0}
			ss = append(ss, s)
			s.step = func() error { return pl.Infer(ctx, data) }
			if s.waits {
				continue
			}
			for range o.warmup {
				if err := s.step(); err != nil {
					return nil, fmt.Errorf("%s: %w", mode, err)
				}
			}
		}
	}
	for w := range o.repeat {
		for i := range ss {
			s := ss[(i+w)%len(ss)]
			if err := s.window(ctx, g, o, m); err != nil {
				return nil, fmt.Errorf("%s: %w", s.mode, err)
			}
		}
	}
	for _, s := range ss {
		switch {
		case s.mode == soloAlone || s.mode == soloTogether:
			if g.Rank() == 0 {
				r := result{Mode: s.mode, P: g.WorldSize(), M: m, Steps: o.steps, Batch: o.batch, Wall: s.bestWall}
				if s.mode == soloTogether {
					r.Wall /= float64(g.WorldSize())
				}
				rs = append(rs, r)
			}
			continue
		case o.trace:
			st := s.pl.Stats()
			var b strings.Builder
			for _, e := range st.Events {
				fmt.Fprintf(&b, " %s%d/%d[%.2f,%.2f]", e.Kind, e.MicroBatch, e.Stage, msOf(e.Start), msOf(e.End))
			}
			fmt.Fprintf(os.Stderr, "trace %s p=%d m=%d rank %d call [%.2f,%.2f] ms:%s\n", s.mode, g.WorldSize(), m, g.Rank(),
				msOf(st.Start), msOf(st.End), b.String())
		}
		rs = append(rs, s.best)
	}
	return rs, g.Barrier(ctx)
}

// window runs one timed window of -steps steps (none on a rank that
// waits) and keeps it if its slowest rank was faster than in the
// configuration's earlier windows.
func (s *config) window(ctx context.Context, g *dist.ProcessGroup, o options, m int) error {
	runtime.GC()
	if err := g.Barrier(ctx); err != nil {
		return err
	}
	r := result{Mode: s.mode, P: g.WorldSize(), M: m, Rank: g.Rank(), Steps: o.steps, Batch: o.batch, MemMB: s.mem}
	var events []pipeline.Event
	cpu0 := benchutil.CPUTime()
	start := time.Now()
	for i := 0; i < o.steps && !s.waits; i++ {
		if err := s.step(); err != nil {
			return err
		}
		st := s.pl.Stats()
		r.Calls += st.Wall().Seconds()
		r.Busy += st.Busy.Seconds()
		events = append(events, st.Events...)
	}
	r.Wall = time.Since(start).Seconds()
	r.CPU = (benchutil.CPUTime() - cpu0).Seconds()
	c := pipeline.Stats{Events: events}.Costs()
	r.F, r.B, r.W, r.FB = c.Forward.Seconds(), c.Backward.Seconds(), c.Weights.Seconds(), c.ForwardBackward.Seconds()
	slowest := []float64{r.Wall}
	if err := g.AllReduce(ctx, dist.F64(slowest), dist.Max); err != nil {
		return err
	}
	if slowest[0] < s.bestWall {
		s.best, s.bestWall = r, slowest[0]
	}
	return nil
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
// the pipeline, and returns it as mode "plain".
func plain(ctx context.Context, o options, dt tensor.Dtype) (result, error) {
	gr := gorgonia.NewGraph()
	st := pipelinetest.NewMLPStage(gr, o.sizes(), 0, o.layers, o.batch, dt)
	x, y := batchData(o.batch, o.width, dt)
	xn := gorgonia.NewMatrix(gr, dt, gorgonia.WithShape(o.batch, o.width), gorgonia.WithName("x"), gorgonia.WithValue(x))
	yn := gorgonia.NewMatrix(gr, dt, gorgonia.WithShape(o.batch, o.width), gorgonia.WithName("y"), gorgonia.WithValue(y))
	out, err := st.Forward(xn)
	if err != nil {
		return result{}, err
	}
	loss, err := pipelinetest.MSE(out, yn)
	if err != nil {
		return result{}, err
	}
	params := st.Learnables()
	if _, err := gorgonia.Grad(loss, params...); err != nil {
		return result{}, err
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
			return result{}, err
		}
	}
	best := math.Inf(1)
	for range o.repeat {
		runtime.GC()
		start := time.Now()
		for range o.steps {
			if err := step(); err != nil {
				return result{}, err
			}
		}
		best = min(best, time.Since(start).Seconds())
	}
	return result{Mode: "plain", P: 1, M: 1, Wall: best, Calls: best, Busy: best, Steps: o.steps, Batch: o.batch}, ctx.Err()
}

// tagAddr and tagPing are the baseline's tags.
const tagAddr, tagPing = 1, 2

// commBaseline measures, between ranks 0 and 1, the one-way time of one
// message of `bytes` bytes over a plain TCP connection (package rawtcp)
// and over dist point-to-point messages (Send, and RecvInto into a buffer,
// as a stage receives): half the median round trip.
func commBaseline(ctx context.Context, g *dist.ProcessGroup, bytes int) (commResult, error) {
	const rounds = 200
	rank := g.Rank()
	if rank > 1 {
		return commResult{}, g.Barrier(ctx)
	}
	peer := 1 - rank
	c, err := rawtcp.Connect(ctx, g, rank, peer, tagAddr)
	if err != nil {
		return commResult{}, err
	}
	defer c.Close()
	raw, err := c.PingPong(ctx, bytes, 20, rounds)
	if err != nil {
		return commResult{}, err
	}
	buf := make([]byte, bytes)
	dp := make([]time.Duration, 0, rounds)
	for i := range 20 + rounds {
		start := time.Now()
		if rank == 0 {
			if err := g.Send(ctx, peer, tagPing, buf); err != nil {
				return commResult{}, err
			}
		}
		n, err := g.RecvInto(ctx, peer, tagPing, buf)
		if err != nil {
			return commResult{}, err
		}
		if n != bytes {
			return commResult{}, errors.New("short message")
		}
		if rank == 1 {
			if err := g.Send(ctx, peer, tagPing, buf); err != nil {
				return commResult{}, err
			}
		}
		if i >= 20 {
			dp = append(dp, time.Since(start))
		}
	}
	res := commResult{P: g.WorldSize(), Bytes: bytes, RawUS: us(raw.Median) / 2, DistUS: us(rawtcp.Summarize(dp).Median) / 2, Samples: rounds}
	return res, g.Barrier(ctx)
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
