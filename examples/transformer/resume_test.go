package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/ckpt"
)

// interrupted trains cfg to step `stop` with checkpoints every 5 steps and
// removes the checkpoint of the last step (the final save), leaving what a
// crash after step `stop` leaves: the periodic checkpoints.
func interrupted(t *testing.T, n int, c *corpus, cfg trainConfig, stop int) {
	t.Helper()
	cfg.Steps = stop
	onRanks(t, n, func(ctx context.Context, pg *dist.ProcessGroup) (*trainResult, error) {
		return train(ctx, pg, c, cfg, trainHooks{})
	})
	dirs := []string{cfg.CkptDir}
	if cfg.Pipeline {
		dirs = dirs[:0]
		for s := range n {
			dirs = append(dirs, ckpt.StageDir(cfg.CkptDir, s))
		}
	}
	for _, d := range dirs {
		require.NoError(t, os.Remove(filepath.Join(d, "ckpt-13.gdc")))
	}
}

func resumed(t *testing.T, n int, c *corpus, cfg trainConfig) ([]*trainResult, []int64) {
	t.Helper()
	var from []int64
	res := onRanks(t, n, func(ctx context.Context, pg *dist.ProcessGroup) (*trainResult, error) {
		return train(ctx, pg, c, cfg, trainHooks{resumed: func(r *ckpt.Resumed) { from = append(from, r.Step) }})
	})
	return res, from
}

// TestTrainResumeBitwise: data-parallel training (one rank, two ranks each
// drawing its own batches) stopped after step 13 and resumed from its
// checkpoint of step 10 ends bitwise where a run never stopped ends.
func TestTrainResumeBitwise(t *testing.T) {
	c := testCorpus(t)
	for _, n := range []int{1, 2} {
		cfg := tinyTrainConfig(c)
		cfg.Steps = 20
		want := onRanks(t, n, func(ctx context.Context, pg *dist.ProcessGroup) (*trainResult, error) {
			return train(ctx, pg, c, cfg, trainHooks{})
		})
		cfg.CkptDir, cfg.CkptEvery = t.TempDir(), 5
		interrupted(t, n, c, cfg, 13)
		got, from := resumed(t, n, c, cfg)
		assert.Equal(t, []int64{10}, from, "%d rank(s)", n)
		for r := range n {
			assert.Equal(t, want[r].Check, got[r].Check, "%d rank(s), rank %d: bitwise the uninterrupted parameters", n, r)
			assert.Equal(t, want[r].Losses[10:], got[r].Losses, "%d rank(s), rank %d", n, r)
			assert.Equal(t, 10, got[r].Start)
		}
	}
}

// TestTrainPipelineResume: a 2-stage pipeline (each rank holds only its
// layers and saves them to its own directory) stopped and resumed ends
// bitwise where an uninterrupted one ends, also when one stage's newest
// checkpoint is torn (both stages then go back to the step before).
func TestTrainPipelineResume(t *testing.T) {
	c := testCorpus(t)
	cfg := tinyTrainConfig(c)
	cfg.Steps, cfg.Pipeline, cfg.MicroBatches = 20, true, 2
	want := onRanks(t, 2, func(ctx context.Context, pg *dist.ProcessGroup) (*trainResult, error) {
		return train(ctx, pg, c, cfg, trainHooks{})
	})
	require.Len(t, want[0].Stages, 2)
	assert.Equal(t, want[0].Stages, want[1].Stages)
	assert.Less(t, want[0].Losses[19], want[0].Losses[0], "the pipeline learns")

	for _, torn := range []bool{false, true} {
		cfg := cfg
		cfg.CkptDir, cfg.CkptEvery = t.TempDir(), 5
		interrupted(t, 2, c, cfg, 13)
		from := int64(10)
		if torn {
			p := filepath.Join(ckpt.StageDir(cfg.CkptDir, 1), "ckpt-10.gdc")
			b, err := os.ReadFile(p)
			require.NoError(t, err)
			b[len(b)/2] ^= 0xFF
			require.NoError(t, os.WriteFile(p, b, 0o644))
			from = 5
		}
		got, resumedFrom := resumed(t, 2, c, cfg)
		assert.Equal(t, []int64{from}, resumedFrom, "torn %v", torn)
		for r := range 2 {
			assert.Equal(t, want[r].Stages, got[r].Stages, "torn %v, rank %d: bitwise every stage's uninterrupted parameters", torn, r)
			assert.Equal(t, want[r].Losses[from:], got[r].Losses, "torn %v, rank %d", torn, r)
		}
	}
}
