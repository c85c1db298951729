// Command tp measures tensor parallelism and KV-cache generation, paired
// and interleaved in one run, and prints each figure as a ratio to its
// baseline measured alongside it:
//
//	go run ./bench/tp -part cache                                   # one process: KV cache vs recompute, context 256
//	go run ./cmd/gdistrun -n 2 -- go run ./bench/tp -part serve      # 8 prompts: 2-stage pipeline vs one process
//	go run ./cmd/gdistrun -n 2 -- go run ./bench/tp -part tpgen      # d_model 1024: TP=2 vs one process, per token
//	go run ./cmd/gdistrun -n 2 -- go run ./bench/tp -part tptrain    # d_model 1024: TP=2 vs one process, per step
//	go run ./cmd/gdistrun -n 2 -- go run ./bench/tp -part allreduce  # 4096 and 32768 floats
//
// With two ranks the one-process baseline runs on rank 0 while rank 1
// waits at a barrier, alternating with the parallel run -reps times.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"slices"
	"time"

	"github.com/gdist/gdist"
	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/parallel"
	"github.com/gdist/gdist/models/transformer"
)

func main() {
	part := flag.String("part", "cache", "cache, serve, tpgen, tptrain or allreduce")
	reps := flag.Int("reps", 5, "interleaved repetitions (the median is reported)")
	tokens := flag.Int("tokens", 64, "tokens generated per run")
	flag.Parse()
	ctx := context.Background()
	pg, err := gdist.InitFromEnv(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer pg.Close()
	out := os.Stdout
	if pg.Rank() != 0 {
		out, _ = os.Open(os.DevNull)
	}
	fmt.Fprintf(out, "bench/tp %s: %d rank(s), %s, date %s\n", *part, pg.WorldSize(), transportNote(), time.Now().UTC().Format("2006-01-02"))
	switch *part {
	case "cache":
		err = benchCache(ctx, out, *reps, *tokens)
	case "serve":
		err = benchServe(ctx, pg, out, *reps, *tokens)
	case "tpgen":
		err = benchTPGen(ctx, pg, out, *reps, *tokens)
	case "tptrain":
		err = benchTPTrain(ctx, pg, out, *reps)
	case "allreduce":
		err = benchAllReduce(ctx, pg, out, *reps)
	default:
		err = fmt.Errorf("unknown part %q", *part)
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
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func prompts(n, vocab int) []transformer.Request {
	rng := rand.New(rand.NewPCG(1, 2))
	var reqs []transformer.Request
	for i := range n {
		p := make([]int, 8)
		for j := range p {
			p[j] = rng.IntN(vocab)
		}
		reqs = append(reqs, transformer.Request{Prompt: p, Temperature: 0.8, Seed: uint64(i)})
	}
	return reqs
}

// benchCache: the example's default model at context 256, one prompt,
// tokens/s with the full recompute (Predictor) and with the KV cache.
func benchCache(ctx context.Context, out *os.File, reps, n int) error {
	cfg := transformer.DefaultConfig(80)
	cfg.Ctx = 256
	n = min(n*4, cfg.Ctx-8)
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
	req := prompts(1, cfg.Vocab)[0]
	var full, cached []time.Duration
	for range reps {
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

// paired alternates base (rank 0 alone, the others at a barrier) and par
// (every rank) reps times and returns their durations.
func paired(ctx context.Context, pg *dist.ProcessGroup, reps int, base, par func() error) (bs, ps []time.Duration, err error) {
	for range reps {
		if err := pg.Barrier(ctx); err != nil {
			return nil, nil, err
		}
		if pg.Rank() == 0 {
			t0 := time.Now()
			if err := base(); err != nil {
				return nil, nil, err
			}
			bs = append(bs, time.Since(t0))
		}
		if err := pg.Barrier(ctx); err != nil {
			return nil, nil, err
		}
		t0 := time.Now()
		if err := par(); err != nil {
			return nil, nil, err
		}
		ps = append(ps, time.Since(t0))
	}
	return bs, ps, nil
}

// benchServe: 8 prompts, one process (one pass of 8 rows per token) vs a
// 2-stage pipeline with 2 groups of 4 in flight.
func benchServe(ctx context.Context, pg *dist.ProcessGroup, out *os.File, reps, n int) error {
	cfg := transformer.Config{Vocab: 96, Ctx: 128, Dim: 256, Heads: 4, Layers: 4, MLPHidden: 1024, Dtype: transformer.Float32, Seed: 1}
	reqs := prompts(8, cfg.Vocab)
	for i := range reqs {
		reqs[i].N = n
	}
	var one *transformer.Decoder
	var err error
	if pg.Rank() == 0 {
		if one, err = transformer.NewDecoder(cfg, 0, cfg.HeadLayer(), len(reqs)); err != nil {
			return err
		}
		defer one.Close()
	}
	g, err := parallel.NewGenerator(ctx, pg, cfg, parallel.Layout{DP: 1, PP: pg.WorldSize(), TP: 1}, len(reqs))
	if err != nil {
		return err
	}
	defer g.Close()
	var want, got [][]int
	bs, ps, err := paired(ctx, pg, reps,
		func() error { want, err = transformer.GenerateBatch(ctx, one, reqs); return err },
		func() error { got, err = g.Generate(ctx, reqs); return err })
	if err != nil {
		return err
	}
	if pg.Rank() == 0 && fmt.Sprint(want) != fmt.Sprint(got) {
		return fmt.Errorf("the pipeline changed the tokens")
	}
	if pg.Rank() != 0 {
		return nil
	}
	total := float64(len(reqs) * n)
	fmt.Fprintf(out, "model %d params (dim %d, %d layers), 8 prompts x %d tokens: one process %.1f tokens/s, %d-stage pipeline %.1f tokens/s, ratio %.2fx (tokens identical)\n",
		cfg.NumParams(), cfg.Dim, cfg.Layers, n, total/median(bs).Seconds(), pg.WorldSize(), total/median(ps).Seconds(), median(bs).Seconds()/median(ps).Seconds())
	return nil
}

// benchTPGen: one prompt on the wide model, latency per token, one
// process vs TP over every rank.
func benchTPGen(ctx context.Context, pg *dist.ProcessGroup, out *os.File, reps, n int) error {
	cfg := wideConfig()
	n = min(n, cfg.Ctx-8)
	reqs := prompts(1, cfg.Vocab)
	reqs[0].N = n
	var one *transformer.Decoder
	var err error
	if pg.Rank() == 0 {
		if one, err = transformer.NewDecoder(cfg, 0, cfg.HeadLayer(), 1); err != nil {
			return err
		}
		defer one.Close()
	}
	g, err := parallel.NewGenerator(ctx, pg, cfg, parallel.Layout{DP: 1, PP: 1, TP: pg.WorldSize()}, 1)
	if err != nil {
		return err
	}
	defer g.Close()
	var want, got [][]int
	bs, ps, err := paired(ctx, pg, reps,
		func() error { want, err = transformer.GenerateBatch(ctx, one, reqs); return err },
		func() error { got, err = g.Generate(ctx, reqs); return err })
	if err != nil {
		return err
	}
	same := "identical"
	if pg.Rank() == 0 && fmt.Sprint(want) != fmt.Sprint(got) {
		same = "DIFFERENT"
	}
	if pg.Rank() != 0 {
		return nil
	}
	per := func(d time.Duration) float64 { return d.Seconds() * 1e3 / float64(n) }
	fmt.Fprintf(out, "model %d params (dim %d, %d layers, %s), prompt 8 + %d tokens: one process %.2f ms/token, TP=%d %.2f ms/token, ratio %.2f (tokens %s)\n",
		cfg.NumParams(), cfg.Dim, cfg.Layers, cfg.Dtype, n, per(median(bs)), pg.WorldSize(), per(median(ps)), median(ps).Seconds()/median(bs).Seconds(), same)
	return nil
}

// benchTPTrain: training steps of the wide model, one process vs TP over
// every rank, with the all-reduces' share of the TP step.
func benchTPTrain(ctx context.Context, pg *dist.ProcessGroup, out *os.File, reps int) error {
	cfg := wideConfig()
	cfg.Ctx = 32
	const batch = 2
	var one *transformer.Trainer
	var err error
	if pg.Rank() == 0 {
		if one, err = transformer.NewTrainer(cfg, batch); err != nil {
			return err
		}
		defer one.Close()
	}
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
	if one != nil {
		if _, err := one.Step(ctx, in, tg); err != nil {
			return err
		}
	}
	if _, err := tr.Step(ctx, in, tg); err != nil {
		return err
	}
	bs, ps, err := paired(ctx, pg, reps,
		func() error { _, err := one.Step(ctx, in, tg); return err },
		func() error { _, err := tr.Step(ctx, in, tg); return err })
	if err != nil {
		return err
	}
	// The per-layer all-reduce: [batch*ctx, dim] floats, timed alone.
	x := make([]float32, batch*cfg.Ctx*cfg.Dim)
	var ar []time.Duration
	for range 20 {
		t0 := time.Now()
		if err := tr.Groups().TP.AllReduce(ctx, dist.F32(x), dist.Sum); err != nil {
			return err
		}
		ar = append(ar, time.Since(t0))
	}
	if pg.Rank() != 0 {
		return nil
	}
	perStep := 4 * cfg.Layers // forward: attention and MLP; backward: the same through Copy
	share := float64(perStep) * median(ar).Seconds() / median(ps).Seconds()
	fmt.Fprintf(out, "model %d params (dim %d, %d layers, %s), batch %d x ctx %d: one process %.1f ms/step, TP=%d %.1f ms/step, ratio %.2f; %d all-reduces of %d floats per step at %.0f us each = %.0f%% of the TP step\n",
		cfg.NumParams(), cfg.Dim, cfg.Layers, cfg.Dtype, batch, cfg.Ctx, median(bs).Seconds()*1e3, pg.WorldSize(), median(ps).Seconds()*1e3,
		median(ps).Seconds()/median(bs).Seconds(), perStep, len(x), median(ar).Seconds()*1e6, 100*share)
	return nil
}

// benchAllReduce: all-reduce latency of 4096 and 32768 floats.
func benchAllReduce(ctx context.Context, pg *dist.ProcessGroup, out *os.File, reps int) error {
	for _, n := range []int{4096, 32768} {
		x := make([]float32, n)
		var ds []time.Duration
		for range reps * 100 {
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
