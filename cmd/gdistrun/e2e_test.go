//go:build linux

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gdist/gdist/internal/launch"
)

// The test binary doubles as the launcher and as the ranks' program:
//
//	testbin gdistrun-test-child MODE    runs childMain(MODE)
//	GDISTRUN_TEST_LAUNCHER=1 testbin …  runs main() (the real command)
const (
	childArg    = "gdistrun-test-child"
	launcherEnv = "GDISTRUN_TEST_LAUNCHER"
	dirEnv      = "GDISTRUN_TEST_DIR"
	childSleep  = 30 * time.Second // bounds what a broken test can leak
)

func TestMain(m *testing.M) {
	if len(os.Args) > 2 && os.Args[1] == childArg {
		os.Exit(childMain(os.Args[2]))
	}
	if os.Getenv(launcherEnv) == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// childMain is a rank (or a rank's child) in the end-to-end tests. Modes:
//
//	sleep     sleep, as a rank's child (a grandchild of gdistrun)
//	env       print the rank's environment and some awkward output, exit 0
//	exit3     rank 1 exits 3 at once; the others act as wait
//	wait      start a sleeping child sharing stdout, record "pid childpid"
//	          in $GDISTRUN_TEST_DIR/RANK, print "ready", sleep
//	stubborn  wait, ignoring SIGTERM
//	term      wait, but on SIGTERM print "got terminated" and exit 0
//	orphan    wait, but exit 0 at once, leaving the child running
//	failfirst print the attempt's rendezvous; on the first attempt
//	          (GDIST_RESTART_COUNT=0) local rank 1 exits 3 once the others
//	          have printed (and sleep)
//	alwaysfail append a line to $GDISTRUN_TEST_DIR/attempts.RANK; rank 1
//	          exits 3, the others sleep
//	ctl       record the pid in $GDISTRUN_TEST_DIR/RANK.COUNT (COUNT is
//	          GDIST_RESTART_COUNT); rank 1 exits 3 once the file fail.COUNT
//	          appears there, the others sleep
//	ctl-stubborn ctl, but the other ranks ignore SIGTERM, recording it in
//	          term.COUNT
//	vars      print TORCHELASTIC_RUN_ID and GDIST_LOG_FORMAT, and a line on
//	          stderr
//	dist      join the job with gdist.InitFromEnv (observe_e2e_test.go)
func childMain(mode string) int {
	rank := os.Getenv("RANK")
	count := os.Getenv("GDIST_RESTART_COUNT")
	dir := os.Getenv(dirEnv)
	switch mode {
	case "failfirst":
		fmt.Printf("attempt %s port %s token %s\n", count, os.Getenv("MASTER_PORT"), os.Getenv("GDIST_TOKEN"))
		fmt.Fprintf(os.Stderr, "stderr of attempt %s\n", count)
		if count != "0" {
			return 0
		}
		local := os.Getenv("LOCAL_RANK")
		if local != "1" {
			if err := writeAtomic(filepath.Join(dir, "printed."+local), ""); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			time.Sleep(childSleep)
			return 0
		}
		// Fail once every other rank has printed.
		n, _ := strconv.Atoi(os.Getenv("LOCAL_WORLD_SIZE"))
		for l := 0; l < n; l++ {
			for l != 1 {
				if _, err := os.Stat(filepath.Join(dir, "printed."+strconv.Itoa(l))); err == nil {
					break
				}
				time.Sleep(2 * time.Millisecond)
			}
		}
		return 3
	case "alwaysfail":
		f, err := os.OpenFile(filepath.Join(dir, "attempts."+rank), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Fprintf(f, "attempt %s\n", count)
		f.Close()
		if rank == "1" {
			return 3
		}
		time.Sleep(childSleep)
		return 0
	case "ctl", "ctl-stubborn":
		return ctlChild(mode == "ctl-stubborn", dir, rank, count)
	case "transport":
		fmt.Printf("GDIST_TRANSPORT=%s\n", os.Getenv("GDIST_TRANSPORT"))
		return 0
	case "cpus":
		b, _ := os.ReadFile("/proc/self/status")
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
				fmt.Printf("cpus=%s\n", strings.TrimSpace(v))
			}
		}
		return 0
	case "timeouts":
		fmt.Printf("GDIST_HEARTBEAT_TIMEOUT=%s GDIST_INIT_TIMEOUT=%s\n",
			os.Getenv("GDIST_HEARTBEAT_TIMEOUT"), os.Getenv("GDIST_INIT_TIMEOUT"))
		return 0
	case "vars":
		fmt.Printf("TORCHELASTIC_RUN_ID=%s GDIST_LOG_FORMAT=%s\n", os.Getenv("TORCHELASTIC_RUN_ID"), os.Getenv("GDIST_LOG_FORMAT"))
		fmt.Fprintln(os.Stderr, "to stderr")
		return 0
	case "dist":
		return distChild(dir, rank)
	}
	switch mode {
	case "sleep":
		time.Sleep(childSleep)
		return 0
	case "env":
		fmt.Printf("RANK=%s LOCAL_RANK=%s WORLD_SIZE=%s LOCAL_WORLD_SIZE=%s MASTER_ADDR=%s MASTER_PORT=%s GDIST_TOKEN=%s\n",
			rank, os.Getenv("LOCAL_RANK"), os.Getenv("WORLD_SIZE"), os.Getenv("LOCAL_WORLD_SIZE"),
			os.Getenv("MASTER_ADDR"), os.Getenv("MASTER_PORT"), os.Getenv("GDIST_TOKEN"))
		fmt.Fprintf(os.Stderr, "to stderr\n")
		fmt.Printf("long %s end\n", strings.Repeat("z", 200<<10))
		fmt.Printf("progress 1\rprogress 2\rdone\n")
		fmt.Printf("no newline")
		fmt.Fprintf(os.Stderr, "EXTRA GOMAXPROCS=%s GDIST_LISTEN_ADDR=%s GDIST_RESTART_COUNT=%s\n",
			os.Getenv("GOMAXPROCS"), os.Getenv("GDIST_LISTEN_ADDR"), count)
		return 0
	case "exit3":
		if rank == "1" {
			fmt.Println("exiting 3")
			return 3
		}
	case "stubborn":
		signal.Ignore(syscall.SIGTERM)
	}
	term := make(chan os.Signal, 1)
	if mode == "term" {
		signal.Notify(term, syscall.SIGTERM)
	}
	gc := exec.Command(os.Args[0], childArg, "sleep")
	gc.Stdout, gc.Stderr = os.Stdout, os.Stderr // holds the output pipes, like `go run`'s binary
	if err := gc.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	tmp := filepath.Join(dir, rank+".tmp")
	pids := fmt.Sprintf("%d %d", os.Getpid(), gc.Process.Pid)
	if err := os.WriteFile(tmp, []byte(pids), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := os.Rename(tmp, filepath.Join(dir, rank)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("ready")
	if mode == "orphan" {
		return 0
	}
	select {
	case <-term:
		fmt.Println("got terminated")
	case <-time.After(childSleep):
	}
	return 0
}

// ctlChild is childMain's ctl and ctl-stubborn modes.
func ctlChild(stubborn bool, dir, rank, count string) int {
	term := make(chan os.Signal, 1)
	if stubborn && rank != "1" {
		signal.Notify(term, syscall.SIGTERM)
	}
	if err := writeAtomic(filepath.Join(dir, rank+"."+count), strconv.Itoa(os.Getpid())); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("attempt %s\n", count)
	deadline := time.After(childSleep)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-term:
			if err := writeAtomic(filepath.Join(dir, "term."+count), ""); err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
		case <-tick.C:
			if _, err := os.Stat(filepath.Join(dir, "fail."+count)); err == nil && rank == "1" {
				return 3
			}
		case <-deadline:
			return 0
		}
	}
}

