package pipeline

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist"
	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/internal/procjob"
)

// childEnv names the environment variable that makes the test binary run as
// one rank of a multi-process test instead of running tests; its value is
// the role. The model, micro-batch count and schedule come from
// childModelEnv, childMicroEnv and childSchedEnv.
const (
	childEnv      = "GDIST_PIPELINE_TEST_CHILD"
	childModelEnv = "GDIST_PIPELINE_TEST_MODEL"
	childMicroEnv = "GDIST_PIPELINE_TEST_MICRO"
	childSchedEnv = "GDIST_PIPELINE_TEST_SCHED"
)

// Exit codes of a child.
const (
	exitOK        = 0
	exitFailed    = 1
	exitPeerError = 3
)

func childModel() (testModel, int) {
	if os.Getenv(childModelEnv) == "transformer" {
		return transformerModel(tinyConfig), 4
	}
	return mlpModel(testSizes, tensor.Float64), 8
}

// childMain runs one rank of a multi-process test:
//
//	train: two SGD steps through the pipeline, then Infer; checks this
//	       stage's gradients (and on the last stage the loss and outputs)
//	       against one process computing the whole model, prints "ok".
//	loop:  trains until something fails, printing "step N" after each step;
//	       on failure prints the error and exits with exitPeerError if it is a
//	       *dist.PeerError ("peer <rank>"), exitFailed otherwise.
func childMain(role string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pg, err := gdist.InitFromEnv(ctx)
	if err != nil {
		fmt.Println("init:", err)
		return exitFailed
	}
	defer pg.Close()
	tm, batch := childModel()
	m, _ := strconv.Atoi(os.Getenv(childMicroEnv))
	sched, err := ParseSchedule(os.Getenv(childSchedEnv))
	if err != nil || m < 1 {
		fmt.Println("bad child env:", err, m)
		return exitFailed
	}
	switch role {
	case "train":
		if err := childTrain(ctx, pg, tm, batch, m, sched); err != nil {
			fmt.Println("FAIL:", err)
			return exitFailed
		}
		fmt.Println("ok")
		return exitOK
	case "loop":
		err := childLoop(ctx, pg, tm, batch, m, sched)
		fmt.Println("error:", err)
		var pe *dist.PeerError
		if errors.As(err, &pe) {
			fmt.Printf("peer %d lost=%t\n", pe.Rank, errors.Is(err, dist.ErrPeerLost))
			return exitPeerError
		}
		return exitFailed
	}
	fmt.Println("unknown child role", role)
	return 2
}

func childTrain(ctx context.Context, pg *dist.ProcessGroup, tm testModel, batch, m int, sched Schedule) error {
	const steps, lr = 2, 0.1
	ref, err := reference(tm, batch, steps, lr)
	if err != nil {
		return err
	}
	res, _, err := trainStages(ctx, pg, tm, m, batch/m, steps, lr, WithSchedule(sched))
	if err != nil {
		return err
	}
	// This stage's parameters are a contiguous run of the reference's.
	p, s := pg.WorldSize(), pg.Rank()
	offset := 0
	for q := range s {
		offset += len(stageParams(tm, p, q, batch/m))
	}
	refMine := ref
	refMine.grads = ref.grads[offset : offset+len(res.grads)]
	if s != p-1 {
		refMine.loss = res.loss // only the last stage has the loss
	}
	worst, err := compareTraining(res.grads, res, refMine, 1e-12)
	if err != nil {
		return err
	}
	fmt.Printf("stage %d: max |grad - single process| = %.3g\n", s, worst)

	// Inference through the same kind of pipeline, bitwise equal to one
	// process running the same micro-batches.
	micro, err := referenceInfer(tm, batch/m, m)
	if err != nil {
		return err
	}
	pl, err := New(ctx, pg, tm.stageBuilder(p, s, batch/m), WithMicroBatches(m), WithTraining(false))
	if err != nil {
		return err
	}
	defer pl.Close()
	var got []float64
	if err := pl.Infer(ctx, tm.Data(0, batch/m, func(mb int, o *tensor.Dense) error {
		got = append(got, o.Data().([]float64)...)
		return nil
	})); err != nil {
		return err
	}
	if pl.IsLast() {
		if len(got) != len(micro) {
			return fmt.Errorf("infer: %d outputs, want %d", len(got), len(micro))
		}
		for i := range got {
			if got[i] != micro[i] {
				return fmt.Errorf("infer: output %d is %v, one process says %v", i, got[i], micro[i])
			}
		}
	}
	return nil
}

