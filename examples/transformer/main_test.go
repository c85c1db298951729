package main

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"gorgonia.org/gorgonia"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/disttest"
	"github.com/gdist/gdist/dist/transport/transporttest"
	"github.com/gdist/gdist/models/transformer"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(childMain(role))
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		if tmpDir != "" {
			os.RemoveAll(tmpDir)
		}
		os.Exit(code)
	}))
}

// tmpDir holds files shared by the tests (the tiny checkpoint).
var tmpDir string

// testText is a small English text for the tests (the real program trains
// on Newton's Opticks).
var testText = strings.Repeat(`Light is a stream of rays. The rays of light which differ in colour differ
also in degrees of refrangibility, and the light of the sun consists of rays
differently refrangible. A prism refracts the violet rays more than the red.
When light falls on a body, some of it is reflected and some transmitted.
`, 12)

// tinyModel is a model small enough to train in a second: 2 blocks, so 4
// pipeline layers.
func tinyModel(vocab int) transformer.Config {
	return transformer.Config{Vocab: vocab, Ctx: 16, Dim: 16, Heads: 2, Layers: 2, MLPHidden: 32, Seed: 7}
}

func tinyTrainConfig(c *corpus) trainConfig {
	return trainConfig{Model: tinyModel(c.Vocab.Size()), Batch: 4, LR: 1e-2, Seed: 3, Steps: 30,
		EvalEvery: 10, EvalWindows: 8}
}

func testCorpus(t *testing.T) *corpus {
	t.Helper()
	c, err := newCorpus(testText, 0.1, 16)
	require.NoError(t, err)
	return c
}