// writeAtomic writes a file that appears whole or not at all.
func writeAtomic(path, content string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// childEnv returns the environment for a re-executed test binary. Under
// -race, a process sleeps a second at exit unless told not to.
// GOMAXPROCS is left out, so that gdistrun picks it as it does by default.
func childEnv(extra ...string) []string {
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GOMAXPROCS=") })
	env = append(env, "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	return append(env, extra...)
}

// testCPUs is the CPU count the in-process tests tell run to share.
const testCPUs = 4

// procsNote is what gdistrun prints on stderr about GOMAXPROCS for n ranks
// on testCPUs CPUs.
func procsNote(n int) string {
	ranks := fmt.Sprintf("each of %d ranks", n)
	if n == 1 {
		ranks = "1 rank"
	}
	return fmt.Sprintf("gdistrun: GOMAXPROCS=%d for %s (%d CPUs; set GOMAXPROCS to override)\n",
		max(1, testCPUs/n), ranks, testCPUs)
}

// launcherProcsNote matches procsNote's line as the real command prints it
// for 2 ranks, on whatever CPUs this machine has.
const launcherProcsNote = `^gdistrun: GOMAXPROCS=[0-9]+ for each of 2 ranks \([0-9]+ CPUs; set GOMAXPROCS to override\)\n`

// testJob returns a config that runs the test binary as every rank.
func testJob(t *testing.T, nproc int, mode string) (config, string) {
	dir := t.TempDir()
	return config{
		nproc: nproc, nnodes: 1, masterAddr: "127.0.0.1", killGrace: 3 * time.Second, cpus: testCPUs,
		argv:    []string{os.Args[0], childArg, mode},
		environ: childEnv(dirEnv + "=" + dir),
	}, dir
}

// waitPids waits until n ranks have recorded their pids and returns them
// (rank pids and their children's), killing them all at cleanup.
func waitPids(t *testing.T, dir string, n int) (ranks, children []int) {
	t.Helper()
	require.Eventually(t, func() bool {
		for r := range n {
			if _, err := os.Stat(filepath.Join(dir, strconv.Itoa(r))); err != nil {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "ranks did not start")
	for r := range n {
		b, err := os.ReadFile(filepath.Join(dir, strconv.Itoa(r)))
		require.NoError(t, err)
		var p, c int
		_, err = fmt.Sscanf(string(b), "%d %d", &p, &c)
		require.NoError(t, err)
		ranks, children = append(ranks, p), append(children, c)
	}
	t.Cleanup(func() {
		for _, pid := range append(ranks, children...) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	return ranks, children
}

// gone reports whether pid no longer runs: it does not exist or is a
// zombie waiting for its (new) parent to reap it.
func gone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// pid (comm) state ...
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && (s[i+2] == 'Z' || s[i+2] == 'X')
}

func requireGone(t *testing.T, pids ...int) {
	t.Helper()
	for _, pid := range pids {
		assert.Eventually(t, func() bool { return gone(pid) }, 2*time.Second, 10*time.Millisecond,
			"process %d survived", pid)
	}
}

// runAsync runs cfg in the background.
func runAsync(cfg config) (result <-chan runResult, stdout, stderr *bytes.Buffer) {
	stdout, stderr = new(bytes.Buffer), new(bytes.Buffer)
	ch := make(chan runResult, 1)
	go func() {
		start := time.Now()
		code, err := run(context.Background(), cfg, stdout, stderr)
		ch <- runResult{code, err, time.Since(start)}
	}()
	return ch, stdout, stderr
}

type runResult struct {
	code    int
	err     error
	elapsed time.Duration
}

func awaitRun(t *testing.T, ch <-chan runResult) runResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(15 * time.Second):
		t.Fatal("run did not return")
		return runResult{}
	}
}

func TestRunEnvAndPrefixedOutput(t *testing.T) {
	defer goleak.VerifyNone(t)
	cfg, _ := testJob(t, 3, "env")
	cfg.environ = append(cfg.environ, "GDIST_TOKEN=sharedtoken", "RANK=42")
	var stdout, stderr bytes.Buffer
	code, err := run(context.Background(), cfg, &stdout, &stderr)
	require.NoError(t, err)
	require.Equal(t, 0, code)

	lines := strings.Split(stdout.String(), "\n")
	var port string
	long := "long " + strings.Repeat("z", 200<<10) + " end"
	for r := range 3 {
		p := fmt.Sprintf("[%d] ", r)
		var envLine string
		for _, l := range lines {
			if strings.HasPrefix(l, p+"RANK=") {
				envLine = l
			}
		}
		require.NotEmpty(t, envLine, "rank %d env line in %q", r, stdout.String())
		var rank, local, world, localWorld, mport, token, addr string
		_, err := fmt.Sscanf(strings.ReplaceAll(strings.TrimPrefix(envLine, p), "=", " "),
			"RANK %s LOCAL_RANK %s WORLD_SIZE %s LOCAL_WORLD_SIZE %s MASTER_ADDR %s MASTER_PORT %s GDIST_TOKEN %s",
			&rank, &local, &world, &localWorld, &addr, &mport, &token)
		require.NoError(t, err, envLine)
		assert.Equal(t, []string{strconv.Itoa(r), strconv.Itoa(r), "3", "3", "127.0.0.1", "sharedtoken"},
			[]string{rank, local, world, localWorld, addr, token})
		if port == "" {
			port = mport
		}
		assert.Equal(t, port, mport, "one master port for the job")

		assert.Contains(t, lines, p+long)
		assert.Contains(t, stdout.String(), p+"progress 1\r"+p+"progress 2\r"+p+"done\n")
		assert.Contains(t, lines, p+"no newline")
		assert.Contains(t, stderr.String(), p+"to stderr\n")
	}
	n, err := strconv.Atoi(port)
	require.NoError(t, err)
	assert.Positive(t, n)
	for _, l := range lines[:len(lines)-1] {
		assert.Regexp(t, `^\[[012]\] `, l[:min(len(l), 4)], "every line prefixed")
	}
}

func TestRunMultiNodeRanks(t *testing.T) {
	cfg, _ := testJob(t, 2, "env")
	cfg.nnodes, cfg.nodeRank, cfg.masterPort, cfg.masterAddr = 3, 1, 29555, "10.1.2.3"
	cfg.environ = append(cfg.environ, "GDIST_TOKEN=t0k")
	var stdout, stderr bytes.Buffer
	code, err := run(context.Background(), cfg, &stdout, &stderr)
	require.NoError(t, err)
	require.Equal(t, 0, code)
	out := stdout.String()
	assert.Contains(t, out, "[2] RANK=2 LOCAL_RANK=0 WORLD_SIZE=6 LOCAL_WORLD_SIZE=2 MASTER_ADDR=10.1.2.3 MASTER_PORT=29555 GDIST_TOKEN=t0k\n")
	assert.Contains(t, out, "[3] RANK=3 LOCAL_RANK=1 WORLD_SIZE=6 LOCAL_WORLD_SIZE=2 MASTER_ADDR=10.1.2.3 MASTER_PORT=29555 GDIST_TOKEN=t0k\n")
}

func TestRunNoPrefix(t *testing.T) {
	cfg, _ := testJob(t, 1, "env")
	cfg.noPrefix = true
	var stdout, stderr bytes.Buffer
	code, err := run(context.Background(), cfg, &stdout, &stderr)
	require.NoError(t, err)
	require.Equal(t, 0, code)
	assert.True(t, strings.HasPrefix(stdout.String(), "RANK=0 "))
	assert.True(t, strings.HasSuffix(stdout.String(), "progress 1\rprogress 2\rdone\nno newline"), "output passed through unchanged")
	assert.Equal(t, procsNote(1)+"to stderr\nEXTRA GOMAXPROCS=4 GDIST_LISTEN_ADDR= GDIST_RESTART_COUNT=0\n", stderr.String())
}

func TestRunRankExits3(t *testing.T) {
	defer goleak.VerifyNone(t)
	cfg, _ := testJob(t, 2, "exit3")
	var stdout, stderr bytes.Buffer
	code, err := run(context.Background(), cfg, &stdout, &stderr)
	assert.Equal(t, 3, code)
	var re *launch.RankError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, 1, re.Rank)
	assert.EqualError(t, err, "rank 1 failed first: exit status 3")
	assert.Contains(t, stdout.String(), "[1] exiting 3\n")
}

func TestRunRankKilled(t *testing.T) {
	defer goleak.VerifyNone(t)
	cfg, dir := testJob(t, 2, "wait")
	res, stdout, _ := runAsync(cfg)
	ranks, children := waitPids(t, dir, 2)

	killed := time.Now()
	require.NoError(t, syscall.Kill(ranks[1], syscall.SIGKILL))
	r := awaitRun(t, res)
	t.Logf("run returned %v after the kill", time.Since(killed))

	assert.Less(t, time.Since(killed), 10*time.Second)
	assert.Equal(t, 128+9, r.code)
	var re *launch.RankError
	require.ErrorAs(t, r.err, &re)
	assert.Equal(t, 1, re.Rank)
	assert.EqualError(t, r.err, "rank 1 failed first: signal: killed")
	assert.Contains(t, stdout.String(), "[0] ready\n")
	requireGone(t, append(ranks, children...)...)
}

func TestRunKillGraceEscalates(t *testing.T) {
	defer goleak.VerifyNone(t)
	cfg, dir := testJob(t, 2, "stubborn")
	cfg.killGrace = 300 * time.Millisecond
	res, _, _ := runAsync(cfg)
	ranks, children := waitPids(t, dir, 2)

	killed := time.Now()
	require.NoError(t, syscall.Kill(ranks[0], syscall.SIGKILL))
	r := awaitRun(t, res)
	elapsed := time.Since(killed)
	t.Logf("run returned %v after the kill (grace %v)", elapsed, cfg.killGrace)
	assert.GreaterOrEqual(t, elapsed, cfg.killGrace, "rank 1 ignores SIGTERM, so it needs the SIGKILL")
	assert.Less(t, elapsed, 5*time.Second)
	assert.EqualError(t, r.err, "rank 0 failed first: signal: killed")
	requireGone(t, append(ranks, children...)...)
}

func TestRunForwardsSignal(t *testing.T) {
	defer goleak.VerifyNone(t)
	cfg, dir := testJob(t, 2, "term")
	sigs := make(chan os.Signal, 1)
	cfg.signals = sigs
	res, stdout, _ := runAsync(cfg)
	ranks, children := waitPids(t, dir, 2)

	sigs <- syscall.SIGTERM
	r := awaitRun(t, res)
	assert.Equal(t, 128+15, r.code)
	var se *launch.SignalError
	require.ErrorAs(t, r.err, &se)
	assert.Equal(t, syscall.SIGTERM, se.Sig)
	assert.Contains(t, stdout.String(), "[0] got terminated\n")
	assert.Contains(t, stdout.String(), "[1] got terminated\n")
	requireGone(t, append(ranks, children...)...)
}

func TestRunTimeout(t *testing.T) {
	defer goleak.VerifyNone(t)
	cfg, _ := testJob(t, 2, "wait")
	cfg.timeout = 500 * time.Millisecond
	var stdout, stderr bytes.Buffer
	start := time.Now()
	code, err := run(context.Background(), cfg, &stdout, &stderr)
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.Equal(t, exitTimeout, code)
	require.ErrorIs(t, err, errTimedOut)
	assert.EqualError(t, err, "job timed out after 500ms")
}

func TestRunProgramNotFound(t *testing.T) {
	defer goleak.VerifyNone(t)
	var stdout, stderr bytes.Buffer
	cfg := validConfig()
	cfg.argv = []string{"gdistrun-no-such-program"}
	code, err := run(context.Background(), cfg, &stdout, &stderr)
	assert.Equal(t, exitNotFound, code)
	require.ErrorIs(t, err, exec.ErrNotFound)

	cfg.argv = []string{filepath.Join(t.TempDir(), "missing")}
	code, err = run(context.Background(), cfg, &stdout, &stderr)
	assert.Equal(t, exitNotFound, code)
	require.Error(t, err)
}

// launcher starts the real command (main) from the test binary.
func launcher(t *testing.T, dir string, args ...string) (*exec.Cmd, *bytes.Buffer, *bytes.Buffer) {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = childEnv(launcherEnv+"=1", dirEnv+"="+dir)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, &stdout, &stderr
}

func TestLauncherForwardsSIGTERM(t *testing.T) {
	dir := t.TempDir()
	cmd, stdout, stderr := launcher(t, dir, "-n", "2", "--", os.Args[0], childArg, "term")
	ranks, children := waitPids(t, dir, 2)

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	err := cmd.Wait()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, 128+15, ee.ExitCode())
	assert.Contains(t, stdout.String(), "[0] got terminated\n")
	assert.Contains(t, stdout.String(), "[1] got terminated\n")
	assert.Regexp(t, launcherProcsNote+"gdistrun: received terminated; stopped all ranks\n$", stderr.String())
	requireGone(t, append(ranks, children...)...)
}

func TestLauncherRankFailure(t *testing.T) {
	dir := t.TempDir()
	cmd, _, stderr := launcher(t, dir, "-n", "2", "--", os.Args[0], childArg, "wait")
	ranks, children := waitPids(t, dir, 2)

	killed := time.Now()
	require.NoError(t, syscall.Kill(ranks[1], syscall.SIGKILL))
	err := cmd.Wait()
	assert.Less(t, time.Since(killed), 10*time.Second)
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, 137, ee.ExitCode())
	assert.Regexp(t, launcherProcsNote+`gdistrun: rank 1 failed first: signal: killed\n$`, stderr.String())
	requireGone(t, append(ranks, children...)...)
}

func TestLauncherDeathKillsRanks(t *testing.T) {
	dir := t.TempDir()
	cmd, _, _ := launcher(t, dir, "-n", "2", "--", os.Args[0], childArg, "wait")
	ranks, _ := waitPids(t, dir, 2)

	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	requireGone(t, ranks...) // Pdeathsig
}

func TestRunKillsLeftoversOfSuccessfulRank(t *testing.T) {
	defer goleak.VerifyNone(t)
	cfg, dir := testJob(t, 2, "orphan")
	var stdout, stderr bytes.Buffer
	start := time.Now()
	code, err := run(context.Background(), cfg, &stdout, &stderr)
	require.NoError(t, err)
	assert.Equal(t, 0, code)
	assert.Less(t, time.Since(start), 2*time.Second, "no wait for the leftover's pipe (launch drains for up to 2 s)")
	ranks, children := waitPids(t, dir, 2)
	requireGone(t, append(ranks, children...)...)
}
