//go:build linux

package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/gdist/gdist/internal/launch"
)

// attemptLines returns, per attempt, the "attempt COUNT port P token T"
// line rank prints in mode failfirst.
func attemptLines(t *testing.T, stdout string, rank int) map[string][2]string {
	t.Helper()
	re := regexp.MustCompile(`(?m)^\[` + strconv.Itoa(rank) + `\] attempt (\d+) port (\d+) token (\S+)$`)
	got := map[string][2]string{}
	for _, m := range re.FindAllStringSubmatch(stdout, -1) {
		got[m[1]] = [2]string{m[2], m[3]}
	}
	return got
}

func TestRunRestartAfterFirstFailure(t *testing.T) {
	defer goleak.VerifyNone(t)
	cfg, _ := testJob(t, 2, "failfirst")
	cfg.maxRestarts = 1
	var stdout, stderr bytes.Buffer
	code, err := run(context.Background(), cfg, &stdout, &stderr)
	require.NoError(t, err)
	assert.Equal(t, 0, code)
	assert.Equal(t, procsNote(2)+"gdistrun: rank 1 failed (exit status 3); restart 1 of 1\n",
		strings.Join(gdistrunLines(stderr.String()), ""))

	for r := range 2 {
		got := attemptLines(t, stdout.String(), r)
		require.Len(t, got, 2, "rank %d ran twice, GDIST_RESTART_COUNT 0 then 1: %q", r, stdout.String())
		assert.NotEqual(t, got["0"][0], got["1"][0], "a fresh master port")
		assert.NotEqual(t, got["0"][1], got["1"][1], "a fresh token")
		assert.Len(t, got["1"][1], 64)
	}
	assert.Equal(t, attemptLines(t, stdout.String(), 0), attemptLines(t, stdout.String(), 1),
		"both ranks of an attempt share its port and token")
}

func TestRunNoRestartFails(t *testing.T) {
	defer goleak.VerifyNone(t)
	cfg, _ := testJob(t, 2, "failfirst")
	var stdout, stderr bytes.Buffer
	code, err := run(context.Background(), cfg, &stdout, &stderr)
	assert.Equal(t, 3, code)
	var re *launch.RankError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, 1, re.Rank)
	assert.EqualError(t, err, "rank 1 failed first: exit status 3", "no attempt count without -max-restarts")
	assert.NotContains(t, stderr.String(), "restart")
	assert.Len(t, attemptLines(t, stdout.String(), 1), 1)
}

func TestRunRestartKeepsGivenTokenAndPort(t *testing.T) {
	defer goleak.VerifyNone(t)
	cfg, _ := testJob(t, 2, "failfirst")
	cfg.maxRestarts, cfg.nnodes, cfg.masterPort = 1, 2, 29561
	cfg.environ = append(cfg.environ, "GDIST_TOKEN=shared")
	var stdout, stderr bytes.Buffer
	code, err := run(context.Background(), cfg, &stdout, &stderr)
	require.NoError(t, err)
	assert.Equal(t, 0, code)
	want := map[string][2]string{"0": {"29561", "shared"}, "1": {"29561", "shared"}}
	assert.Equal(t, want, attemptLines(t, stdout.String(), 0))
	assert.Equal(t, want, attemptLines(t, stdout.String(), 1))
}

func TestRunRestartsRunOut(t *testing.T) {
	defer goleak.VerifyNone(t)
	cfg, dir := testJob(t, 2, "alwaysfail")
	cfg.maxRestarts = 2
	var stdout, stderr bytes.Buffer
	code, err := run(context.Background(), cfg, &stdout, &stderr)
	assert.Equal(t, 3, code)
	var re *launch.RankError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, 1, re.Rank)
	assert.EqualError(t, err, "rank 1 failed first: exit status 3 (attempt 3 of 3)")
	assert.Equal(t, procsNote(2)+
		"gdistrun: rank 1 failed (exit status 3); restart 1 of 2\n"+
		"gdistrun: rank 1 failed (exit status 3); restart 2 of 2\n",
		strings.Join(gdistrunLines(stderr.String()), ""))
	b, err := os.ReadFile(filepath.Join(dir, "attempts.1"))
	require.NoError(t, err)
	assert.Equal(t, "attempt 0\nattempt 1\nattempt 2\n", string(b), "N+1 attempts, each with its restart count")
}