// onRanks runs f on n in-process ranks (goroutines) and returns their
// results; a failing rank closes its group so that its peers fail too.
func onRanks[T any](t *testing.T, n int, f func(ctx context.Context, pg *dist.ProcessGroup) (T, error)) []T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, errs := disttest.Results(t, disttest.Cluster(t, n), func(_ int, pg *dist.ProcessGroup) (T, error) {
		return f(ctx, pg)
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	return res
}

var (
	ckptOnce sync.Once
	ckptPath string
	ckptErr  error
)

// tinyCheckpoint trains the tiny model for a few steps (once) and returns
// the checkpoint's path.
func tinyCheckpoint(t *testing.T) string {
	t.Helper()
	ckptOnce.Do(func() {
		c, err := newCorpus(testText, 0.1, 16)
		if err != nil {
			ckptErr = err
			return
		}
		pg, err := dist.New(transporttest.NewLocal(t, 1)[0])
		if err != nil {
			ckptErr = err
			return
		}
		defer pg.Close()
		cfg := tinyTrainConfig(c)
		res, err := train(context.Background(), pg, c, cfg, trainHooks{})
		if err != nil {
			ckptErr = err
			return
		}
		if tmpDir, err = os.MkdirTemp("", "transformer-example-test"); err != nil {
			ckptErr = err
			return
		}
		ckptPath = filepath.Join(tmpDir, "tiny.gdc")
		ckptErr = transformer.Save(ckptPath, &transformer.Checkpoint{Config: cfg.Model, Vocab: c.Vocab,
			Step: int64(res.Steps), Tensors: res.Weights})
	})
	require.NoError(t, ckptErr)
	return ckptPath
}

func TestStageRanges(t *testing.T) {
	for _, tc := range []struct {
		layers, world int
		split         []int
		want          [][2]int
	}{
		{4, 1, nil, [][2]int{{0, 3}}},
		{4, 2, nil, [][2]int{{0, 1}, {2, 3}}},
		{4, 3, nil, [][2]int{{0, 1}, {2, 2}, {3, 3}}},
		{4, 4, nil, [][2]int{{0, 0}, {1, 1}, {2, 2}, {3, 3}}},
		{7, 3, nil, [][2]int{{0, 2}, {3, 4}, {5, 6}}},
		{4, 2, []int{1}, [][2]int{{0, 0}, {1, 3}}},
		{4, 3, []int{1, 3}, [][2]int{{0, 0}, {1, 2}, {3, 3}}},
	} {
		got, err := stageRanges(tc.layers, tc.world, tc.split)
		require.NoError(t, err, "%+v", tc)
		assert.Equal(t, tc.want, got, "%+v", tc)
	}
	for _, tc := range []struct {
		layers, world int
		split         []int
	}{
		{4, 5, nil},          // more stages than layers
		{4, 2, []int{0}},     // empty first stage
		{4, 2, []int{4}},     // empty last stage
		{4, 3, []int{2, 2}},  // empty middle stage
		{4, 3, []int{2}},     // too few points
		{4, 2, []int{1, 2}},  // too many points
		{4, 3, []int{3, 1}},  // decreasing
		{4, 0, nil},          // no stages
		{4, 2, []int{-1}},    // negative
		{4, 3, []int{1, 10}}, // past the head
	} {
		_, err := stageRanges(tc.layers, tc.world, tc.split)
		assert.ErrorIs(t, err, errSplit, "%+v", tc)
	}
	s, err := parseSplit(" 1, 3")
	require.NoError(t, err)
	assert.Equal(t, []int{1, 3}, s)
	s, err = parseSplit("")
	require.NoError(t, err)
	assert.Nil(t, s)
	_, err = parseSplit("1,x")
	assert.ErrorIs(t, err, errSplit)
}

// TestTrainLearns trains the tiny model in one process: the loss falls and
// the curve has a point at the start, every EvalEvery steps and the end.
func TestTrainLearns(t *testing.T) {
	c := testCorpus(t)
	cfg := tinyTrainConfig(c)
	res := onRanks(t, 1, func(ctx context.Context, pg *dist.ProcessGroup) (*trainResult, error) {
		return train(ctx, pg, c, cfg, trainHooks{})
	})[0]
	require.Len(t, res.Losses, 30)
	require.Len(t, res.Curve, 4)
	assert.Equal(t, []int{0, 10, 20, 30}, []int{res.Curve[0].Step, res.Curve[1].Step, res.Curve[2].Step, res.Curve[3].Step})
	assert.True(t, math.IsNaN(res.Curve[0].Train))
	assert.InDelta(t, math.Log(float64(c.Vocab.Size())), res.Curve[0].Val, 0.3, "untrained: about ln(vocab)")
	assert.Less(t, res.Curve[3].Val, res.Curve[0].Val-0.5, "validation loss falls")
	assert.Less(t, res.Curve[3].Train, res.Curve[1].Train, "training loss falls")
	assert.Positive(t, res.TokensPerSec)
	assert.False(t, res.Interrupted)
}

// TestTrainDDP trains on two in-process ranks. With the same batches on
// both ranks, DDP's average of two equal gradients is that gradient, so the
// result is bitwise what one process computes; with their own batches the
// ranks still end identical (and differ from one process).
func TestTrainDDP(t *testing.T) {
	c := testCorpus(t)
	cfg := tinyTrainConfig(c)
	cfg.Steps = 12
	single := onRanks(t, 1, func(ctx context.Context, pg *dist.ProcessGroup) (*trainResult, error) {
		return train(ctx, pg, c, cfg, trainHooks{})
	})[0]

	same := cfg
	same.SameData = true
	two := onRanks(t, 2, func(ctx context.Context, pg *dist.ProcessGroup) (*trainResult, error) {
		return train(ctx, pg, c, same, trainHooks{})
	})
	for r := range 2 {
		assert.Equal(t, single.Check, two[r].Check, "rank %d: DDP on equal batches = one process, bit for bit", r)
		assert.Equal(t, single.Losses, two[r].Losses, "rank %d", r)
	}

	own := onRanks(t, 2, func(ctx context.Context, pg *dist.ProcessGroup) (*trainResult, error) {
		return train(ctx, pg, c, cfg, trainHooks{})
	})
	assert.Equal(t, own[0].Check, own[1].Check, "ranks identical")
	assert.Equal(t, own[0].Losses, own[1].Losses, "losses are averaged over the ranks")
	for i := range own[0].Curve {
		assert.Equal(t, own[0].Curve[i].Val, own[1].Curve[i].Val, "validation is shared and all-reduced")
	}
	assert.NotEqual(t, single.Check, own[0].Check, "each rank trained on its own batches")
	assert.Less(t, own[0].Curve[len(own[0].Curve)-1].Val, own[0].Curve[0].Val-0.5)
}

// TestTrainDDPGlobalBatch trains on two in-process ranks, each on its own
// batches, with DDP hooks at every parameter use and small buckets (so
// several all-reduces start during backprop): the ranks end bitwise
// identical, and equal to one process trained on the concatenation of the
// two ranks' batches up to float32 rounding.
func TestTrainDDPGlobalBatch(t *testing.T) {
	c := testCorpus(t)
	cfg := tinyTrainConfig(c)
	cfg.Steps = 10
	cfg.BucketCap = 2 << 10
	two := onRanks(t, 2, func(ctx context.Context, pg *dist.ProcessGroup) (*trainResult, error) {
		return train(ctx, pg, c, cfg, trainHooks{})
	})
	assert.Equal(t, two[0].Check, two[1].Check, "ranks identical")
	require.Equal(t, len(two[0].Weights), len(two[1].Weights))
	for i := range two[0].Weights {
		require.Equal(t, two[0].Weights[i].Tensor.Data(), two[1].Weights[i].Tensor.Data(), two[0].Weights[i].Name)
	}
	buckets := two[0].DDP.Buckets / cfg.Steps
	assert.Greater(t, buckets, 2, "several buckets")
	assert.Equal(t, cfg.Steps*buckets, two[0].DDP.Buckets)
	t.Logf("DDP: %d buckets; per step: compute %v, all-reduces in flight %v, exposed %v", buckets,
		two[0].DDP.Compute/time.Duration(cfg.Steps), two[0].DDP.Comm/time.Duration(cfg.Steps), two[0].DDP.Exposed/time.Duration(cfg.Steps))

	global := cfg
	global.Batch *= 2
	global.Shards = 2
	one := onRanks(t, 1, func(ctx context.Context, pg *dist.ProcessGroup) (*trainResult, error) {
		return train(ctx, pg, c, global, trainHooks{})
	})[0]
	worst := 0.0
	for i, w := range one.Weights {
		got, want := two[0].Weights[i].Tensor.Data().([]float32), w.Tensor.Data().([]float32)
		require.Equal(t, w.Name, two[0].Weights[i].Name)
		var diff, norm float64
		for k := range want {
			d := float64(got[k]) - float64(want[k])
			diff += d * d
			norm += float64(want[k]) * float64(want[k])
		}
		rel := math.Sqrt(diff / max(norm, 1e-30))
		worst = max(worst, rel)
		assert.LessOrEqual(t, rel, 1e-5, "%s: relative difference to one process on the global batch", w.Name)
	}
	for i := range one.Losses {
		assert.InEpsilon(t, one.Losses[i], two[0].Losses[i], 1e-5, "step %d loss", i+1)
	}
	t.Logf("largest relative difference of a parameter tensor to one process on the global batch: %.2g", worst)
}

// TestTrainStopsTogether cancels one rank's context: both ranks stop at the
// same step, with the result marked interrupted, instead of hanging.
func TestTrainStopsTogether(t *testing.T) {
	c := testCorpus(t)
	cfg := tinyTrainConfig(c)
	cfg.Steps, cfg.Duration = 0, time.Minute
	res := onRanks(t, 2, func(ctx context.Context, pg *dist.ProcessGroup) (*trainResult, error) {
		if pg.Rank() == 1 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithCancel(ctx)
			defer cancel()
			go func() {
				time.Sleep(300 * time.Millisecond)
				cancel()
			}()
		}
		return train(ctx, pg, c, cfg, trainHooks{})
	})
	assert.Equal(t, res[0].Steps, res[1].Steps)
	assert.Positive(t, res[0].Steps)
	assert.True(t, res[0].Interrupted != res[1].Interrupted, "only rank 1's context ended")
	assert.Equal(t, res[0].Check, res[1].Check)
}

