package dist

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport/tcp"
	"github.com/gdist/gdist/internal/launch"
	"github.com/gdist/gdist/internal/procjob"
)

// The four failure scenarios of the first-cause-wins rule, each with OS
// processes over TCP: SIGKILL in the middle of an all-reduce, a frozen rank
// (SIGSTOP), a desync followed at once by Close, and a cancellation on two
// ranks at once. Every survivor must name the right rank and kind, and no
// survivor may blame a healthy rank that only closed after failing. Each
// child closes its group as soon as its collective fails (as `defer
// g.Close()` does), which is what used to let a bare "peer closed" win.
//
// GDIST_FAILURE_REPS sets the repetitions of each scenario (default 2, 1
// under -short); the stress programs run hundreds.

const (
	scenarioEnv = "GDIST_DIST_TEST_SCENARIO"
	failVictim  = 1
	failWorld   = 3
	// failHeartbeat is the heartbeat timeout of the freeze scenario's
	// transports (the default is far longer).
	failHeartbeat = 2 * time.Second
	// In scenario "freeze-late-<rank>" that rank's heartbeat timeout is
	// lateHeartbeat: it learns of the frozen rank only from the other
	// survivor's notice, while it still has the frozen rank's link open.
	lateScenario  = "freeze-late-"
	lateHeartbeat = 3 * failHeartbeat
)

func failureReps(t *testing.T) int {
	if v := os.Getenv("GDIST_FAILURE_REPS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "GDIST_FAILURE_REPS")
		return n
	}
	if testing.Short() {
		return 1
	}
	return 2
}

// failResult is what a child reports about the error its collective got.
type failResult struct {
	peer    int    // the *PeerError's rank, or -1
	kind    string // the *AbortError's kind, or "none"
	culprit int    // the *AbortError's culprit, or -1
	desync  bool   // errors.Is(err, ErrDesync)
	closed  bool   // errors.Is(err, ErrPeerClosed)
	line    string
}

func parseResult(t *testing.T, line string) failResult {
	t.Helper()
	r := failResult{line: line}
	fields := map[string]string{}
	for _, f := range strings.Fields(strings.SplitN(line, " err=", 2)[0]) {
		if k, v, ok := strings.Cut(f, "="); ok {
			fields[k] = v
		}
	}
	var err error
	r.peer, err = strconv.Atoi(fields["peer"])
	require.NoError(t, err, line)
	r.culprit, err = strconv.Atoi(fields["culprit"])
	require.NoError(t, err, line)
	r.kind = strings.ReplaceAll(fields["kind"], "_", " ")
	r.desync, r.closed = fields["desync"] == "true", fields["closed"] == "true"
	return r
}

// runScenario starts a job in scenario, lets act disturb it once every rank
// runs, and returns each rank's result (nil for a rank that reported none).
func runScenario(t *testing.T, scenario string, act func(procs []*procjob.Proc)) map[int]failResult {
	t.Helper()
	procs := startJob(t, failWorld, "fail", scenarioEnv+"="+scenario)
	for r, p := range procs {
		_, err := p.Await(0, 60*time.Second, func(l string) bool { return l == "running" })
		require.NoError(t, err, "rank %d did not start: %s", r, p.Stderr())
	}
	start := time.Now()
	act(procs)
	out := map[int]failResult{}
	for r, p := range procs {
		if scenario != "desync" && scenario != "cancel" && r == failVictim {
			continue
		}
		i, err := p.Await(0, 30*time.Second, func(l string) bool { return strings.HasPrefix(l, "result ") })
		require.NoError(t, err, "rank %d reported nothing: %s", r, p.Stderr())
		res := parseResult(t, p.Lines()[i])
		t.Logf("rank %d after %v: %s", r, time.Since(start).Round(time.Millisecond), res.line)
		out[r] = res
	}
	return out
}

