package parallel_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist"
	"github.com/gdist/gdist/dist/parallel"
	"github.com/gdist/gdist/internal/procjob"
)

// The compositions with the ranks as OS processes: the test binary
// re-executes itself once per rank with childEnv set to a role; TestMain
// sends such a process to childMain, which joins the job with
// gdist.InitFromEnv (shared memory between the processes of this host).

// childEnv names the environment variable that makes the test binary run as
// one rank of a multi-process test; its value is the role.
const childEnv = "GDIST_PARALLEL_TEST_CHILD"

// processSteps is how many steps the processes train: few enough that 8
// ranks on 2 cores finish in seconds.
const processSteps = 20

// TestProcessCompositions trains DP×TP, DP×PP and PP×TP on 4 OS processes
// and DP×PP×TP on 8 (GOMAXPROCS=1 each), in float64, and checks on rank 0
// that every step's loss and the final parameters, gathered from every
// rank, equal the single-process model's to 1e-10.
func TestProcessCompositions(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	transports := []string{"tcp"}
	if runtime.GOOS == "linux" {
		transports = append(transports, "shm")
	}
	for _, tr := range transports {
		for _, l := range []parallel.Layout{{DP: 2, PP: 1, TP: 2}, {DP: 2, PP: 2, TP: 1}, {DP: 1, PP: 2, TP: 2}, {DP: 2, PP: 2, TP: 2}} {
			t.Run(fmt.Sprintf("%s/dp%d_pp%d_tp%d", tr, l.DP, l.PP, l.TP), func(t *testing.T) {
				processComposition(t, l, tr)
			})
		}
	}
}

// processComposition runs TestProcessCompositions's layout l over
// transport tr.
func processComposition(t *testing.T, l parallel.Layout, tr string) {
	start := time.Now()
	procs := procjob.Start(t, l.DP*l.PP*l.TP, procjob.Config{RoleEnv: childEnv, LogStderr: true,
		Role: fmt.Sprintf("train %d %d %d", l.DP, l.PP, l.TP), Env: []string{"GOMAXPROCS=1", gdist.EnvTransport + "=" + tr}})
	for r, p := range procs {
		require.NoError(t, p.Wait(3*time.Minute), "rank %d", r)
		assert.Contains(t, p.Lines(), "ok", "rank %d", r)
	}
	m := resultRE.FindStringSubmatch(procs[0].Output())
	require.NotNil(t, m, "rank 0 printed no result:\n%s", procs[0].Output())
	loss, _ := strconv.ParseFloat(m[1], 64)
	params, _ := strconv.ParseFloat(m[2], 64)
	t.Logf("%v over %s on %d processes in %.1fs: %d steps, largest relative difference from one process: loss %.3g, parameters %.3g",
		l, tr, len(procs), time.Since(start).Seconds(), processSteps, loss, params)
	assert.LessOrEqual(t, loss, 1e-10)
	assert.LessOrEqual(t, params, 1e-10)
}

var resultRE = regexp.MustCompile(`(?m)^loss ([0-9.e+-]+) params ([0-9.e+-]+)$`)

// childMain runs one rank of TestProcessCompositions ("train DP PP TP")
// and returns its exit code.
func childMain(role string) int {
	var l parallel.Layout
	if _, err := fmt.Sscanf(role, "train %d %d %d", &l.DP, &l.PP, &l.TP); err != nil {
		fmt.Fprintln(os.Stderr, "unknown child role", role)
		return 2
	}
	if err := trainChild(l); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		return 1
	}
	fmt.Println("ok")
	return 0
}

// trainChild trains testConfig on l and, on rank 0, prints the largest
// relative difference of the losses and of the final parameters from the
// single-process model's.
func trainChild(l parallel.Layout) error {
	const batch = 4
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pg, err := gdist.InitFromEnv(ctx)
	if err != nil {
		return err
	}
	defer pg.Close()
	cfg := testConfig()
	tr, err := parallel.NewTrainer(ctx, pg, cfg, l, batch, parallel.WithMicroBatches(2/l.DP))
	if err != nil {
		return err
	}
	defer tr.Close()
	ins, tgs := batches(processSteps, batch, cfg.Ctx, cfg.Vocab)
	losses := make([]float64, processSteps)
	for s := range processSteps {
		if losses[s], err = tr.Step(ctx, ins[s], tgs[s]); err != nil {
			return err
		}
	}
	got, err := tr.Weights(ctx)
	if err != nil {
		return err
	}
	if pg.Rank() != 0 {
		return nil
	}
	wantLoss, want, err := referenceRun(cfg, batch, processSteps)
	if err != nil {
		return err
	}
	lossDiff := 0.0
	for s := range losses {
		lossDiff = max(lossDiff, math.Abs(losses[s]-wantLoss[s])/wantLoss[s])
	}
	params, err := relDiff(got, want)
	if err != nil {
		return err
	}
	fmt.Printf("loss %g params %g\n", lossDiff, params)
	return nil
}
