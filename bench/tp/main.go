// Command tp measures tensor parallelism and KV-cache generation, paired
// and interleaved in one run, and prints each figure as a ratio to its
// one-process baseline measured alongside it:
//
//	go run ./bench/tp -part cache                                   # one process: KV cache vs recompute, context 256
//	go run ./cmd/gdistrun -n 2 -- go run ./bench/tp -part serve      # 8 prompts: 2-stage pipeline vs one process
//	go run ./cmd/gdistrun -n 2 -- go run ./bench/tp -part tpgen      # d_model 1024: TP=2 vs one process, per token
//	go run ./cmd/gdistrun -n 2 -- go run ./bench/tp -part tptrain    # d_model 1024: TP=2 vs one process, per step
//	go run ./cmd/gdistrun -n 2 -- go run ./bench/tp -part allreduce  # 4096 and 32768 floats
//
// Each repetition (-reps, medians reported) runs three things in turn:
// the baseline on rank 0 alone while the other ranks wait at a barrier;
// the control, the same baseline on every rank at once, as independent
// jobs (what the machine gives that many processes: on a quiet machine
// with a core per rank they take as long as one alone, on a loaded one
// longer); and the parallel run on every rank. Besides wall time it
// reports the CPU time each side used (for the parallel run, the most any
// rank used): CPU time says what the code costs, wall time what the
// machine gave it. The load average is printed before and after.
//
// tptrain records each TP step on the job's timeline (GDIST_TIMELINE; if
// unset, a file in the temporary directory) and reports the share of the
// step that the tensor-parallel group's collectives took, from the
// timeline's events; `gdisttimeline stats -window "tp step" FILES` prints
// the same table from the files.
//
// -cpuprofile writes each rank's CPU profile of the repetitions, -only
// base or -only par runs one side alone (for profiles).
//
// run.sh runs every part several times, with the load average before each:
//
//	sh bench/tp/run.sh 3
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gdist/gdist"
	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/parallel"
	"github.com/gdist/gdist/dist/timeline"
	"github.com/gdist/gdist/internal/benchutil"
	"github.com/gdist/gdist/models/transformer"
)

// opts are the command's flags.
var opts struct {
	reps    int
	tokens  int
	groups  int
	only    string
	profile string
}

func main() {
	part := flag.String("part", "cache", "cache, serve, tpgen, tptrain or allreduce")
	flag.IntVar(&opts.reps, "reps", 5, "interleaved repetitions (the median is reported)")
	flag.IntVar(&opts.tokens, "tokens", 64, "tokens generated per run")
	flag.IntVar(&opts.groups, "groups", 0, "serve: groups of requests in flight in the pipeline (0: one per stage)")
	flag.StringVar(&opts.only, "only", "", "run only the baseline (base) or only the parallel side (par), for profiles")
	flag.StringVar(&opts.profile, "cpuprofile", "", "write each rank's CPU profile of the repetitions here ({rank}: the rank)")
	flag.Parse()
	if opts.only != "" && opts.only != "base" && opts.only != "par" {
		log.Fatalf("-only %q: want base or par", opts.only)
	}
	if *part == "tptrain" && os.Getenv(gdist.EnvTimeline) == "" {
		os.Setenv(gdist.EnvTimeline, filepath.Join(os.TempDir(), "bench-tp-timeline.json"))
	}
	ctx := context.Background()
	pg, err := gdist.InitFromEnv(ctx)
	if err != nil {
		log.Fatal(err)
	}
	var out io.Writer = os.Stdout
	if pg.Rank() != 0 {
		out = io.Discard
	}
	fmt.Fprintf(out, "bench/tp %s: %d rank(s), %s, date %s\n", *part, pg.WorldSize(), transportNote(), time.Now().UTC().Format("2006-01-02"))
	switch *part {
	case "cache":
		err = benchCache(ctx, out)
	case "serve":
		err = benchServe(ctx, pg, out)
	case "tpgen":
		err = benchTPGen(ctx, pg, out)
	case "tptrain":
		err = benchTPTrain(ctx, pg, out)
	case "allreduce":
		err = benchAllReduce(ctx, pg, out)
	default:
		err = fmt.Errorf("unknown part %q", *part)
	}
	if cerr := pg.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		log.Fatal(err)
	}
}