// genOnRanks runs generate on n in-process ranks and returns rank 0's
// result.
func genOnRanks(t *testing.T, n int, cfg genConfig) *genResult {
	t.Helper()
	res := onRanks(t, n, func(ctx context.Context, pg *dist.ProcessGroup) (*genResult, error) {
		return generate(ctx, pg, cfg)
	})
	for r := 1; r < n; r++ {
		assert.Empty(t, res[r].Text, "only rank 0 has the text")
	}
	return res[0]
}

// TestGeneratePipelineInProcess checks that 2- and 3-stage pipelines, with
// the default and explicit splits, generate exactly the text of one
// process, sampled and greedy; and so does the KV cache on one process, on
// 2 and 3 pipeline stages, on 2 tensor-parallel ranks and on 2 stages of 2.
func TestGeneratePipelineInProcess(t *testing.T) {
	path := tinyCheckpoint(t)
	for _, temp := range []float64{0.8, 0} {
		base := genConfig{Ckpt: path, Prompt: "Light is", N: 40, Temperature: temp, Seed: 11, NoCache: true}
		want := genOnRanks(t, 1, base)
		require.Len(t, []rune(want.Text), len([]rune(base.Prompt))+40)
		t.Logf("temperature %g: %q", temp, want.Text)
		for _, tc := range []struct {
			n     int
			split []int
			want  [][2]int
		}{
			{2, nil, [][2]int{{0, 1}, {2, 3}}},
			{2, []int{1}, [][2]int{{0, 0}, {1, 3}}},
			{3, nil, [][2]int{{0, 1}, {2, 2}, {3, 3}}},
			{3, []int{1, 3}, [][2]int{{0, 0}, {1, 2}, {3, 3}}},
		} {
			cfg := base
			cfg.Split = tc.split
			got := genOnRanks(t, tc.n, cfg)
			assert.Equal(t, tc.want, got.Stages)
			assert.Equal(t, want.Text, got.Text, "%d stages, split %v, temperature %g", tc.n, tc.split, temp)
		}
		for _, tc := range []struct{ n, tp int }{{1, 1}, {2, 1}, {3, 1}, {2, 2}, {4, 2}} {
			cfg := base
			cfg.NoCache, cfg.TP = false, tc.tp
			assert.Equal(t, want.Text, genOnRanks(t, tc.n, cfg).Text, "KV cache on %d ranks, tp %d, temperature %g", tc.n, tc.tp, temp)
		}
	}
	// A prompt longer than the context (16) slides the window.
	long := genConfig{Ckpt: path, Prompt: "The rays of light which differ in colour", N: 20, Temperature: 0.8, Seed: 5, NoCache: true}
	want := genOnRanks(t, 1, long).Text
	assert.Equal(t, want, genOnRanks(t, 3, long).Text)
	long.NoCache = false
	assert.Equal(t, want, genOnRanks(t, 1, long).Text)
	assert.Equal(t, want, genOnRanks(t, 2, long).Text)
}

