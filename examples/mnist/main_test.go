package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gdist/gdist"
	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/disttest"
	"github.com/gdist/gdist/internal/cli"
	"github.com/gdist/gdist/internal/mnist"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "run" {
		os.Exit(childMain())
	}
	goleak.VerifyTestMain(m)
}

var (
	dataOnce           sync.Once
	trainData, testSet *mnist.Set
	dataErr            error
)

// data loads MNIST once, skipping the test when it is not installed.
func data(t *testing.T) (train, test *mnist.Set) {
	t.Helper()
	dataOnce.Do(func() {
		var dir string
		if dir, dataErr = mnist.Locate(""); dataErr == nil {
			trainData, testSet, dataErr = mnist.Load(dir)
		}
	})
	if errors.Is(dataErr, mnist.ErrNotFound) {
		t.Skipf("MNIST data not found: %v", dataErr)
	}
	require.NoError(t, dataErr)
	return trainData, testSet
}

// subset returns the first n images of s (sharing its storage).
func subset(s *mnist.Set, n int) *mnist.Set {
	p := s.Pixels()
	return &mnist.Set{Images: s.Images[:n*p], Labels: s.Labels[:n], N: n, Rows: s.Rows, Cols: s.Cols}
}

// trainRanks runs train on n in-process ranks and returns their results.
func trainRanks(t *testing.T, n int, trainSet, test *mnist.Set, cfg config) []*result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A failing rank closes its group, so its peers fail, not hang.
	res, errs := disttest.Results(t, disttest.Cluster(t, n), func(_ int, pg *dist.ProcessGroup) (*result, error) {
		return train(ctx, pg, trainSet, test, cfg, hooks{})
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	return res
}

func mean(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

// TestTrainTwoRanks trains on two in-process ranks for a few steps and
// checks that the ranks end with identical parameters and that they learn.
func TestTrainTwoRanks(t *testing.T) {
	train, test := data(t)
	for _, compress := range []string{"", "bf16"} {
		t.Run("compress="+compress, func(t *testing.T) {
			cfg := config{Epochs: 2, Batch: 32, LR: 1e-3, Seed: 3, Compress: compress, BucketCap: 256 << 10,
				MaxSteps: 25, TestLimit: 1500}
			res := trainRanks(t, 2, subset(train, 4096), test, cfg)
			for r, rr := range res {
				assert.True(t, rr.Identical, "rank %d", r)
				require.Len(t, rr.Epochs, 2)
				require.Len(t, rr.Losses, 50)
				first, last := mean(rr.Losses[:5]), mean(rr.Losses[45:])
				t.Logf("rank %d: loss %.3f -> %.3f; epochs %.3f, %.3f", r, first, last, rr.Epochs[0].Loss, rr.Epochs[1].Loss)
				assert.Less(t, last, first*0.6, "rank %d learns", r)
				assert.Less(t, rr.Epochs[1].Loss, rr.Epochs[0].Loss)
			}
			assert.Equal(t, res[0].Check, res[1].Check, "bitwise identical parameters")
			assert.Equal(t, res[0].Epochs[1].Loss, res[1].Epochs[1].Loss, "the epoch loss is averaged over the ranks")
			assert.Greater(t, res[0].Epochs[1].Acc, 0.75, "rank 0 evaluates")
			assert.True(t, math.IsNaN(res[1].Epochs[1].Acc), "only rank 0 evaluates")
			// Each rank saw its own data: the per-step losses differ.
			assert.NotEqual(t, res[0].Losses, res[1].Losses)
		})
	}
}

// TestRunWorldOne runs the program end to end without a launcher (a world
// of one), with a plot.
func TestRunWorldOne(t *testing.T) {
	data(t)
	for _, v := range []string{"RANK", "WORLD_SIZE", "MASTER_ADDR", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"} {
		if _, ok := os.LookupEnv(v); ok {
			t.Skipf("%s is set: the test needs a world of one", v)
		}
	}
	testMaxSteps, testTestLimit = 20, 1000
	t.Cleanup(func() { testMaxSteps, testTestLimit = 0, 0 })
	png := filepath.Join(t.TempDir(), "loss.png")
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"-epochs", "2", "-plot", png}, &stdout, &stderr)
	require.NoError(t, err, "stderr: %s", stderr.String())
	out := stdout.String()
	t.Log(out)
	assert.Contains(t, out, "epoch 2/2")
	assert.Contains(t, out, "parameters identical on all 1 ranks")
	assert.Contains(t, stderr.String(), "epoch 1/2  75%", "sparse progress lines when stderr is not a terminal")
	assert.NotContains(t, stderr.String(), "\r")
	fi, err := os.Stat(png)
	require.NoError(t, err)
	assert.Positive(t, fi.Size())
}

func TestRunMissingData(t *testing.T) {
	var stdout, stderr bytes.Buffer
	dir := filepath.Join(t.TempDir(), "nothing-here")
	err := run(context.Background(), []string{"-data", dir}, &stdout, &stderr)
	require.ErrorIs(t, err, mnist.ErrNotFound)
	assert.Contains(t, err.Error(), dir, "names where it looked")
	assert.Contains(t, err.Error(), "-data", "names the flag")
}

func TestRunBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-compress", "int8"}, {"-bucket-cap", "-1"}, {"-max-steps", "-1"}, {"-nope"}, {"extra"}} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), args, &stdout, &stderr)
		assert.ErrorIs(t, err, errUsage, "%q", args)
	}
}

// TestHelp: -h and -help print the usage and exit 0 without running.
func TestHelp(t *testing.T) {
	for _, h := range []string{"-h", "-help"} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), []string{h}, &stdout, &stderr)
		assert.Equal(t, 0, cli.ExitCode("mnist", errUsage, err, &stderr), h)
		assert.Contains(t, stderr.String(), "-epochs int", h)
		assert.Empty(t, stdout.String(), "%s runs nothing", h)
	}
}

func TestPlainProgress(t *testing.T) {
	var buf bytes.Buffer
	p := newProgress(&buf, false, 2, 3, 0, 10, 64)
	for i := 1; i <= 10; i++ {
		p.step(i, 1/float64(i))
	}
	p.finish()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 3, "%q", buf.String())
	assert.True(t, strings.HasPrefix(lines[0], "epoch 2/3  30% (3/10 steps)"), lines[0])
	assert.True(t, strings.HasPrefix(lines[2], "epoch 2/3  80% (8/10 steps)"), lines[2])
	assert.Contains(t, lines[1], "samples/s")
}

// TestPlainProgressAfterResume: after a resume at step 900 of 1000, the
// rate counts the 100 steps taken since, not the 900 done before, against
// the time since the progress started (once 1395945 samples/s).
func TestPlainProgressAfterResume(t *testing.T) {
	var buf bytes.Buffer
	p := newProgress(&buf, false, 1, 3, 900, 1000, 64).(*plainProgress)
	start := p.begin
	for i := 901; i <= 1000; i++ {
		p.now = func() time.Time { return start.Add(time.Duration(i-900) * 10 * time.Millisecond) } // 10 ms a step
		p.step(i, 0.5)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 1, "%q", buf.String())
	// 901 crosses 25%, 50% and 75% at once; 64 samples every 10 ms.
	assert.Equal(t, "epoch 1/3  90% (901/1000 steps)  loss 0.5000  6400 samples/s", lines[0])
}

// TestBarProgressAfterResume: on a terminal the bar covers the steps left
// and says where the epoch resumed.
func TestBarProgressAfterResume(t *testing.T) {
	var buf bytes.Buffer
	p := newProgress(&buf, true, 1, 3, 900, 1000, 64).(*barProgress)
	assert.Equal(t, int64(100*64), p.bar.GetMax64())
	assert.Equal(t, "epoch 1/3 (resumed at step 900)", p.desc)
	p.finish()
}

// worldOne skips the test unless the environment describes no job.
func worldOne(t *testing.T) {
	t.Helper()
	for _, v := range []string{"RANK", "WORLD_SIZE", "MASTER_ADDR", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"} {
		if _, ok := os.LookupEnv(v); ok {
			t.Skipf("%s is set: the test needs a world of one", v)
		}
	}
}

// TestRunTimeline: GDIST_TIMELINE under a directory that does not exist is
// written (the directory created), and -max-steps bounds the epoch.
func TestRunTimeline(t *testing.T) {
	data(t)
	worldOne(t)
	testTestLimit = 200
	t.Cleanup(func() { testTestLimit = 0 })
	tl := filepath.Join(t.TempDir(), "out", "timeline.json")
	t.Setenv(gdist.EnvTimeline, tl)
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"-epochs", "1", "-max-steps", "5"}, &stdout, &stderr)
	require.NoError(t, err, "stderr: %s", stderr.String())
	assert.Contains(t, stdout.String(), "(5 steps in ")
	fi, err := os.Stat(filepath.Join(filepath.Dir(tl), "timeline.rank0.json"))
	require.NoError(t, err)
	assert.Positive(t, fi.Size())
}

// TestRunReportsCloseError: when the group cannot write its timeline at
// Close (its directory replaced by a file during training), the program
// fails with that error instead of exiting 0 with nothing written.
func TestRunReportsCloseError(t *testing.T) {
	data(t)
	worldOne(t)
	testTestLimit = 200
	t.Cleanup(func() { testTestLimit = 0 })
	out := filepath.Join(t.TempDir(), "out")
	t.Setenv(gdist.EnvTimeline, filepath.Join(out, "timeline.json"))
	swapped := make(chan error, 1)
	go func() { // once the group has created the directory, make it a file
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if st, err := os.Stat(out); err == nil && st.IsDir() {
				if err := os.Remove(out); err != nil {
					swapped <- err
					return
				}
				swapped <- os.WriteFile(out, nil, 0o644)
				return
			}
		}
		swapped <- errors.New("the directory never appeared")
	}()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"-epochs", "1", "-max-steps", "20"}, &stdout, &stderr)
	require.NoError(t, <-swapped)
	require.Error(t, err)
	// The swap removes the directory before it writes the file: the group
	// finds either no directory or a file in its place, an error both ways.
	assert.Regexp(t, `timeline: (writing|cannot write) `+regexp.QuoteMeta(filepath.Join(out, "timeline.rank0.json")), err.Error())
	assert.Equal(t, 1, cli.ExitCode("mnist", errUsage, err, io.Discard), "exits non-zero")
}