// stageParams returns the learnables of stage q of p (built in a scratch
// graph).
func stageParams(tm testModel, p, q, n int) []string {
	buildMu.Lock()
	defer buildMu.Unlock()
	st, err := tm.stageBuilder(p, q, n)(gorgonia.NewGraph())
	if err != nil {
		panic(err)
	}
	var names []string
	for _, l := range st.Learnables() {
		names = append(names, l.Name())
	}
	return names
}

func childLoop(ctx context.Context, pg *dist.ProcessGroup, tm testModel, batch, m int, sched Schedule) error {
	pl, err := New(ctx, pg, tm.stageBuilder(pg.WorldSize(), pg.Rank(), batch/m),
		WithMicroBatches(m), WithLoss(tm.Loss), WithSchedule(sched))
	if err != nil {
		return err
	}
	defer pl.Close()
	for step := 0; ; step++ {
		if _, err := pl.TrainStep(ctx, tm.Data(step, batch/m, nil)); err != nil {
			return err
		}
		pl.ZeroGrad()
		fmt.Printf("step %d\n", step)
	}
}

// ---- parent side ----

// spawn starts n ranks of the test binary in the given role.
func spawn(t *testing.T, n int, role, model string, m int, sched Schedule) []*procjob.Proc {
	t.Helper()
	return procjob.Start(t, n, procjob.Config{RoleEnv: childEnv, Role: role, MergeStderr: true,
		Env: []string{childModelEnv + "=" + model, childMicroEnv + "=" + strconv.Itoa(m),
			childSchedEnv + "=" + sched.String(), "GOMAXPROCS=1"}})
}

func TestProcessesTrainAndInfer(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	cases := []struct {
		model string
		n, m  int
		sched Schedule
	}{
		{"mlp", 2, 4, GPipe},
		{"mlp", 3, 8, OneFOneB},
		{"transformer", 2, 2, OneFOneB},
		{"transformer", 3, 4, GPipe},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%s/p%d/m%d/%v", tc.model, tc.n, tc.m, tc.sched), func(t *testing.T) {
			children := spawn(t, tc.n, "train", tc.model, tc.m, tc.sched)
			for r, c := range children {
				if err := c.Wait(90 * time.Second); errors.Is(err, procjob.ErrTimeout) {
					t.Fatalf("rank %d did not finish; output:\n%s", r, c.Output())
				}
				require.Equal(t, 0, c.ExitCode(), "rank %d output:\n%s", r, c.Output())
				assert.Contains(t, c.Output(), "ok", "rank %d", r)
				t.Logf("rank %d: %s", r, strings.ReplaceAll(strings.TrimSpace(c.Output()), "\n", "; "))
			}
		})
	}
}

// TestProcessesKilledStage kills one rank of a 3-stage pipeline over TCP
// with SIGKILL while it trains: the others must exit with a
// *dist.PeerError (dist.ErrPeerLost) within 5 s. The rank it names is the
// first whose connection a process saw break: the victim, or a rank that
// had already exited because of it.
func TestProcessesKilledStage(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	for _, victim := range []int{2, 1} {
		t.Run(fmt.Sprintf("victim%d", victim), func(t *testing.T) {
			const n = 3
			children := spawn(t, n, "loop", "mlp", 4, GPipe)
			// Wait until every rank has trained a few steps.
			for r, c := range children {
				_, err := c.Await(0, 60*time.Second, func(line string) bool {
					var s int
					_, err := fmt.Sscanf(line, "step %d", &s)
					return err == nil && s >= 3
				})
				require.NoError(t, err, "rank %d made no progress:\n%s", r, c.Output())
			}
			killed := time.Now()
			require.NoError(t, children[victim].Kill())
			for r, c := range children {
				if r == victim {
					<-c.Done()
					continue
				}
				if err := c.Wait(10 * time.Second); errors.Is(err, procjob.ErrTimeout) {
					t.Fatalf("rank %d still running 10 s after rank %d was killed:\n%s", r, victim, c.Output())
				}
				out := strings.TrimRight(c.Output(), "\n")
				took := c.Ended().Sub(killed)
				require.Equal(t, exitPeerError, c.ExitCode(), "rank %d output:\n%s", r, out)
				// The killed rank, or a rank that exited because of it: whichever
				// connection the TCP transport saw break first.
				assert.Regexp(t, `peer [0-9] lost=true`, out, "rank %d", r)
				assert.NotContains(t, out, fmt.Sprintf("peer %d lost", r), "rank %d", r)
				assert.Less(t, took, 5*time.Second, "rank %d", r)
				lines := strings.Split(out, "\n")
				t.Logf("rank %d exited %v after the kill: %s", r, took, strings.Join(lines[max(0, len(lines)-2):], "; "))
			}
		})
	}
}
