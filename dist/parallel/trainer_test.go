package parallel_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/disttest"
	"github.com/gdist/gdist/dist/parallel"
	"github.com/gdist/gdist/models/transformer"
	"github.com/gdist/gdist/train/checkpoint"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(childMain(role))
	}
	goleak.VerifyTestMain(m)
}

var buildMu sync.Mutex

func testConfig() transformer.Config {
	return transformer.Config{Vocab: 11, Ctx: 6, Dim: 16, Heads: 4, Layers: 2, MLPHidden: 24, Dtype: transformer.Float64, Seed: 5}
}

// batches returns steps global batches of batch windows from a fixed text.
func batches(steps, batch, ctx, vocab int) (ins, tgs [][]int) {
	rng := rand.New(rand.NewPCG(9, 9))
	data := make([]int, 500)
	for i := range data {
		data[i] = (i*i + i/3) % vocab
	}
	for range steps {
		in, tg, err := transformer.SampleBatch(rng, data, batch, ctx)
		if err != nil {
			panic(err)
		}
		ins, tgs = append(ins, in), append(tgs, tg)
	}
	return ins, tgs
}

// reference trains the single-process model.
func reference(t *testing.T, cfg transformer.Config, batch, steps int) ([]float64, []checkpoint.Named) {
	losses, weights, err := referenceRun(cfg, batch, steps)
	require.NoError(t, err)
	return losses, weights
}

// referenceRun trains the single-process model and returns its losses and
// final weights.
func referenceRun(cfg transformer.Config, batch, steps int) ([]float64, []checkpoint.Named, error) {
	tr, err := transformer.NewTrainer(cfg, batch)
	if err != nil {
		return nil, nil, err
	}
	defer tr.Close()
	ins, tgs := batches(steps, batch, cfg.Ctx, cfg.Vocab)
	var losses []float64
	for s := range steps {
		l, err := tr.Step(context.Background(), ins[s], tgs[s])
		if err != nil {
			return nil, nil, err
		}
		losses = append(losses, l)
	}
	return losses, tr.Weights(), nil
}

// maxRelDiff returns the largest, over tensors, of max|a-b| / max|b|.
func maxRelDiff(t *testing.T, got, want []checkpoint.Named) float64 {
	worst, err := relDiff(got, want)
	require.NoError(t, err)
	return worst
}

// relDiff returns the largest, over tensors, of max|a-b| / max|b| for
// float64 tensors of the same names and shapes.
func relDiff(got, want []checkpoint.Named) (float64, error) {
	if len(got) != len(want) {
		return 0, fmt.Errorf("%d tensors, want %d", len(got), len(want))
	}
	worst := 0.0
	for i := range want {
		if want[i].Name != got[i].Name || !want[i].Tensor.Shape().Eq(got[i].Tensor.Shape()) {
			return 0, fmt.Errorf("tensor %d is %s %v, want %s %v", i, got[i].Name, got[i].Tensor.Shape(), want[i].Name, want[i].Tensor.Shape())
		}
		w, g := want[i].Tensor.Data().([]float64), got[i].Tensor.Data().([]float64)
		var diff, scale float64
		for j := range w {
			diff = max(diff, math.Abs(w[j]-g[j]))
			scale = max(scale, math.Abs(w[j]))
		}
		if scale > 0 {
			worst = max(worst, diff/scale)
		}
	}
	return worst, nil
}

// TestTrainingEquivalence: 50 steps of TP=2, DP×TP, DP×PP and PP×TP on 4
// ranks, and DP×PP×TP on 8, in float64, end with the single-process
// model's parameters to 1e-10 (relative, per tensor) and losses to 1e-10.
func TestTrainingEquivalence(t *testing.T) {
	const batch, steps = 4, 50
	cfg := testConfig()
	wantLoss, want := reference(t, cfg, batch, steps)
	ins, tgs := batches(steps, batch, cfg.Ctx, cfg.Vocab)
	for _, l := range []parallel.Layout{{DP: 1, PP: 1, TP: 2}, {DP: 2, PP: 1, TP: 2}, {DP: 2, PP: 2, TP: 1}, {DP: 1, PP: 2, TP: 2}, {DP: 2, PP: 2, TP: 2}} {
		t.Run(fmt.Sprintf("dp%d_pp%d_tp%d", l.DP, l.PP, l.TP), func(t *testing.T) {
			if testing.Short() && l.DP*l.PP*l.TP > 4 {
				t.Skip("8 ranks")
			}
			world := l.DP * l.PP * l.TP
			errs := disttest.Run(t, disttest.Cluster(t, world, dist.WithTimeout(2*time.Minute)), func(rank int, pg *dist.ProcessGroup) error {
				ctx := context.Background()
				tr, err := parallel.NewTrainer(ctx, pg, cfg, l, batch, parallel.WithMicroBatches(2/l.DP), parallel.WithBuildLock(&buildMu))
				if err != nil {
					return err
				}
				defer tr.Close()
				for s := range steps {
					loss, err := tr.Step(ctx, ins[s], tgs[s])
					if err != nil {
						return err
					}
					if rank == 0 {
						assert.InDelta(t, wantLoss[s], loss, 1e-10*wantLoss[s], "step %d", s)
					}
				}
				got, err := tr.Weights(ctx)
				if err != nil {
					return err
				}
				rel := maxRelDiff(t, got, want)
				if rank == 0 {
					t.Logf("%v: largest relative parameter difference after %d steps %.3g", l, steps, rel)
				}
				assert.LessOrEqual(t, rel, 1e-10)
				return nil
			})
			for r, err := range errs {
				assert.NoError(t, err, "rank %d", r)
			}
		})
	}
}