// gdistrunLines returns gdistrun's own lines of stderr (not the ranks').
func gdistrunLines(stderr string) []string {
	var out []string
	for _, l := range strings.SplitAfter(stderr, "\n") {
		if strings.HasPrefix(l, "gdistrun: ") {
			out = append(out, l)
		}
	}
	return out
}

// waitFile waits for dir/name to appear.
func waitFile(t *testing.T, dir, name string) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, err := os.Stat(filepath.Join(dir, name))
		return err == nil
	}, 10*time.Second, 5*time.Millisecond, "%s did not appear", name)
}

func exists(dir, name string) bool {
	_, err := os.Stat(filepath.Join(dir, name))
	return err == nil
}

// A signal that arrives while a failed attempt is being stopped (launch
// reports the rank failure then, not the signal) still ends the restarts.
func TestRunSignalWhileStoppingEndsRestarts(t *testing.T) {
	defer goleak.VerifyNone(t)
	cfg, dir := testJob(t, 2, "ctl-stubborn")
	cfg.maxRestarts, cfg.killGrace = 5, 10*time.Second
	sigs := make(chan os.Signal, 1)
	cfg.signals = sigs
	res, _, stderr := runAsync(cfg)
	waitFile(t, dir, "0.0")
	waitFile(t, dir, "1.0")

	require.NoError(t, writeAtomic(filepath.Join(dir, "fail.0"), ""))
	waitFile(t, dir, "term.0") // rank 1 failed; rank 0 got SIGTERM and ignores it
	sigs <- syscall.SIGTERM    // kills rank 0 at once
	r := awaitRun(t, res)

	assert.Less(t, r.elapsed, cfg.killGrace, "the signal cut the grace short")
	assert.Equal(t, 3, r.code)
	var re *launch.RankError
	require.ErrorAs(t, r.err, &re)
	assert.Equal(t, 1, re.Rank)
	assert.NotContains(t, stderr.String(), "restart")
	assert.False(t, exists(dir, "0.1") || exists(dir, "1.1"), "no second attempt")
}

// SIGTERM to the real command between a restart and the next failure stops
// the job for good.
func TestLauncherSignalDuringRestarts(t *testing.T) {
	dir := t.TempDir()
	cmd, stdout, stderr := launcher(t, dir, "-n", "2", "--max_restarts=5", "--", os.Args[0], childArg, "ctl")
	// Rank 1 fails once both ranks' first attempts have started (failing
	// at once, it could end rank 0's attempt before it began).
	waitFile(t, dir, "0.0")
	waitFile(t, dir, "1.0")
	require.NoError(t, writeAtomic(filepath.Join(dir, "fail.0"), ""))
	waitFile(t, dir, "0.1")
	waitFile(t, dir, "1.1")

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	err := cmd.Wait()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, 128+15, ee.ExitCode())
	assert.Regexp(t, launcherProcsNote+
		"gdistrun: rank 1 failed \\(exit status 3\\); restart 1 of 5\n"+
		"gdistrun: received terminated; stopped all ranks\n$", stderr.String())
	assert.Contains(t, stdout.String(), "[0] attempt 0\n")
	assert.Contains(t, stdout.String(), "[1] attempt 1\n")
	assert.False(t, exists(dir, "0.2") || exists(dir, "1.2"), "no third attempt")
	for _, f := range []string{"0.0", "1.0", "0.1", "1.1"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		require.NoError(t, err)
		pid, err := strconv.Atoi(string(b))
		require.NoError(t, err)
		requireGone(t, pid)
	}
}

