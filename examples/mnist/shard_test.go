package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/ckpt"
	"github.com/gdist/gdist/dist/disttest"
)

// TestShardModes: on 2 ranks ZeRO-1, ZeRO-2 and full sharding train MNIST
// to bitwise the parameters and losses of DDP (the reduce-scatter adds the
// two ranks' gradients as the all-reduce does).
func TestShardModes(t *testing.T) {
	trainSet, test := data(t)
	trainSet = subset(trainSet, 4096)
	cfg := config{Epochs: 2, Batch: 32, LR: 1e-3, Seed: 5, BucketCap: 256 << 10, MaxSteps: 20, TestLimit: 500}
	want := trainRanks(t, 2, trainSet, test, cfg)
	for _, shard := range []string{"zero1", "zero2", "full"} {
		c := cfg
		c.Shard = shard
		if shard == "full" {
			c.BucketCap = 0
		}
		got := trainRanks(t, 2, trainSet, test, c)
		for r := range got {
			assert.Equal(t, want[r].Check, got[r].Check, "%s rank %d: the parameters", shard, r)
			assert.Equal(t, want[r].Losses, got[r].Losses, "%s rank %d: the losses", shard, r)
		}
		assert.Equal(t, want[0].Epochs[1].Acc, got[0].Epochs[1].Acc, "%s: the test accuracy", shard)
	}
}

// TestShardedResume: a fully sharded run stopped mid-epoch resumes from its
// sharded checkpoint to bitwise the parameters of a run never stopped; one
// saved at 2 ranks under ZeRO-2 resumes at 3 under full sharding and
// trains on the rest of the epoch, dealt among 3 ranks.
func TestShardedResume(t *testing.T) {
	trainSet, test := data(t)
	trainSet = subset(trainSet, 4096)
	cfg := config{Epochs: 2, Batch: 32, LR: 1e-3, Seed: 5, MaxSteps: 25, TestLimit: 500, Shard: "full"}
	want := trainRanks(t, 2, trainSet, test, cfg)

	c := cfg
	c.CkptDir, c.CkptEvery, c.StopAfter = t.TempDir(), 10, 33
	_, errs := trainRanksErr(t, 2, trainSet, test, c)
	for r, err := range errs {
		require.ErrorIs(t, err, errStopped, "rank %d", r)
	}
	c.StopAfter = 0
	var resumed []int64
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got, errs := disttest.Results(t, disttest.Cluster(t, 2), func(_ int, pg *dist.ProcessGroup) (*result, error) {
		return train(ctx, pg, trainSet, test, c, hooks{resumedSharded: func(r *ckpt.ShardedResumed) { resumed = append(resumed, r.Step) }})
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
		assert.Equal(t, want[r].Check, got[r].Check, "rank %d: bitwise the uninterrupted parameters", r)
		assert.Equal(t, want[r].Losses[30:], got[r].Losses, "rank %d: the same losses after the resume", r)
	}
	assert.Equal(t, []int64{30}, resumed)

	// Saved at 2 ranks under ZeRO-2, resumed at 3 fully sharded.
	c = cfg
	c.Shard, c.CkptDir, c.CkptEvery, c.StopAfter = "zero2", t.TempDir(), 10, 33
	_, errs = trainRanksErr(t, 2, trainSet, test, c)
	for r, err := range errs {
		require.ErrorIs(t, err, errStopped, "rank %d", r)
	}
	c.Shard, c.StopAfter = "full", 0
	var rescaled [][2]int
	var starts [][3]int
	res, errs := disttest.Results(t, disttest.Cluster(t, 3), func(_ int, pg *dist.ProcessGroup) (*result, error) {
		return train(ctx, pg, trainSet, test, c, hooks{
			rescaled: func(saved, now int) { rescaled = append(rescaled, [2]int{saved, now}) },
			start:    func(epoch, from, steps int) { starts = append(starts, [3]int{epoch, from, steps}) },
		})
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
		assert.Equal(t, res[0].Check, res[r].Check)
	}
	assert.Equal(t, [][2]int{{2, 3}}, rescaled)
	// Step 30 was step 5 of epoch 2 at 2 ranks: 2*5*32 = 320 of the
	// epoch's 4096 images were visited; the other 3776 are dealt among 3
	// ranks, 1258 each, 39 steps of 32 (capped at 25 steps an epoch).
	assert.Equal(t, [][3]int{{2, 0, 25}}, starts)
}

// TestResumeOtherWorld: a DDP run saved at 2 ranks resumes at 3 (the
// checkpoint holds every parameter and the whole optimizer state): the
// sampler deals the rest of the epoch among 3 ranks, the change is
// reported, and the 3 ranks train on identically.
func TestResumeOtherWorld(t *testing.T) {
	trainSet, test := data(t)
	trainSet = subset(trainSet, 4096)
	c := config{Epochs: 2, Batch: 32, LR: 1e-3, Seed: 5, MaxSteps: 25, TestLimit: 500,
		CkptDir: t.TempDir(), CkptEvery: 10, StopAfter: 33}
	_, errs := trainRanksErr(t, 2, trainSet, test, c)
	for r, err := range errs {
		require.ErrorIs(t, err, errStopped, "rank %d", r)
	}
	c.StopAfter = 0
	var rescaled [][2]int
	var resumed []int64
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, errs := disttest.Results(t, disttest.Cluster(t, 3), func(_ int, pg *dist.ProcessGroup) (*result, error) {
		return train(ctx, pg, trainSet, test, c, hooks{
			rescaled: func(saved, now int) { rescaled = append(rescaled, [2]int{saved, now}) },
			resumed:  func(r *ckpt.Resumed) { resumed = append(resumed, r.Step) },
		})
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
		assert.Equal(t, res[0].Check, res[r].Check)
	}
	assert.Equal(t, []int64{30}, resumed)
	assert.Equal(t, [][2]int{{2, 3}}, rescaled)
	assert.Greater(t, res[0].Epochs[0].Acc, 0.8)
}