func TestLayout(t *testing.T) {
	cfg := testConfig()
	assert.NoError(t, parallel.Layout{DP: 2, PP: 2, TP: 2}.Validate(8, cfg))
	assert.ErrorIs(t, parallel.Layout{DP: 2, PP: 2, TP: 2}.Validate(4, cfg), parallel.ErrInvalidArgument)
	assert.ErrorIs(t, parallel.Layout{DP: 1, PP: 1, TP: 3}.Validate(3, cfg), parallel.ErrInvalidArgument)
	assert.ErrorIs(t, parallel.Layout{DP: 1, PP: 5, TP: 1}.Validate(5, cfg), parallel.ErrInvalidArgument)
	assert.Equal(t, [][2]int{{0, 1}, {2, 3}}, parallel.Layout{PP: 2}.Stages(4))
	assert.Equal(t, [][2]int{{0, 1}, {2, 2}, {3, 3}}, parallel.Layout{PP: 3}.Stages(4))
	_ = tensor.Float64
}

// TestGeneratorSameTokens: a KV-cache generator on 1, 2 and 3 pipeline
// stages of 1 or 2 tensor-parallel members, with requests in groups moving
// through the stages, and two such replicas serving requests of their own,
// gives every request the tokens transformer.Generate gives it alone on one
// process (with the full forward pass), greedy and sampled, past the block
// size.
func TestGeneratorSameTokens(t *testing.T) {
	cfg := testConfig()
	cfg.Layers = 3
	cfg.Dtype = transformer.Float32
	reqs := []transformer.Request{
		{Prompt: []int{1, 2, 3}, N: 9, Temperature: 0, Seed: 1},
		{Prompt: []int{4}, N: 7, Temperature: 0.9, Seed: 7},
		{Prompt: []int{5, 6, 0, 1, 2}, N: 5, Temperature: 1.3, Seed: 2},
		{Prompt: []int{10, 9}, N: 8, Temperature: 0.7, Seed: 3},
		{Prompt: []int{7}, N: 3, Temperature: 0, Seed: 3},
	}
	pred, err := transformer.NewPredictor(cfg, nil)
	require.NoError(t, err)
	defer pred.Close()
	want := make([][]int, len(reqs))
	for i, r := range reqs {
		want[i], err = transformer.Generate(context.Background(), pred, r.Prompt, r.N, r.Temperature, r.Seed)
		require.NoError(t, err)
	}
	for _, l := range []parallel.Layout{{DP: 1, PP: 1, TP: 2}, {DP: 1, PP: 2, TP: 1}, {DP: 1, PP: 3, TP: 1}, {DP: 1, PP: 2, TP: 2},
		{DP: 2, PP: 2, TP: 1}, {DP: 2, PP: 1, TP: 2}} {
		t.Run(fmt.Sprintf("dp%d_pp%d_tp%d", l.DP, l.PP, l.TP), func(t *testing.T) {
			world := l.DP * l.PP * l.TP
			// With two replicas, the first serves requests 0..2, the second the rest.
			parts := [][2]int{{0, len(reqs)}}
			if l.DP == 2 {
				parts = [][2]int{{0, 3}, {3, len(reqs)}}
			}
			errs := disttest.Run(t, disttest.Cluster(t, world, dist.WithTimeout(time.Minute)), func(rank int, pg *dist.ProcessGroup) error {
				ctx := context.Background()
				g, err := parallel.NewGenerator(ctx, pg, cfg, l, len(reqs), parallel.WithBuildLock(&buildMu))
				if err != nil {
					return err
				}
				defer g.Close()
				part := parts[g.Groups().DP.Rank()]
				got, err := g.Generate(ctx, reqs[part[0]:part[1]])
				if err != nil {
					return err
				}
				stage := g.Groups().PP.Rank()
				if stage == 0 || stage == l.PP-1 {
					assert.Equal(t, want[part[0]:part[1]], got, "rank %d", rank)
				}
				return nil
			})
			for r, err := range errs {
				assert.NoError(t, err, "rank %d", r)
			}
		})
	}
}