func TestGenerateErrors(t *testing.T) {
	path := tinyCheckpoint(t)
	run1 := func(n int, cfg genConfig) []error {
		return disttest.Run(t, disttest.Cluster(t, n), func(_ int, pg *dist.ProcessGroup) error {
			_, err := generate(context.Background(), pg, cfg)
			return err
		})
	}
	for r, err := range run1(2, genConfig{Ckpt: path, Prompt: "Light is", N: 5, Split: []int{4}, NoCache: true}) {
		assert.ErrorIs(t, err, errSplit, "rank %d", r)
	}
	for r, err := range run1(5, genConfig{Ckpt: path, Prompt: "Light is", N: 5}) {
		assert.ErrorIs(t, err, errSplit, "rank %d: 5 stages for 4 layers", r)
	}
	for _, n := range []int{1, 2} {
		for r, err := range run1(n, genConfig{Ckpt: path, Prompt: "Light is #", N: 5}) {
			assert.ErrorIs(t, err, transformer.ErrUnknownRune, "rank %d of %d", r, n)
		}
	}
	for r, err := range run1(2, genConfig{Ckpt: filepath.Join(t.TempDir(), "none.gdc"), Prompt: "L", N: 5}) {
		assert.ErrorIs(t, err, os.ErrNotExist, "rank %d", r)
	}

	// A tied head keeps the embedding and the head in one stage: no
	// pipeline, but one process works.
	c := testCorpus(t)
	cfg := tinyModel(c.Vocab.Size())
	cfg.TiedHead = true
	graphMu.Lock()
	st, err := transformer.NewStage(gorgonia.NewGraph(), cfg, 0, cfg.HeadLayer(), 1)
	graphMu.Unlock()
	require.NoError(t, err)
	tied := filepath.Join(t.TempDir(), "tied.gdc")
	require.NoError(t, transformer.Save(tied, &transformer.Checkpoint{Config: cfg, Vocab: c.Vocab, Tensors: st.Weights()}))
	for r, err := range run1(2, genConfig{Ckpt: tied, Prompt: "Light is", N: 5}) {
		assert.ErrorIs(t, err, errSplit, "rank %d", r)
	}
	assert.NotEmpty(t, genOnRanks(t, 1, genConfig{Ckpt: tied, Prompt: "Light is", N: 5}).Text)
}