func transportNote() string {
	if t := os.Getenv("GDIST_TRANSPORT"); t != "" {
		return "transport " + t
	}
	return "transport auto"
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// loadAvg returns the 1-minute load average, or "?".
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

func prompts(n, vocab, tokens int) []transformer.Request {
	rng := rand.New(rand.NewPCG(1, 2))
	var reqs []transformer.Request
	for i := range n {
		p := make([]int, 8)
		for j := range p {
			p[j] = rng.IntN(vocab)
		}
		reqs = append(reqs, transformer.Request{Prompt: p, N: tokens, Temperature: 0.8, Seed: uint64(i)})
	}
	return reqs
}

// side is the wall and CPU time of each repetition of one side.
type side struct{ wall, cpu []time.Duration }

func (s *side) add(wall, cpu time.Duration) {
	s.wall = append(s.wall, wall)
	s.cpu = append(s.cpu, cpu)
}

// result is what compare measured.
type result struct {
	n                  int  // ranks
	base, control, par side // control and par: the slowest rank's wall time, the most CPU time any rank used
	load0, load1       string
}

// comparison is one paired measurement: the baseline, which one process
// runs alone (and, for the control, every rank at once), and the parallel
// run on every rank.
type comparison struct {
	base, par func() error
}

// compare runs c reps times, interleaved (see the package documentation),
// on every rank.
func compare(ctx context.Context, pg *dist.ProcessGroup, c comparison) (*result, error) {
	r := &result{n: pg.WorldSize(), load0: loadAvg()}
	if opts.profile != "" {
		f, err := os.Create(strings.ReplaceAll(opts.profile, "{rank}", strconv.Itoa(pg.Rank())))
		if err != nil {
			return nil, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return nil, err
		}
		defer pprof.StopCPUProfile()
	}
	// timed runs f on every rank (or rank 0 alone) after a barrier and
	// returns the slowest rank's wall time and the most CPU time a rank
	// used.
	timed := func(f func() error, alone bool) (wall, cpu time.Duration, err error) {
		if err := pg.Barrier(ctx); err != nil {
			return 0, 0, err
		}
		if !alone || pg.Rank() == 0 {
			c0, t0 := benchutil.CPUTime(), time.Now()
			if err := f(); err != nil {
				return 0, 0, err
			}
			wall, cpu = time.Since(t0), benchutil.CPUTime()-c0
		}
		v := []float64{wall.Seconds(), cpu.Seconds()}
		if err := pg.AllReduce(ctx, dist.F64(v), dist.Max); err != nil {
			return 0, 0, err
		}
		return time.Duration(v[0] * 1e9), time.Duration(v[1] * 1e9), nil
	}
	for range opts.reps {
		if opts.only != "par" {
			wall, cpu, err := timed(c.base, true)
			if err != nil {
				return nil, err
			}
			r.base.add(wall, cpu)
		}
		if opts.only == "" && pg.WorldSize() > 1 {
			wall, cpu, err := timed(c.base, false)
			if err != nil {
				return nil, err
			}
			r.control.add(wall, cpu)
		}
		if opts.only != "base" {
			wall, cpu, err := timed(c.par, false)
			if err != nil {
				return nil, err
			}
			r.par.add(wall, cpu)
		}
	}
	r.load1 = loadAvg()
	return r, nil
}

// report prints r per unit of work (per is the number of units of a run,
// unit their name) on two lines: the baseline and the control, then the
// parallel run and its ratios.
func report(out io.Writer, r *result, name string, per float64, unit string) {
	ms := func(d time.Duration) float64 { return d.Seconds() * 1e3 / per }
	bw, bc := median(r.base.wall), median(r.base.cpu)
	fmt.Fprintf(out, "  one process: %.2f ms/%s (CPU %.2f)", ms(bw), unit, ms(bc))
	if len(r.control.wall) > 0 {
		cw := median(r.control.wall)
		fmt.Fprintf(out, "; %d processes at once, each the same work: %.2f ms/%s (%.2fx one alone: the machine gave %d processes %.2f processes' worth)",
			r.n, ms(cw), unit, cw.Seconds()/bw.Seconds(), r.n, float64(r.n)*bw.Seconds()/cw.Seconds())
	}
	fmt.Fprintln(out)
	pw, pc := median(r.par.wall), median(r.par.cpu)
	fmt.Fprintf(out, "  %s: %.2f ms/%s (CPU of the busiest rank %.2f): wall %.2fx one process, CPU %.2fx; load average %s -> %s\n",
		name, ms(pw), unit, ms(pc), pw.Seconds()/bw.Seconds(), pc.Seconds()/bc.Seconds(), r.load0, r.load1)
}

// benchCache: the example's default model at context 256, one prompt,
// tokens/s with the full recompute (Predictor) and with the KV cache.
func benchCache(ctx context.Context, out io.Writer) error {
	cfg := transformer.DefaultConfig(80)
	cfg.Ctx = 256
	n := min(opts.tokens*4, cfg.Ctx-8)
	pred, err := transformer.NewPredictor(cfg, nil)
	if err != nil {
		return err
	}
	defer pred.Close()
	dec, err := transformer.NewDecoder(cfg, 0, cfg.HeadLayer(), 1)
	if err != nil {
		return err
	}
	defer dec.Close()
	req := prompts(1, cfg.Vocab, n)[0]
	var full, cached []time.Duration
	for range opts.reps {
		t0 := time.Now()
		a, err := transformer.Generate(ctx, pred, req.Prompt, n, req.Temperature, req.Seed)
		if err != nil {
			return err
		}
		full = append(full, time.Since(t0))
		t0 = time.Now()
		b, err := transformer.Generate(ctx, dec, req.Prompt, n, req.Temperature, req.Seed)
		if err != nil {
			return err
		}
		cached = append(cached, time.Since(t0))
		if !slices.Equal(a, b) {
			return fmt.Errorf("the cache changed the tokens")
		}
	}
	tf, tc := float64(n)/median(full).Seconds(), float64(n)/median(cached).Seconds()
	fmt.Fprintf(out, "model %d params, ctx %d, prompt 8 + %d tokens, %s: recompute %.1f tokens/s, KV cache %.1f tokens/s, ratio %.1fx (tokens identical)\n",
		cfg.NumParams(), cfg.Ctx, n, cfg.Dtype, tf, tc, tc/tf)
	return nil
}

// wideConfig is the model whose matrix products dominate.
func wideConfig() transformer.Config {
	return transformer.Config{Vocab: 96, Ctx: 64, Dim: 1024, Heads: 16, Layers: 2, MLPHidden: 4096, Dtype: transformer.Float32, Seed: 1}
}

// generation compares transformer.GenerateBatch on one process with a
// parallel.Generator of layout l on every rank, serving reqs, and checks
// that they give the same tokens.
func generation(ctx context.Context, pg *dist.ProcessGroup, cfg transformer.Config, l parallel.Layout, reqs []transformer.Request) (*result, error) {
	// Every rank holds the one-process decoder, for the control.
	one, err := transformer.NewDecoder(cfg, 0, cfg.HeadLayer(), len(reqs))
	if err != nil {
		return nil, err
	}
	defer one.Close()
	var gopts []parallel.Option
	if opts.groups > 0 {
		gopts = append(gopts, parallel.WithGroups(opts.groups))
	}
	g, err := parallel.NewGenerator(ctx, pg, cfg, l, len(reqs), gopts...)
	if err != nil {
		return nil, err
	}
	defer g.Close()
	var want, got [][]int
	r, err := compare(ctx, pg, comparison{
		base: func() (err error) { want, err = transformer.GenerateBatch(ctx, one, reqs); return err },
		par:  func() (err error) { got, err = g.Generate(ctx, reqs); return err },
	})
	if err != nil {
		return nil, err
	}
	if pg.Rank() == 0 && opts.only == "" && fmt.Sprint(want) != fmt.Sprint(got) {
		return nil, fmt.Errorf("%v changed the tokens", l)
	}
	return r, nil
}

// benchServe: 8 prompts, one process (one pass of 8 rows per token) vs a
// pipeline over every rank with as many groups of requests in flight as
// stages.
func benchServe(ctx context.Context, pg *dist.ProcessGroup, out io.Writer) error {
	cfg := transformer.Config{Vocab: 96, Ctx: 128, Dim: 256, Heads: 4, Layers: 4, MLPHidden: 1024, Dtype: transformer.Float32, Seed: 1}
	reqs := prompts(8, cfg.Vocab, opts.tokens)
	n := pg.WorldSize()
	r, err := generation(ctx, pg, cfg, parallel.Layout{DP: 1, PP: n, TP: 1}, reqs)
	if err != nil {
		return err
	}
	total := float64(len(reqs) * opts.tokens)
	fmt.Fprintf(out, "model %d params (dim %d, %d layers, %s), 8 prompts x %d tokens: one process %.1f tokens/s, %d-stage pipeline %.1f tokens/s: %.2fx (tokens identical)\n",
		cfg.NumParams(), cfg.Dim, cfg.Layers, cfg.Dtype, opts.tokens, total/median(r.base.wall).Seconds(), n,
		total/median(r.par.wall).Seconds(), median(r.base.wall).Seconds()/median(r.par.wall).Seconds())
	report(out, r, fmt.Sprintf("%d-stage pipeline", n), total, "token")
	return nil
}

// benchTPGen: one prompt on the wide model, latency per token, one
// process vs TP over every rank.
func benchTPGen(ctx context.Context, pg *dist.ProcessGroup, out io.Writer) error {
	cfg := wideConfig()
	n := min(opts.tokens, cfg.Ctx-8)
	r, err := generation(ctx, pg, cfg, parallel.Layout{DP: 1, PP: 1, TP: pg.WorldSize()}, prompts(1, cfg.Vocab, n))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "model %d params (dim %d, %d layers, %s), prompt 8 + %d tokens, latency per token (tokens identical):\n",
		cfg.NumParams(), cfg.Dim, cfg.Layers, cfg.Dtype, n)
	report(out, r, fmt.Sprintf("TP=%d", pg.WorldSize()), float64(n), "token")
	return nil
}