func TestRunLogDir(t *testing.T) {
	defer goleak.VerifyNone(t)
	cfg, dir := testJob(t, 2, "failfirst")
	cfg.maxRestarts = 1
	cfg.logDir = filepath.Join(dir, "logs", "run1") // created
	var stdout, stderr bytes.Buffer
	code, err := run(context.Background(), cfg, &stdout, &stderr)
	require.NoError(t, err)
	require.Equal(t, 0, code)

	for r := range 2 {
		b, err := os.ReadFile(filepath.Join(cfg.logDir, "rank"+strconv.Itoa(r)+".log"))
		require.NoError(t, err)
		log := string(b)
		lines := strings.Split(strings.TrimSuffix(log, "\n"), "\n")
		require.GreaterOrEqual(t, len(lines), 8, log)
		header := regexp.MustCompile(`^=== gdistrun \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ: rank ` + strconv.Itoa(r) +
			`, attempt (\d) of 2 \(GDIST_RESTART_COUNT=(\d)\): ` + regexp.QuoteMeta(strings.Join(cfg.argv, " ")) + `$`)
		m := header.FindStringSubmatch(lines[0])
		require.NotNil(t, m, lines[0])
		assert.Equal(t, []string{"1", "0"}, m[1:])
		ended := "signal: terminated" // stopped by gdistrun after rank 1 failed
		if r == 1 {
			ended = "exit status 3"
		}
		i := slices.Index(lines, "=== gdistrun: rank "+strconv.Itoa(r)+" ended: "+ended)
		require.Positive(t, i, log)
		first, second := lines[1:i], lines[i+1:]
		assert.ElementsMatch(t, []string{
			attemptLine(t, stdout.String(), r, "0"), "stderr of attempt 0",
		}, first, "attempt 1: stdout and stderr, unprefixed")
		m = header.FindStringSubmatch(second[0])
		require.NotNil(t, m, second[0])
		assert.Equal(t, []string{"2", "1"}, m[1:])
		assert.ElementsMatch(t, []string{
			attemptLine(t, stdout.String(), r, "1"), "stderr of attempt 1",
			"=== gdistrun: rank " + strconv.Itoa(r) + " ended: exit status 0",
		}, second[1:])
		assert.Equal(t, "=== gdistrun: rank "+strconv.Itoa(r)+" ended: exit status 0", second[len(second)-1])
	}
	assert.NotContains(t, stdout.String()+stderr.String(), "===", "the terminal output is unchanged")
	assert.Contains(t, stderr.String(), "[1] stderr of attempt 0\n")
	for _, l := range strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n") {
		assert.Regexp(t, `^\[[01]\] attempt [01] port`, l)
	}
}

// attemptLine returns the line rank printed on stdout in the given attempt
// (mode failfirst), without its prefix.
func attemptLine(t *testing.T, stdout string, rank int, attempt string) string {
	t.Helper()
	got, ok := attemptLines(t, stdout, rank)[attempt]
	require.True(t, ok, "rank %d attempt %s in %q", rank, attempt, stdout)
	return "attempt " + attempt + " port " + got[0] + " token " + got[1]
}

func TestRunLogDirNoPrefixAppends(t *testing.T) {
	defer goleak.VerifyNone(t)
	cfg, dir := testJob(t, 1, "env")
	cfg.noPrefix, cfg.logDir = true, dir
	for range 2 {
		var stdout, stderr bytes.Buffer
		code, err := run(context.Background(), cfg, &stdout, &stderr)
		require.NoError(t, err)
		require.Equal(t, 0, code)
		assert.True(t, strings.HasSuffix(stdout.String(), "progress 1\rprogress 2\rdone\nno newline"), "terminal output passed through unchanged")
	}
	b, err := os.ReadFile(filepath.Join(dir, "rank0.log"))
	require.NoError(t, err)
	log := string(b)
	assert.Equal(t, 2, strings.Count(log, "attempt 1 of 1 (GDIST_RESTART_COUNT=0)"), "a second run appends")
	assert.Equal(t, 2, strings.Count(log, "\nno newline\n"), "the unterminated line is ended")
	assert.Equal(t, 2, strings.Count(log, "\n=== gdistrun: rank 0 ended: exit status 0\n"), "the footer on a line of its own")
	assert.Equal(t, 2, strings.Count(log, "\nprogress 1\rprogress 2\rdone\n"))
	assert.Equal(t, 2, strings.Count(log, "\nlong "+strings.Repeat("z", 200<<10)+" end\n"))
}