func TestProcessFailureScenarios(t *testing.T) {
	reps := failureReps(t)
	t.Run("sigkill", func(t *testing.T) {
		for range reps {
			res := runScenario(t, "loop", func(procs []*procjob.Proc) {
				require.NoError(t, procs[failVictim].Kill())
			})
			for r, x := range res {
				assert.Equal(t, failVictim, x.peer, "rank %d: %s", r, x.line)
				assert.Equal(t, failVictim, x.culprit, "rank %d: %s", r, x.line)
				assert.Equal(t, "lost", x.kind, "rank %d: %s", r, x.line)
				assert.False(t, x.closed, "rank %d blames a closed rank: %s", r, x.line)
			}
		}
	})
	t.Run("freeze", func(t *testing.T) {
		for range reps {
			var stopped time.Time
			res := runScenario(t, "freeze", func(procs []*procjob.Proc) {
				pid := childPID(t, procs[failVictim])
				require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
				stopped = time.Now()
				t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
			})
			t.Logf("reported within %v of SIGSTOP (heartbeat timeout %v)", time.Since(stopped).Round(time.Millisecond), failHeartbeat)
			for r, x := range res {
				assert.Equal(t, failVictim, x.peer, "rank %d: %s", r, x.line)
				assert.Equal(t, failVictim, x.culprit, "rank %d: %s", r, x.line)
				assert.Equal(t, "frozen", x.kind, "rank %d: %s", r, x.line)
				assert.False(t, x.closed, "rank %d blames a closed rank: %s", r, x.line)
			}
		}
	})
	t.Run("freeze-learned-late", func(t *testing.T) {
		// The ring runs 0 -> 1 -> 2 -> 0 and rank 1 freezes. One survivor
		// (timeout 6 s) learns of it only from the other's notice (timeout
		// 2 s) and must report it, after its Close, within about one
		// heartbeat interval of the notifier, not after lingering in
		// Close for the frozen rank's goodbye (5 s) or after its own
		// timeout. Late rank 2 waits for rank 1 with its chunk pending on
		// the link to the notifier; late rank 0 sends its chunks to the
		// frozen rank (and waits for rank 2's).
		for _, late := range []int{2, 0} {
			notifier := 2 - late
			t.Run(fmt.Sprintf("late=%d", late), func(t *testing.T) {
				for range reps {
					var procs []*procjob.Proc
					res := runScenario(t, lateScenario+strconv.Itoa(late), func(ps []*procjob.Proc) {
						procs = ps
						pid := childPID(t, ps[failVictim])
						require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
						t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
					})
					for r, x := range res {
						assert.Equal(t, failVictim, x.culprit, "rank %d: %s", r, x.line)
						assert.Equal(t, "frozen", x.kind, "rank %d: %s", r, x.line)
					}
					failed, closed := map[int]time.Time{}, map[int]time.Time{}
					for _, r := range []int{notifier, late} {
						i, err := procs[r].Await(0, 30*time.Second, func(l string) bool { return strings.HasPrefix(l, "timing ") })
						require.NoError(t, err, "rank %d: %s", r, procs[r].Stderr())
						var f, c int64
						_, err = fmt.Sscanf(procs[r].Lines()[i], "timing failed=%d closed=%d", &f, &c)
						require.NoError(t, err)
						failed[r], closed[r] = time.Unix(0, f), time.Unix(0, c)
					}
					lag := closed[late].Sub(failed[notifier])
					t.Logf("rank %d failed; rank %d failed %v and finished Close %v later (rank %d's Close took %v)",
						notifier, late, failed[late].Sub(failed[notifier]).Round(time.Millisecond), lag.Round(time.Millisecond),
						notifier, closed[notifier].Sub(failed[notifier]).Round(time.Millisecond))
					assert.Less(t, lag, time.Second, "rank %d reports the failure long after rank %d knew it", late, notifier)
				}
			})
		}
	})
	t.Run("desync-close", func(t *testing.T) {
		for range reps {
			res := runScenario(t, "desync", func([]*procjob.Proc) {})
			for r, x := range res {
				assert.True(t, x.desync, "rank %d: %s", r, x.line)
				assert.Equal(t, "desync", x.kind, "rank %d: %s", r, x.line)
				assert.False(t, x.closed, "rank %d blames a closed rank: %s", r, x.line)
			}
		}
	})
	t.Run("cancel-both", func(t *testing.T) {
		for range reps {
			res := runScenario(t, "cancel", func([]*procjob.Proc) {})
			for r, x := range res {
				assert.Equal(t, "cancelled", x.kind, "rank %d: %s", r, x.line)
				assert.Contains(t, []int{0, 1}, x.culprit, "rank %d: %s", r, x.line)
				assert.False(t, x.closed, "rank %d blames a closed rank: %s", r, x.line)
			}
		}
	})
}

func childPID(t *testing.T, p *procjob.Proc) int {
	for _, l := range p.Lines() {
		if v, ok := strings.CutPrefix(l, "pid "); ok {
			pid, err := strconv.Atoi(v)
			require.NoError(t, err)
			return pid
		}
	}
	t.Fatal("no pid line")
	return 0
}

// childFail runs one rank of a failure scenario: a loop of 1M-element
// all-reduces that ends at the first error, which it reports as a result
// line before closing the group at once.
func childFail(scenario string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fmt.Printf("pid %d\n", os.Getpid())
	var (
		g   *ProcessGroup
		err error
	)
	switch scenario {
	case "stall":
		return childStall(ctx)
	case "freeze":
		g, err = joinTCP(ctx, failHeartbeat)
	case lateScenario + "0", lateScenario + "2":
		hb := failHeartbeat
		if os.Getenv(launch.EnvRank) == strings.TrimPrefix(scenario, lateScenario) {
			hb = lateHeartbeat
		}
		g, err = joinTCP(ctx, hb)
	default:
		g, err = joinTCP(ctx, 0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "init:", err)
		return 1
	}
	defer g.Close()
	n := 1 << 20
	if scenario == "cancel" {
		n = 1 << 16 // many collectives a second: the cancellations land in one
	}
	d := make([]float32, n+1)
	opCtx, opCancel := context.WithCancel(context.Background())
	defer opCancel()
	for i := 0; ; i++ {
		if i == 3 {
			fmt.Println("running")
		}
		if scenario == "cancel" && i == 20 {
			// Ranks 0 and 1 cancel their contexts 100 ms into collective
			// #21, which rank 2 enters only after 300 ms: both
			// cancellations land while their collectives wait.
			if g.Rank() == 2 {
				time.Sleep(300 * time.Millisecond)
			} else {
				time.AfterFunc(100*time.Millisecond, opCancel)
			}
		}
		buf := d[:n]
		if scenario == "desync" && i == 5 && g.Rank() == failVictim {
			buf = d[:n+1]
		}
		err := g.AllReduce(opCtx, F32(buf), Sum)
		if err == nil {
			continue
		}
		failed := time.Now()
		fmt.Println(resultLine(err))
		if strings.HasPrefix(scenario, lateScenario) {
			// What a program reports, it reports after its deferred Close.
			g.Close()
			fmt.Printf("timing failed=%d closed=%d\n", failed.UnixNano(), time.Now().UnixNano())
		}
		return 0
	}
}