// benchTPTrain: training steps of the wide model, one process vs TP over
// every rank, and the share of the TP step the tensor-parallel group's
// collectives took, from the timeline.
func benchTPTrain(ctx context.Context, pg *dist.ProcessGroup, out io.Writer) error {
	cfg := wideConfig()
	cfg.Ctx = 32
	const batch = 2
	one, err := transformer.NewTrainer(cfg, batch) // on every rank, for the control
	if err != nil {
		return err
	}
	defer one.Close()
	tr, err := parallel.NewTrainer(ctx, pg, cfg, parallel.Layout{DP: 1, PP: 1, TP: pg.WorldSize()}, batch)
	if err != nil {
		return err
	}
	defer tr.Close()
	rng := rand.New(rand.NewPCG(3, 4))
	data := make([]int, 4096)
	for i := range data {
		data[i] = rng.IntN(cfg.Vocab)
	}
	in, tg, err := transformer.SampleBatch(rng, data, batch, cfg.Ctx)
	if err != nil {
		return err
	}
	// A warm-up step each.
	if _, err := one.Step(ctx, in, tg); err != nil {
		return err
	}
	if _, err := tr.Step(ctx, in, tg); err != nil {
		return err
	}
	rec := pg.Timeline()
	r, err := compare(ctx, pg, comparison{
		base: func() error { _, err := one.Step(ctx, in, tg); return err },
		par: func() error {
			t0 := time.Now()
			_, err := tr.Step(ctx, in, tg)
			rec.Add(timeline.Event{Lane: "bench", Name: "tp step", Start: t0, End: time.Now()})
			return err
		},
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "model %d params (dim %d, %d layers, %s), batch %d x ctx %d, time per training step:\n",
		cfg.NumParams(), cfg.Dim, cfg.Layers, cfg.Dtype, batch, cfg.Ctx)
	report(out, r, fmt.Sprintf("TP=%d", pg.WorldSize()), 1, "step")
	if rec == nil || opts.only == "base" {
		return nil
	}
	var buf bytes.Buffer
	if err := rec.Write(&buf); err != nil {
		return err
	}
	evs, err := timeline.Read(&buf)
	if err != nil {
		return err
	}
	tpLane := "collectives on tp"
	for _, s := range timeline.Summarize(evs, "tp step") {
		if s.Lane == tpLane {
			k, d := s.PerWindow()
			fmt.Fprintf(out, "  timeline, rank %d: %.0f %s per TP step on the tensor-parallel group, %.2f ms per step = %.2f%% of the step\n",
				s.Rank, k, s.Name, d.Seconds()*1e3, 100*s.Share())
		}
	}
	// The same all-reduce as a block's, [batch*ctx, dim] floats, alone:
	// what the communication costs when the other rank is already there.
	x := make([]float32, batch*cfg.Ctx*cfg.Dim)
	var ar []time.Duration
	for range 20 {
		t0 := time.Now()
		if err := tr.Groups().TP.AllReduce(ctx, dist.F32(x), dist.Sum); err != nil {
			return err
		}
		ar = append(ar, time.Since(t0))
	}
	fmt.Fprintf(out, "  an all-reduce of a block's %d floats alone: %.0f us (median of 20); the timeline's time in collectives beyond that is waiting for the other rank\n",
		len(x), median(ar).Seconds()*1e6)
	return nil
}

// benchAllReduce: all-reduce latency of 4096 and 32768 floats.
func benchAllReduce(ctx context.Context, pg *dist.ProcessGroup, out io.Writer) error {
	for _, n := range []int{4096, 32768} {
		x := make([]float32, n)
		var ds []time.Duration
		for range opts.reps * 100 {
			t0 := time.Now()
			if err := pg.AllReduce(ctx, dist.F32(x), dist.Sum); err != nil {
				return err
			}
			ds = append(ds, time.Since(t0))
		}
		fmt.Fprintf(out, "all-reduce of %d float32 on %d ranks: median %.1f us\n", n, pg.WorldSize(), median(ds).Seconds()*1e6)
	}
	return nil
}