func TestRunLogDirUnusable(t *testing.T) {
	cfg, dir := testJob(t, 1, "env")
	cfg.logDir = filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(cfg.logDir, nil, 0o644))
	var stdout, stderr bytes.Buffer
	code, err := run(context.Background(), cfg, &stdout, &stderr)
	assert.Equal(t, 1, code)
	require.ErrorIs(t, err, syscall.ENOTDIR)
	assert.Empty(t, stdout.String(), "no rank started")
}

func TestRunGOMAXPROCS(t *testing.T) {
	cfg, _ := testJob(t, 2, "env")
	var stdout, stderr bytes.Buffer
	_, err := run(context.Background(), cfg, &stdout, &stderr)
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(stderr.String(), procsNote(2)), stderr.String())
	assert.Equal(t, 1, strings.Count(stderr.String(), "GOMAXPROCS to override"), "printed once")
	assert.Contains(t, stderr.String(), "[0] EXTRA GOMAXPROCS=2 ")
	assert.Contains(t, stderr.String(), "[1] EXTRA GOMAXPROCS=2 ")

	cfg.environ = append(cfg.environ, "GOMAXPROCS=3")
	stdout.Reset()
	stderr.Reset()
	_, err = run(context.Background(), cfg, &stdout, &stderr)
	require.NoError(t, err)
	assert.NotContains(t, stderr.String(), "gdistrun:", "the user's choice is not announced")
	assert.Contains(t, stderr.String(), "[0] EXTRA GOMAXPROCS=3 ")
	assert.Contains(t, stderr.String(), "[1] EXTRA GOMAXPROCS=3 ")
}

func TestRunListenAddr(t *testing.T) {
	cfg, _ := testJob(t, 1, "env")
	var stdout, stderr bytes.Buffer
	_, err := run(context.Background(), cfg, &stdout, &stderr)
	require.NoError(t, err)
	assert.Contains(t, stderr.String(), "[0] EXTRA GOMAXPROCS=4 GDIST_LISTEN_ADDR= GDIST_RESTART_COUNT=0\n", "loopback (dist's default) on one node")

	cfg.nnodes, cfg.nodeRank, cfg.masterPort = 2, 1, 29500
	cfg.environ = append(cfg.environ, "GDIST_TOKEN=t")
	stderr.Reset()
	stdout.Reset()
	_, err = run(context.Background(), cfg, &stdout, &stderr)
	require.NoError(t, err)
	assert.Contains(t, stderr.String(), "[1] EXTRA GOMAXPROCS=4 GDIST_LISTEN_ADDR=0.0.0.0:0 GDIST_RESTART_COUNT=0\n")
	assert.Contains(t, stdout.String(), " LOCAL_WORLD_SIZE=1 ")

	cfg.environ = append(cfg.environ, "GDIST_LISTEN_ADDR=10.0.0.5:0")
	stderr.Reset()
	_, err = run(context.Background(), cfg, &stdout, &stderr)
	require.NoError(t, err)
	assert.Contains(t, stderr.String(), "[1] EXTRA GOMAXPROCS=4 GDIST_LISTEN_ADDR=10.0.0.5:0 GDIST_RESTART_COUNT=0\n", "the user's address wins")
}

// TestRunTimeoutFlags: -heartbeat-timeout and -init-timeout reach every
// rank as GDIST_HEARTBEAT_TIMEOUT and GDIST_INIT_TIMEOUT, over what
// gdistrun inherited; without them the inherited values pass through.
func TestRunTimeoutFlags(t *testing.T) {
	cfg, _ := testJob(t, 2, "timeouts")
	cfg.environ = append(cfg.environ, "GDIST_HEARTBEAT_TIMEOUT=1h")
	var stdout, stderr bytes.Buffer
	_, err := run(context.Background(), cfg, &stdout, &stderr)
	require.NoError(t, err)
	assert.Contains(t, stdout.String(), "[1] GDIST_HEARTBEAT_TIMEOUT=1h GDIST_INIT_TIMEOUT=\n")

	cfg.heartbeatTimeout, cfg.initTimeout = 20*time.Second, 90*time.Second
	stdout.Reset()
	_, err = run(context.Background(), cfg, &stdout, &stderr)
	require.NoError(t, err)
	for _, r := range []string{"0", "1"} {
		assert.Contains(t, stdout.String(), "["+r+"] GDIST_HEARTBEAT_TIMEOUT=20s GDIST_INIT_TIMEOUT=1m30s\n")
	}
}

