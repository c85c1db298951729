package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/ckpt"
	"github.com/gdist/gdist/dist/disttest"
	"github.com/gdist/gdist/internal/mnist"
)

// trainRanksErr is trainRanks returning every rank's error.
func trainRanksErr(t *testing.T, n int, trainSet, test *mnist.Set, cfg config) ([]*result, []error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return disttest.Results(t, disttest.Cluster(t, n), func(_ int, pg *dist.ProcessGroup) (*result, error) {
		return train(ctx, pg, trainSet, test, cfg, hooks{})
	})
}

// TestResumeBitwise: a run stopped mid-epoch and resumed from its
// checkpoints ends with the parameters, bit for bit, and the epoch losses
// of a run never stopped — also when the newest checkpoint is torn.
func TestResumeBitwise(t *testing.T) {
	trainSet, test := data(t)
	trainSet = subset(trainSet, 4096)
	cfg := config{Epochs: 2, Batch: 32, LR: 1e-3, Seed: 5, BucketCap: 256 << 10, MaxSteps: 25, TestLimit: 500}
	want := trainRanks(t, 2, trainSet, test, cfg)

	for _, torn := range []bool{false, true} {
		name := "clean"
		if torn {
			name = "torn"
		}
		t.Run(name, func(t *testing.T) {
			c := cfg
			c.CkptDir, c.CkptEvery = t.TempDir(), 10
			c.StopAfter = 33 // epoch 2, after the checkpoint of step 30
			_, errs := trainRanksErr(t, 2, trainSet, test, c)
			for r, err := range errs {
				require.ErrorIs(t, err, errStopped, "rank %d", r)
			}
			resumeAt := int64(30)
			if torn {
				p := filepath.Join(c.CkptDir, "ckpt-30.gdc")
				fi, err := os.Stat(p)
				require.NoError(t, err)
				require.NoError(t, os.Truncate(p, fi.Size()-7))
				resumeAt = 20 // epoch 1
			}
			c.StopAfter = 0
			var resumed []int64
			var starts [][2]int // epoch, steps before the resume
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			got, errs := disttest.Results(t, disttest.Cluster(t, 2), func(_ int, pg *dist.ProcessGroup) (*result, error) {
				return train(ctx, pg, trainSet, test, c, hooks{
					resumed: func(r *ckpt.Resumed) { resumed = append(resumed, r.Step) },
					start:   func(epoch, from, _ int) { starts = append(starts, [2]int{epoch, from}) },
				})
			})
			for r, err := range errs {
				require.NoError(t, err, "rank %d", r)
			}
			assert.Equal(t, []int64{resumeAt}, resumed, "rank 0 resumed once, from the newest good checkpoint")
			// The progress of the resumed epoch starts at the resumed step,
			// so that its rate counts only the steps taken since.
			wantStarts := [][2]int{{2, 5}} // step 30 = epoch 2, step 5 (25 steps an epoch)
			if torn {
				wantStarts = [][2]int{{1, 20}, {2, 0}}
			}
			assert.Equal(t, wantStarts, starts)
			for r := range got {
				assert.Equal(t, want[r].Check, got[r].Check, "rank %d: bitwise the uninterrupted parameters", r)
				last := got[r].Epochs[len(got[r].Epochs)-1]
				// The ranks resume with an equal share of the loss sum: the
				// epoch's mean differs by rounding at most.
				assert.InDelta(t, want[r].Epochs[1].Loss, last.Loss, 1e-12, "rank %d: the resumed epoch's loss", r)
				assert.Equal(t, want[r].Losses[resumeAt:], got[r].Losses, "rank %d: the same losses after the resume", r)
			}
			// Periodic saves after the resume, then the final one (of the
			// same step 50, positioned after the last epoch).
			assert.Equal(t, int((50-resumeAt)/10)+1, got[0].Ckpt.Saves)

			// Running the finished job again trains nothing.
			again, errs := trainRanksErr(t, 2, trainSet, test, c)
			for r, err := range errs {
				require.NoError(t, err, "rank %d", r)
				assert.Empty(t, again[r].Epochs)
				assert.Equal(t, want[r].Check, again[r].Check)
			}
		})
	}
}

// TestResumeOtherRun: a checkpoint of another configuration is refused.
func TestResumeOtherRun(t *testing.T) {
	trainSet, test := data(t)
	trainSet = subset(trainSet, 2048)
	cfg := config{Epochs: 1, Batch: 32, LR: 1e-3, Seed: 5, MaxSteps: 4, TestLimit: 100, CkptDir: t.TempDir(), CkptEvery: 2}
	trainRanks(t, 2, trainSet, test, cfg)
	cfg.Batch = 16
	_, errs := trainRanksErr(t, 2, trainSet, test, cfg)
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
		assert.Contains(t, err.Error(), "another run")
	}
}

// TestRunDamagedCheckpoints is issue 21's first two scenarios end to end
// (a world of one): a -ckpt-dir whose every checkpoint is damaged, at
// steps above any this run reaches, makes the program fail naming each
// file rather than train again from step 0; -ckpt-fresh starts afresh,
// says so, sets the damaged files aside, and the run's own checkpoints
// are kept.
func TestRunDamagedCheckpoints(t *testing.T) {
	data(t)
	worldOne(t)
	testMaxSteps, testTestLimit = 20, 200
	t.Cleanup(func() { testMaxSteps, testTestLimit = 0, 0 })
	dir := t.TempDir()
	damaged := []string{"ckpt-100050.gdc", "ckpt-100100.gdc", "ckpt-100150.gdc"}
	for _, n := range damaged {
		require.NoError(t, os.WriteFile(filepath.Join(dir, n), []byte("\x89GDC\r\n"), 0o644)) // torn
	}
	args := []string{"-epochs", "2", "-ckpt-dir", dir, "-ckpt-every", "5"}
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), args, &stdout, &stderr)
	require.ErrorIs(t, err, ckpt.ErrDamaged, "stdout: %s", stdout.String())
	for _, n := range damaged {
		assert.Contains(t, err.Error(), n)
	}
	assert.NotContains(t, stdout.String(), "epoch 1/2", "nothing trained")

	stdout.Reset()
	err = run(context.Background(), append(args, "-ckpt-fresh"), &stdout, &stderr)
	require.NoError(t, err, "stderr: %s", stderr.String())
	assert.Contains(t, stdout.String(), "starting afresh over 3 checkpoint(s) that do not verify")
	for _, n := range damaged {
		assert.Contains(t, stdout.String(), "passed over "+filepath.Join(dir, n))
		_, err := os.Stat(filepath.Join(dir, n+".corrupt"))
		assert.NoError(t, err, "%s set aside", n)
	}
	var kept []string
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range ents {
		if filepath.Ext(e.Name()) == ".gdc" {
			kept = append(kept, e.Name())
		}
	}
	assert.ElementsMatch(t, []string{"ckpt-30.gdc", "ckpt-35.gdc", "ckpt-40.gdc"}, kept)
}