func resultLine(err error) string {
	peer, culprit, kind := -1, -1, "none"
	var (
		pe *PeerError
		a  *AbortError
	)
	if errors.As(err, &pe) {
		peer = pe.Rank
	}
	if errors.As(err, &a) {
		culprit, kind = a.Rank, strings.ReplaceAll(a.Kind.String(), " ", "_")
	}
	return fmt.Sprintf("result peer=%d culprit=%d kind=%s desync=%v closed=%v err=%q",
		peer, culprit, kind, errors.Is(err, ErrDesync), errors.Is(err, ErrPeerClosed), err)
}

// joinTCP joins the job procjob started (RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT, GDIST_TOKEN) over the TCP transport, with
// heartbeat timeout hb (0: the transport's default). (gdist.InitFromEnv,
// which package dist cannot import, joins over the hybrid transport:
// process_hybrid_test.go runs the same checks through it.)
func joinTCP(ctx context.Context, hb time.Duration) (*ProcessGroup, error) {
	rank, err := strconv.Atoi(os.Getenv(launch.EnvRank))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", launch.EnvRank, err)
	}
	world, err := strconv.Atoi(os.Getenv(launch.EnvWorldSize))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", launch.EnvWorldSize, err)
	}
	local, err := strconv.Atoi(os.Getenv(launch.EnvLocalRank))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", launch.EnvLocalRank, err)
	}
	addr := net.JoinHostPort(os.Getenv(launch.EnvMasterAddr), os.Getenv(launch.EnvMasterPort))
	topts := []tcp.Option{tcp.WithToken([]byte(os.Getenv(launch.EnvToken))), tcp.WithListenAddr("127.0.0.1:0")}
	if hb > 0 {
		topts = append(topts, tcp.WithHeartbeat(hb/8, hb))
	}
	t, err := tcp.Rendezvous(ctx, rank, world, addr, topts...)
	if err != nil {
		return nil, err
	}
	g, err := New(t, WithLocalRank(local))
	if err != nil {
		t.Close()
	}
	return g, err
}

// TestProcessStallReport: OS processes over TCP, no timeout set. Rank 2
// enters collective #5 3.5 s late; with GDIST_STALL_THRESHOLD=1s the other
// ranks log a stall report naming rank 2 and where it is, once per second,
// and the collective then completes.
func TestProcessStallReport(t *testing.T) {
	if testing.Short() {
		t.Skip("takes 4 s")
	}
	procs := procjob.Start(t, failWorld, procjob.Config{RoleEnv: childEnv, Role: "fail",
		Env: []string{"GOMAXPROCS=1", scenarioEnv + "=stall", EnvStallThreshold + "=1s"}})
	for r, p := range procs {
		require.NoError(t, p.Wait(time.Minute), "rank %d: %s", r, p.Stderr())
	}
	for r := range 2 {
		errOut := procs[r].Stderr()
		t.Logf("rank %d stderr:\n%s", r, errOut)
		n := strings.Count(errOut, "stalled: waiting")
		assert.True(t, n >= 2 && n <= 4, "rank %d: %d reports", r, n)
		// "1.0 s ago" may read 0.9 s on a loaded machine: the peer's clock
		// is estimated from when its progress report arrived.
		assert.Regexp(t, `dist: all_reduce #5 stalled: waiting 1(\.\d)?s for rank 2 \(rank 2 last finished all_reduce #4, (0\.9|1\.\d) s ago\)`, errOut)
	}
	assert.NotContains(t, procs[2].Stderr(), "stalled")
}

func childStall(ctx context.Context) int {
	g, err := joinTCP(ctx, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "init:", err)
		return 1
	}
	defer g.Close()
	d := make([]float32, 1<<10)
	for i := range 6 {
		if i == 4 && g.Rank() == 2 {
			time.Sleep(3500 * time.Millisecond)
		}
		if err := g.AllReduce(ctx, F32(d), Sum); err != nil {
			fmt.Fprintln(os.Stderr, "all_reduce:", err)
			return 1
		}
	}
	return 0
}