// TestRunTransportFlag: -transport reaches every rank as GDIST_TRANSPORT,
// over what gdistrun inherited; without it the inherited value (or none)
// passes through, so local jobs get gdist's default, shared memory.
func TestRunTransportFlag(t *testing.T) {
	cfg, _ := testJob(t, 2, "transport")
	var stdout, stderr bytes.Buffer
	_, err := run(context.Background(), cfg, &stdout, &stderr)
	require.NoError(t, err)
	assert.Contains(t, stdout.String(), "[1] GDIST_TRANSPORT=\n")

	cfg.environ = append(cfg.environ, "GDIST_TRANSPORT=shm")
	cfg.transport = "tcp"
	stdout.Reset()
	_, err = run(context.Background(), cfg, &stdout, &stderr)
	require.NoError(t, err)
	for _, r := range []string{"0", "1"} {
		assert.Contains(t, stdout.String(), "["+r+"] GDIST_TRANSPORT=tcp\n")
	}
}

// TestRunBindTo: -bind-to core binds local rank i to the i-th CPU
// gdistrun may use and says so; by default the ranks may run anywhere.
func TestRunBindTo(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("binding is Linux only")
	}
	var set unix.CPUSet
	require.NoError(t, unix.SchedGetaffinity(0, &set))
	var cpus []int
	for c := range len(set) * 64 {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	cfg, _ := testJob(t, 2, "cpus")
	cfg.bindTo = "core"
	var stdout, stderr bytes.Buffer
	_, err := run(context.Background(), cfg, &stdout, &stderr)
	require.NoError(t, err)
	for r := range 2 {
		cpu := cpus[r%len(cpus)]
		assert.Contains(t, stdout.String(), fmt.Sprintf("[%d] cpus=%d\n", r, cpu))
		assert.Contains(t, stderr.String(), fmt.Sprintf("rank %d on CPU %d", r, cpu))
	}

	cfg.bindTo = "none"
	stdout.Reset()
	stderr.Reset()
	_, err = run(context.Background(), cfg, &stdout, &stderr)
	require.NoError(t, err)
	if len(cpus) > 1 {
		assert.NotContains(t, stdout.String(), fmt.Sprintf("[1] cpus=%d\n", cpus[1]))
	}
	assert.NotContains(t, stderr.String(), "bind-to")
}

func TestRunTimeoutEndsRestarts(t *testing.T) {
	defer goleak.VerifyNone(t)
	cfg, dir := testJob(t, 2, "ctl")
	cfg.maxRestarts, cfg.timeout = 5, 3*time.Second
	res, _, stderr := runAsync(cfg)
	waitFile(t, dir, "1.0")
	require.NoError(t, writeAtomic(filepath.Join(dir, "fail.0"), ""))
	waitFile(t, dir, "1.1") // the restart; attempt 1 runs until -timeout
	r := awaitRun(t, res)
	assert.Equal(t, exitTimeout, r.code)
	require.ErrorIs(t, r.err, errTimedOut)
	assert.Equal(t, 1, strings.Count(stderr.String(), "restart"), stderr.String())
	assert.False(t, exists(dir, "0.2") || exists(dir, "1.2"), "no restart after -timeout")
}

func TestLauncherTorchrunSpellings(t *testing.T) {
	dir := t.TempDir()
	cmd, stdout, stderr := launcher(t, dir, "--standalone", "--nproc_per_node=2", "--max-restarts", "1",
		os.Args[0], childArg, "failfirst")
	require.NoError(t, cmd.Wait(), stderr.String())
	assert.Regexp(t, launcherProcsNote+"gdistrun: rank 1 failed \\(exit status 3\\); restart 1 of 1\n$",
		strings.Join(gdistrunLines(stderr.String()), ""))
	for r := range 2 {
		assert.Len(t, attemptLines(t, stdout.String(), r), 2, "rank %d ran in both attempts", r)
	}
	assert.NotContains(t, stdout.String(), "[2]")
}
