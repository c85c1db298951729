package dist

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/internal/procjob"
)

// Multi-process tests: the test binary re-executes itself once per rank
// with childEnv set to a role; TestMain sends such a process to childMain
// instead of running tests. The ranks join over TCP (joinTCP).

// childEnv names the environment variable that makes the test binary run as
// one rank of a multi-process test instead of running tests.
const childEnv = "GDIST_DIST_TEST_CHILD"

// startJob starts n ranks of this test binary in role; their stderr goes to
// the test log.
func startJob(t *testing.T, n int, role string, env ...string) []*procjob.Proc {
	t.Helper()
	return procjob.Start(t, n, procjob.Config{RoleEnv: childEnv, Role: role, LogStderr: true,
		Env: append([]string{"GOMAXPROCS=1"}, env...)})
}

// lightEnv tells a child to skip the large vectors (under -short and the
// race detector, which makes them slow).
const lightEnv = "GDIST_DIST_TEST_LIGHT"

// TestProcessCollectives runs every collective, against the reference, in
// jobs of 2, 3 and 4 OS processes connected over TCP.
func TestProcessCollectives(t *testing.T) {
	var env []string
	if testing.Short() || raceEnabled {
		env = append(env, lightEnv+"=1")
	}
	for _, n := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			for r, p := range startJob(t, n, "collectives", env...) {
				assert.NoError(t, p.Wait(2*time.Minute), "rank %d", r)
			}
		})
	}
}

// TestProcessKill SIGKILLs one rank of a 3-rank job in the middle of a
// stream of all-reduces: each survivor's all-reduce fails within 5 s with
// a *PeerError naming it.
func TestProcessKill(t *testing.T) {
	const n, victim = 3, 2
	killMidStream(t, startJob(t, n, "kill"), victim, "peer_error rank=2 ")
}

// killMidStream waits until every rank of procs reports "running" (each
// loops on all-reduces), SIGKILLs rank victim, and requires that every
// survivor reports, within 5 s, a lost-peer *PeerError of its all-reduce
// (a line starting with prefix), then exits cleanly.
func killMidStream(t *testing.T, procs []*procjob.Proc, victim int, prefix string) {
	t.Helper()
	for r, p := range procs {
		_, err := p.Await(0, 30*time.Second, func(string) bool { return true })
		require.NoError(t, err, "rank %d did not start", r)
		require.Equal(t, "running", p.Lines()[0], "rank %d", r)
	}
	killedAt := time.Now()
	require.NoError(t, procs[victim].Kill())
	for r, p := range procs {
		if r == victim {
			continue
		}
		i, err := p.Await(1, 5*time.Second, func(string) bool { return true })
		require.NotErrorIs(t, err, procjob.ErrExited, "rank %d exited without reporting", r)
		require.NoError(t, err, "rank %d: no error 5 s after the kill", r)
		l := p.Lines()[i]
		t.Logf("rank %d after %v: %s", r, time.Since(killedAt).Round(time.Millisecond), l)
		assert.Less(t, time.Since(killedAt), 5*time.Second)
		require.True(t, strings.HasPrefix(l, prefix), "rank %d: %s", r, l)
		assert.Contains(t, l, " op=all_reduce ")
		assert.Contains(t, l, " lost=true")
	}
	for r, p := range procs {
		if r != victim {
			assert.NoError(t, p.Wait(time.Minute), "rank %d", r)
		}
	}
}

// childMain runs one rank of a multi-process test and returns the exit code.
func childMain(role string) int {
	if role == "fail" {
		return childFail(os.Getenv(scenarioEnv))
	}
	if role == "hier" { // hier_process_test.go
		return childHier()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g, err := joinTCP(ctx, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "join:", err)
		return 1
	}
	defer g.Close()
	switch role {
	case "collectives":
		return childCollectives(g)
	case "kill":
		return childKill(g)
	}
	fmt.Fprintln(os.Stderr, "unknown child role", role)
	return 2
}

// recorder collects assertion failures in a child process.
type recorder struct {
	mu     sync.Mutex
	failed []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = append(r.failed, fmt.Sprintf(format, args...))
}

func (r *recorder) FailNow() { panic("FailNow: " + strings.Join(r.failed, "; ")) }

func childCollectives(g *ProcessGroup) int {
	n, r := g.WorldSize(), g.Rank()
	if g.LocalRank() != r {
		fmt.Fprintf(os.Stderr, "LocalRank %d, want %d\n", g.LocalRank(), r)
		return 1
	}
	lengths := []int{0, 1, n - 1, 7, 333, 100003}
	if os.Getenv(lightEnv) != "" {
		lengths = lengths[:4]
	}
	return childCheck(g, lengths, checkRank)
}

// childCheck runs check on this rank for every length and reports what
// failed on stderr: exit status 1 if anything did.
func childCheck(g *ProcessGroup, lengths []int, check func(t require.TestingT, g *ProcessGroup, n, r, length int) error) int {
	rec := &recorder{}
	n, r := g.WorldSize(), g.Rank()
	for _, length := range lengths {
		if err := check(rec, g, n, r, length); err != nil {
			fmt.Fprintln(os.Stderr, "collective failed:", err)
			return 1
		}
	}
	for _, f := range rec.failed {
		fmt.Fprintln(os.Stderr, f)
	}
	if len(rec.failed) > 0 {
		return 1
	}
	return 0
}

func childKill(g *ProcessGroup) int {
	d := make([]float32, 1<<18)
	for i := 0; ; i++ {
		if i == 3 {
			fmt.Println("running")
		}
		err := g.AllReduce(context.Background(), F32(d), Sum)
		if err == nil {
			continue
		}
		var pe *PeerError
		if errors.As(err, &pe) {
			fmt.Printf("peer_error rank=%d op=%s lost=%v err=%q\n", pe.Rank, pe.Op, errors.Is(err, ErrPeerLost), err)
		} else {
			fmt.Printf("other_error %q\n", err)
		}
		return 0
	}
}