// TestRunTrainAndGenerate runs both commands end to end in a world of one.
func TestRunTrainAndGenerate(t *testing.T) {
	for _, v := range []string{"RANK", "WORLD_SIZE", "MASTER_ADDR", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"} {
		if _, ok := os.LookupEnv(v); ok {
			t.Skipf("%s is set: the test needs a world of one", v)
		}
	}
	dir := t.TempDir()
	text := filepath.Join(dir, "text.txt")
	require.NoError(t, os.WriteFile(text, []byte(testText), 0o644))
	ckpt := filepath.Join(dir, "sub", "m.gdc")
	png := filepath.Join(dir, "loss.png")
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"train", "-text", text, "-steps", "20", "-eval-every", "5", "-eval-windows", "4",
		"-ctx", "16", "-dim", "16", "-heads", "2", "-layers", "1", "-mlp", "32", "-batch", "4", "-lr", "0.01",
		"-out", ckpt, "-plot", png}, &stdout, &stderr)
	require.NoError(t, err, "stderr: %s", stderr.String())
	out := stdout.String()
	t.Log(out)
	assert.Contains(t, out, "1 rank(s)")
	assert.Contains(t, out, "stop after 20 steps")
	assert.Contains(t, out, "loss curve")
	assert.Contains(t, out, "train: saved "+ckpt)
	assert.Contains(t, stderr.String(), "train  50%  step 10", "sparse progress lines when stderr is not a terminal")
	assert.NotContains(t, stderr.String(), "\r")
	for _, p := range []string{ckpt, png} {
		fi, err := os.Stat(p)
		require.NoError(t, err)
		assert.Positive(t, fi.Size())
	}

	stdout.Reset()
	stderr.Reset()
	err = run(context.Background(), []string{"generate", "-ckpt", ckpt, "-prompt", "Light", "-n", "30", "-seed", "2"}, &stdout, &stderr)
	require.NoError(t, err, "stderr: %s", stderr.String())
	text1 := strings.TrimSuffix(stdout.String(), "\n")
	assert.True(t, strings.HasPrefix(text1, "Light"), text1)
	assert.Len(t, []rune(text1), 35)
	assert.Contains(t, stderr.String(), "30 tokens in")
	assert.Contains(t, stderr.String(), "tokens/s (1 process, KV cache; checkpoint step 20")
}

