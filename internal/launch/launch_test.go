package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// childEnv makes the test binary a rank: its value is the role.
const childEnv = "GDIST_LAUNCH_TEST_CHILD"

func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(child(role))
	}
	goleak.VerifyTestMain(m)
}

// child is a rank. Roles:
//
//	env    print the rank's environment, a line to stderr, exit 0
//	exit3  rank 1 exits 3 at once; the others sleep
//	late3  rank 1 exits 3 at once; the others exit 0 after 300 ms
//	sleep  print "ready" and sleep
//	cpus   print the CPUs each of its threads may run on (Linux)
func child(role string) int {
	rank := os.Getenv(EnvRank)
	switch role {
	case "cpus":
		for _, c := range threadCPUs() {
			fmt.Println(c)
		}
		return 0
	case "env":
		for _, k := range []string{EnvRank, EnvLocalRank, EnvWorldSize, EnvLocalWorldSize, EnvMasterAddr, EnvMasterPort, EnvToken, "GOMAXPROCS", "EXTRA", "PER_RANK"} {
			fmt.Printf("%s=%s\n", k, os.Getenv(k))
		}
		fmt.Fprintln(os.Stderr, "to stderr")
		fmt.Print("no newline")
		return 0
	case "exit3", "late3":
		if rank == "1" {
			return 3
		}
		if role == "late3" {
			time.Sleep(300 * time.Millisecond)
			return 0
		}
	}
	fmt.Println("ready")
	time.Sleep(time.Minute)
	return 0
}

func job(n int, role string) Job {
	return Job{Spec: Spec{NProc: n}, Args: []string{"-test.run=^$"}, Env: []string{childEnv + "=" + role}}
}

// lines collects each rank's stdout and stderr lines.
type lines struct {
	mu       sync.Mutex
	out, err map[int][]string
}

func (l *lines) output() func(int) (io.Writer, io.Writer) {
	l.out, l.err = map[int][]string{}, map[int][]string{}
	add := func(m map[int][]string, rank int) io.Writer {
		return LineFunc(func(s string) {
			l.mu.Lock()
			m[rank] = append(m[rank], s)
			l.mu.Unlock()
		})
	}
	return func(rank int) (io.Writer, io.Writer) { return add(l.out, rank), add(l.err, rank) }
}

func TestEnvAndOutput(t *testing.T) {
	var l lines
	j := job(2, "env")
	j.Procs = 1
	j.Environ = append(os.Environ(), "RANK=99", "GDIST_TOKEN=inherited")
	j.Env = append(j.Env, "EXTRA=x")
	j.RankEnv = func(rank int) []string { return []string{fmt.Sprintf("PER_RANK=r%d", rank)} }
	j.Output = l.output()
	r, err := Start(context.Background(), j)
	require.NoError(t, err)
	require.NoError(t, r.Wait())
	spec := r.Spec()
	assert.Len(t, spec.Token, 2*TokenBytes)
	assert.NotEqual(t, "inherited", spec.Token)
	for rank := range 2 {
		assert.Equal(t, []string{
			fmt.Sprintf("RANK=%d", rank), fmt.Sprintf("LOCAL_RANK=%d", rank), "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2",
			"MASTER_ADDR=127.0.0.1", fmt.Sprintf("MASTER_PORT=%d", spec.MasterPort), "GDIST_TOKEN=" + spec.Token,
			"GOMAXPROCS=1", "EXTRA=x", fmt.Sprintf("PER_RANK=r%d", rank), "no newline",
		}, l.out[rank])
		assert.Equal(t, []string{"to stderr"}, l.err[rank])
	}

	// Another launch, another token.
	r2, err := Start(context.Background(), Job{Spec: Spec{NProc: 1}, Args: j.Args, Env: j.Env, Output: (&lines{}).output()})
	require.NoError(t, err)
	require.NoError(t, r2.Wait())
	assert.NotEqual(t, spec.Token, r2.Spec().Token, "a fresh token every launch")
}

func TestPrefixed(t *testing.T) {
	var stdout, stderr bytes.Buffer
	j := job(2, "env")
	j.Output = Prefixed(&stdout, &stderr)
	r, err := Start(context.Background(), j)
	require.NoError(t, err)
	require.NoError(t, r.Wait())
	assert.Contains(t, stdout.String(), "[0] RANK=0\n")
	assert.Contains(t, stdout.String(), "[1] RANK=1\n")
	assert.Contains(t, stdout.String(), "[1] no newline\n", "flushed at the end")
	assert.Equal(t, 2, strings.Count(stderr.String(), "] to stderr\n"))
}

