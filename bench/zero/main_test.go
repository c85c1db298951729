package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/disttest"
)

// TestMain doubles as a rank: the benchmark re-executes the test binary
// with the job in the environment.
func TestMain(m *testing.M) {
	if spec, ok := os.LookupEnv(envJob); ok {
		if err := rankMain(context.Background(), spec, os.Stdout); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// TestJobCounts runs every mode on 4 in-process ranks and checks the bytes
// it reports against what the modes keep: the optimizer state and the
// gradient pieces are a quarter of DDP's, full sharding's parameters too.
func TestJobCounts(t *testing.T) {
	got := make(map[string]outcome)
	for _, mode := range modes {
		j := job{Mode: mode, Sizes: []int{64, 64, 64, 10}, Batch: 4, Steps: 2, BucketCap: 4 << 10}
		res, errs := disttest.Results(t, disttest.Cluster(t, 4, dist.WithTimeout(time.Minute)), func(_ int, pg *dist.ProcessGroup) (outcome, error) {
			return runJob(context.Background(), pg, j)
		})
		require.NoError(t, errors.Join(errs...), mode)
		got[mode] = res[0]
	}
	model := int64(4 * got["ddp"].Params)
	assert.Equal(t, model, got["ddp"].ParamBytes)
	assert.Equal(t, model, got["ddp"].GradBytes, "DDP: the dual values")
	assert.Equal(t, 2*model, got["ddp"].OptBytes)
	assert.Equal(t, model, got["ddp"].MachineGradBytes)
	for _, mode := range []string{"zero1", "zero2", "full"} {
		assert.InEpsilon(t, float64(model)/2, float64(got[mode].OptBytes), 0.05, mode)
		assert.InEpsilon(t, float64(model)/4, float64(got[mode].GradBytes), 0.05, mode)
		assert.Positive(t, got[mode].PeakHeap, mode)
	}
	assert.InEpsilon(t, float64(model)/4, float64(got["full"].ParamBytes), 0.05)
	assert.Positive(t, got["full"].GatheredBytes)
}

// TestBench runs the benchmark program end to end on a tiny model.
func TestBench(t *testing.T) {
	if testing.Short() {
		t.Skip("starts rank processes")
	}
	var out, errOut bytes.Buffer
	err := program(context.Background(), []string{"-ranks", "1,2", "-mem-sizes", "32,32,10", "-mem-steps", "1",
		"-time-sizes", "32,32,10", "-rounds", "3", "-warmup", "1", "-reps", "1"}, &out, &errOut)
	require.NoError(t, err, "stderr:\n%s", errOut.String())
	for _, want := range []string{"Memory per rank", "Step time on 2 ranks", "zero1", "zero2", "full"} {
		assert.Contains(t, out.String(), want)
	}
	assert.Equal(t, 8, strings.Count(out.String(), "\n      1")+strings.Count(out.String(), "\n      2"), out.String())
}

// TestTimeJob: a time job returns, on every rank, one wall and one CPU time
// per round for every mode.
func TestTimeJob(t *testing.T) {
	j := job{Modes: modes, Sizes: []int{16, 16, 4}, Batch: 2, Rounds: 4, Warmup: 1}
	res, errs := disttest.Results(t, disttest.Cluster(t, 2, dist.WithTimeout(time.Minute)), func(_ int, pg *dist.ProcessGroup) (outcome, error) {
		return runJob(context.Background(), pg, j)
	})
	require.NoError(t, errors.Join(errs...))
	for _, o := range res {
		for _, m := range modes {
			assert.Len(t, o.Wall[m], 4, m)
			assert.Len(t, o.CPU[m], 4, m)
		}
	}
}