func TestRunErrors(t *testing.T) {
	var stdout, stderr bytes.Buffer
	missing := filepath.Join(t.TempDir(), "nothing-here.txt")
	err := run(context.Background(), []string{"train", "-text", missing}, &stdout, &stderr)
	require.ErrorIs(t, err, errNoText)
	assert.Contains(t, err.Error(), missing, "names where it looked")
	assert.Contains(t, err.Error(), "-text", "names the flag")

	for _, args := range [][]string{
		nil, {"fly"}, {"train", "-nope"}, {"train", "extra"}, {"train", "-steps", "0", "-duration", "0"},
		{"train", "-out", ""}, {"train", "-bucket-kb", "-1"}, {"generate", "-split", "a"}, {"generate", "-n", "-1"}, {"generate", "x"},
	} {
		stdout.Reset()
		stderr.Reset()
		err := run(context.Background(), args, &stdout, &stderr)
		assert.ErrorIs(t, err, errUsage, "%q", args)
	}
	assert.NoError(t, run(context.Background(), []string{"help"}, &stdout, &stderr))
}

func TestDefaultTextPath(t *testing.T) {
	p := defaultTextPath()
	assert.True(t, strings.HasSuffix(p, opticksRel), p)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("no Opticks text in this Go installation: %v", err)
	}
	text, _, err := loadText("")
	require.NoError(t, err)
	assert.Greater(t, len(text), 500_000)
}

func TestCurveTable(t *testing.T) {
	assert.Equal(t, []int{0, 1, 2}, spread(3, 12))
	assert.Equal(t, []int{0, 3, 6, 9}, spread(10, 4))
	curve := []point{{Step: 0, Val: 4.5, Train: math.NaN()}, {Step: 100, Elapsed: 12 * time.Second, Train: 2.5, Val: 2.4}}
	s := curveTable(curve, 12)
	assert.Contains(t, s, "      0       0s       -   4.500")
	assert.Contains(t, s, "    100      12s   2.500   2.400")
}

func TestPlainProgress(t *testing.T) {
	var out, errw bytes.Buffer
	p := newProgress(&out, &errw, false)
	for i := 1; i <= 20; i++ {
		p.step(i, 1/float64(i), float64(i)/20, 1000)
	}
	p.eval(point{Step: 20, Elapsed: time.Second, Train: 0.1, Val: 0.2})
	p.finish()
	lines := strings.Split(strings.TrimSpace(errw.String()), "\n")
	require.Len(t, lines, 9, "%q", errw.String())
	assert.True(t, strings.HasPrefix(lines[0], "train  10%  step 2  loss"), lines[0])
	assert.Contains(t, lines[8], "train  90%  step 18")
	assert.Equal(t, "step    20       1s  train 0.100  val 0.200\n", out.String())
}

// TestTrainShard: on two in-process ranks, each on its own batches, ZeRO-1,
// ZeRO-2 and full sharding (one unit per layer) train the transformer to
// bitwise DDP's parameters and losses; a fully sharded run that saved a
// sharded checkpoint and stopped resumes to bitwise an uninterrupted
// run.
func TestTrainShard(t *testing.T) {
	c := testCorpus(t)
	cfg := tinyTrainConfig(c)
	cfg.Steps = 10
	cfg.BucketCap = 2 << 10
	run := func(cfg trainConfig) []*trainResult {
		return onRanks(t, 2, func(ctx context.Context, pg *dist.ProcessGroup) (*trainResult, error) {
			return train(ctx, pg, c, cfg, trainHooks{})
		})
	}
	want := run(cfg)
	for _, shard := range []string{"zero1", "zero2", "full"} {
		s := cfg
		s.Shard = shard
		got := run(s)
		for r := range got {
			assert.Equal(t, want[r].Check, got[r].Check, "%s rank %d", shard, r)
			assert.Equal(t, want[r].Losses, got[r].Losses, "%s rank %d", shard, r)
		}
	}

	s := cfg
	s.Shard, s.CkptDir, s.CkptEvery, s.Steps = "full", t.TempDir(), 3, 6
	run(s)
	s.Steps = 10
	got := run(s)
	for r := range got {
		assert.Equal(t, 6, got[r].Start, "rank %d resumed", r)
		assert.Equal(t, want[r].Check, got[r].Check, "rank %d: resumed fully sharded, bitwise the uninterrupted DDP run", r)
	}
}