func TestFailFast(t *testing.T) {
	var l lines
	j := job(3, "exit3")
	j.Output = l.output()
	j.KillGrace = time.Second
	start := time.Now()
	r, err := Start(context.Background(), j)
	require.NoError(t, err)
	err = r.Wait()
	var re *RankError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, 1, re.Rank)
	assert.Equal(t, 3, ExitStatus(err))
	assert.EqualError(t, err, "rank 1 failed first: exit status 3")
	assert.Less(t, time.Since(start), 30*time.Second, "the sleeping ranks were stopped")
	for _, p := range r.Procs() {
		if p.Rank != 1 {
			assert.Equal(t, -1, p.ExitCode(), "rank %d was killed", p.Rank)
			assert.Equal(t, 128+15, ExitStatus(p.Err()), "by SIGTERM")
		}
	}
}

func TestKeepGoing(t *testing.T) {
	j := job(2, "late3")
	j.KeepGoing = true
	j.Output = (&lines{}).output()
	r, err := Start(context.Background(), j)
	require.NoError(t, err)
	var re *RankError
	require.ErrorAs(t, r.Wait(), &re)
	assert.Equal(t, 1, re.Rank)
	ps := r.Procs()
	assert.Equal(t, 0, ps[0].ExitCode(), "rank 0 ran to its end")
	assert.Equal(t, 3, ps[1].ExitCode())
	assert.False(t, ps[1].Ended().After(ps[0].Ended()))
}

func TestCancel(t *testing.T) {
	var l lines
	j := job(2, "sleep")
	j.Output = l.output()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, err := Start(ctx, j)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.out[0]) > 0 && len(l.out[1]) > 0
	}, 30*time.Second, 10*time.Millisecond)
	cancel()
	err = r.Wait()
	assert.ErrorIs(t, err, context.Canceled)
	for _, p := range r.Procs() {
		assert.Equal(t, -1, p.ExitCode())
	}
}

func TestKillOneRank(t *testing.T) {
	j := job(2, "sleep")
	j.Output = (&lines{}).output()
	r, err := Start(context.Background(), j)
	require.NoError(t, err)
	r.Procs()[0].Kill()
	var re *RankError
	require.ErrorAs(t, r.Wait(), &re)
	assert.Equal(t, 0, re.Rank)
	assert.Equal(t, 128+9, ExitStatus(re))
}

func TestSignal(t *testing.T) {
	var l lines
	sigs := make(chan os.Signal, 1)
	j := job(1, "sleep")
	j.Output = l.output()
	j.Signals = sigs
	r, err := Start(context.Background(), j)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.out[0]) > 0
	}, 30*time.Second, 10*time.Millisecond)
	sigs <- os.Interrupt
	var se *SignalError
	require.ErrorAs(t, r.Wait(), &se)
	assert.Equal(t, os.Interrupt, se.Sig)
	assert.Equal(t, 2, SignalNumber(se.Sig))
}

func TestStartErrors(t *testing.T) {
	_, err := Start(context.Background(), Job{Spec: Spec{NProc: 2}, Program: "/nonexistent/program"})
	var se *StartError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, 0, se.Rank)
	_, err = Start(context.Background(), Job{Spec: Spec{NProc: 1}, Program: "no-such-program-in-path"})
	assert.ErrorIs(t, err, exec.ErrNotFound)

	for name, j := range map[string]Job{
		"n=0":        {},
		"nnodes<0":   {Spec: Spec{NProc: 1, NNodes: -1}},
		"node-rank":  {Spec: Spec{NProc: 1, NNodes: 2, NodeRank: 2, MasterPort: 1, Token: "t"}},
		"port":       {Spec: Spec{NProc: 1, MasterPort: 70000}},
		"multi-node": {Spec: Spec{NProc: 1, NNodes: 2}},
		"grace":      {Spec: Spec{NProc: 1}, KillGrace: -1},
		"procs":      {Spec: Spec{NProc: 1}, Procs: -1},
	} {
		_, err := Start(context.Background(), j)
		assert.ErrorIs(t, err, ErrJob, name)
	}
}

func TestLineFunc(t *testing.T) {
	var got []string
	w := LineFunc(func(s string) { got = append(got, s) })
	for _, p := range []string{"a\nb", "c\r\n", "\n", "progress\rdone\r", "\n", "tail"} {
		_, err := w.Write([]byte(p))
		require.NoError(t, err)
	}
	require.NoError(t, w.Flush())
	assert.Equal(t, []string{"a", "bc", "", "progress", "done", "tail"}, got)
}

func TestExitStatus(t *testing.T) {
	assert.Equal(t, 0, ExitStatus(nil))
	assert.Equal(t, 1, ExitStatus(errors.New("x")))
}
