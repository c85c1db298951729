package dist

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Multi-process tests: the test binary re-executes itself once per rank
// with childEnv set to a role; TestMain sends such a process to childMain
// instead of running tests. The ranks join through InitFromEnv, over TCP.

// childEnv names the environment variable that makes the test binary run as
// one rank of a multi-process test instead of running tests.
const childEnv = "GDIST_DIST_TEST_CHILD"

// procJob is one multi-process job started by a test.
type procJob struct {
	cmds  []*exec.Cmd
	lines []chan string // each rank's stdout, line by line
	wg    sync.WaitGroup
}

// startJob starts n ranks of this test binary in role.
func startJob(t *testing.T, n int, role string, env ...string) *procJob {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close()) // rank 0 binds it again
	tok := make([]byte, 16)
	_, err = rand.Read(tok)
	require.NoError(t, err)
	j := &procJob{}
	for r := range n {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(),
			childEnv+"="+role,
			"GOMAXPROCS=1",
			EnvRank+"="+strconv.Itoa(r),
			EnvWorldSize+"="+strconv.Itoa(n),
			EnvLocalRank+"="+strconv.Itoa(r),
			EnvMasterAddr+"=127.0.0.1",
			EnvMasterPort+"="+strconv.Itoa(port),
			EnvToken+"="+hex.EncodeToString(tok),
		)
		cmd.Env = append(cmd.Env, env...)
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		cmd.Stderr = &prefixWriter{prefix: fmt.Sprintf("rank %d: ", r), t: t}
		require.NoError(t, cmd.Start())
		lines := make(chan string, 100)
		j.wg.Go(func() {
			defer close(lines)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				lines <- sc.Text()
			}
		})
		j.cmds = append(j.cmds, cmd)
		j.lines = append(j.lines, lines)
	}
	t.Cleanup(func() {
		for _, c := range j.cmds {
			c.Process.Kill()
		}
		j.wait()
	})
	return j
}

// wait waits for every rank to exit and returns their exit errors.
func (j *procJob) wait() []error {
	errs := make([]error, len(j.cmds))
	for r, c := range j.cmds {
		for range j.lines[r] { // drain what is left
		}
		errs[r] = c.Wait()
	}
	j.wg.Wait()
	return errs
}

// prefixWriter logs a child's stderr through t.
type prefixWriter struct {
	prefix string
	t      *testing.T
	mu     sync.Mutex
}

func (w *prefixWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, l := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		w.t.Log(w.prefix + l)
	}
	return len(p), nil
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
			j := startJob(t, n, "collectives", env...)
			for r, err := range j.wait() {
				assert.NoError(t, err, "rank %d", r)
			}
		})
	}
}

// TestProcessKill SIGKILLs one rank of a 3-rank job in the middle of a
// stream of all-reduces: each survivor's all-reduce fails with a *PeerError
// within 5 s.
func TestProcessKill(t *testing.T) {
	const n, victim = 3, 2
	j := startJob(t, n, "kill")
	for r := range n { // every rank is looping on all-reduces
		select {
		case l := <-j.lines[r]:
			require.Equal(t, "running", l, "rank %d", r)
		case <-time.After(30 * time.Second):
			t.Fatalf("rank %d did not start", r)
		}
	}
	killedAt := time.Now()
	require.NoError(t, j.cmds[victim].Process.Signal(syscall.SIGKILL))
	for r := range n {
		if r == victim {
			continue
		}
		select {
		case l, ok := <-j.lines[r]:
			require.True(t, ok, "rank %d exited without reporting", r)
			t.Logf("rank %d after %v: %s", r, time.Since(killedAt), l)
			assert.Less(t, time.Since(killedAt), 5*time.Second)
			// The TCP transport fails as a whole when it loses a peer, so a
			// survivor may see a fellow survivor's links drop first and
			// name that rank instead of the victim.
			require.True(t, strings.HasPrefix(l, "peer_error "), "rank %d: %s", r, l)
			assert.Contains(t, l, " op=all_reduce ")
			assert.Contains(t, l, " lost=true")
		case <-time.After(5 * time.Second):
			t.Fatalf("rank %d: no error 5 s after the kill", r)
		}
	}
	for r, err := range j.wait() {
		if r != victim {
			assert.NoError(t, err, "rank %d", r)
		}
	}
}

// childMain runs one rank of a multi-process test and returns the exit code.
func childMain(role string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g, err := InitFromEnv(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "InitFromEnv:", err)
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
	rec := &recorder{}
	n, r := g.WorldSize(), g.Rank()
	if g.LocalRank() != r {
		fmt.Fprintf(os.Stderr, "LocalRank %d, want %d\n", g.LocalRank(), r)
		return 1
	}
	lengths := []int{0, 1, n - 1, 7, 333, 100003}
	if os.Getenv(lightEnv) != "" {
		lengths = lengths[:4]
	}
	for _, length := range lengths {
		if err := checkRank(rec, g, n, r, length); err != nil {
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
		err := g.AllReduce(context.Background(), d, Sum)
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
