package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/internal/cli"
)

// The chaos test runs the test binary as the program under gdistrun: with
// childEnv=run, TestMain runs the program with the arguments in
// childArgsEnv (newline-separated) and the step and test-image caps in
// childLimitsEnv ("steps,images").
const (
	childEnv       = "GDIST_MNIST_TEST_CHILD"
	childArgsEnv   = "GDIST_MNIST_TEST_ARGS"
	childLimitsEnv = "GDIST_MNIST_TEST_LIMITS"
	// gdistrunEnv names a gdistrun binary to use instead of building
	// ./cmd/gdistrun.
	gdistrunEnv = "GDIST_GDISTRUN"
)

func childMain() int {
	if l := strings.Split(os.Getenv(childLimitsEnv), ","); len(l) == 2 {
		testMaxSteps, _ = strconv.Atoi(l[0])
		testTestLimit, _ = strconv.Atoi(l[1])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stderr bytes.Buffer
	err := run(ctx, strings.Split(os.Getenv(childArgsEnv), "\n"), os.Stdout, &stderr)
	os.Stderr.Write(stderr.Bytes())
	return cli.ExitCode("mnist", errUsage, err, os.Stderr)
}

// gdistrun returns a gdistrun binary that knows -max-restarts (built into
// the test's temporary directory unless gdistrunEnv names one), or skips.
func gdistrun(t *testing.T) string {
	t.Helper()
	path := os.Getenv(gdistrunEnv)
	if path == "" {
		path = filepath.Join(t.TempDir(), "gdistrun")
		out, err := exec.Command("go", "build", "-o", path, "github.com/gdist/gdist/cmd/gdistrun").CombinedOutput()
		require.NoError(t, err, "building gdistrun:\n%s", out)
	}
	out, _ := exec.Command(path, "-h").CombinedOutput()
	if !strings.Contains(string(out), "max-restarts") {
		t.Skipf("%s has no -max-restarts (set %s to a gdistrun that has)", path, gdistrunEnv)
	}
	return path
}

var hashRE = regexp.MustCompile(`parameters identical on all 2 ranks .*fnv64a ([0-9a-f]{16})`)

// job runs the program on 2 ranks under gdistrun -max-restarts 2 with the
// given kill plan (GDIST_CHAOS_KILL) and returns the final parameter hash
// and the output.
func job(t *testing.T, ckptDir, kill string, extra ...string) (hash, out string) {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	args := []string{"-epochs", "2", "-batch", "32", "-seed", "7"}
	if len(extra) == 0 {
		args = append(args, "-bucket-cap", "262144")
	}
	args = append(args, extra...)
	if ckptDir != "" {
		args = append(args, "-ckpt-dir", ckptDir, "-ckpt-every", "25")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gdistrun(t), "-max-restarts", "2", "-kill-grace", "1s", "-n", "2", "--", self)
	cmd.Env = append(os.Environ(), childEnv+"=run", childArgsEnv+"="+strings.Join(args, "\n"),
		childLimitsEnv+"=60,500", chaosEnv+"="+kill)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	start := time.Now()
	err = cmd.Run()
	out = buf.String()
	require.NoError(t, err, "gdistrun:\n%s", out)
	m := hashRE.FindStringSubmatch(out)
	require.NotNil(t, m, "no final hash in:\n%s", out)
	t.Logf("kill %q: fnv64a %s in %.1fs", kill, m[1], time.Since(start).Seconds())
	return m[1], out
}

// TestChaos: 2-rank DDP training on MNIST under gdistrun -max-restarts 2,
// with one rank SIGKILLed mid-epoch (once, then twice in one job), ends
// with the parameters, bit for bit, of the same run never interrupted.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes, 30 s or more")
	}
	data(t)
	want, _ := job(t, "", "")

	// 2 epochs of 60 steps; checkpoints every 25. Rank 1 dies after step
	// 70 (epoch 2): the job restarts from step 50.
	got, out := job(t, t.TempDir(), "1:70:0")
	assert.Equal(t, want, got, "killed once")
	checkResumes(t, out, 25, 50)

	// Rank 1 dies after step 58 (epoch 1), then on the restart rank 0,
	// the writer, after step 108: the job resumes from 50, then from 100.
	got, out = job(t, t.TempDir(), "1:58:0,0:108:1")
	if testing.Verbose() {
		t.Log(out)
	}
	assert.Equal(t, want, got, "killed twice")
	checkResumes(t, out, 25, 50, 100)
}

// TestChaosFull: the same under full sharding (-shard full), whose sharded
// checkpoints every rank writes its part of: rank 1 dies after step 70
// and the job resumes from step 50, every rank reading its pieces, and
// ends with the parameters of the run never interrupted.
func TestChaosFull(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes, 30 s or more")
	}
	data(t)
	want, _ := job(t, "", "", "-shard", "full")
	got, out := job(t, t.TempDir(), "1:70:0", "-shard", "full")
	if testing.Verbose() {
		t.Log(out)
	}
	assert.Equal(t, want, got, "killed once")
	checkResumes(t, out, 0, 50)
}

var resumedRE = regexp.MustCompile(`resumed from \S*ckpt-(\d+)(?:\.gdc)? `)

// checkResumes checks that the job resumed once per kill, each time from
// the checkpoint expected or, if the kill cut that checkpoint's write short
// (saves are asynchronous), from the one before it.
func checkResumes(t *testing.T, out string, every int64, expected ...int64) {
	t.Helper()
	var got []int64
	for _, m := range resumedRE.FindAllStringSubmatch(out, -1) {
		s, err := strconv.ParseInt(m[1], 10, 64)
		require.NoError(t, err)
		got = append(got, s)
	}
	require.Len(t, got, len(expected), "resumed from %v, want %v (or a checkpoint earlier)", got, expected)
	for i, s := range got {
		assert.Contains(t, []int64{expected[i], expected[i] - every}, s, "resume %d", i+1)
	}
	t.Logf("resumed from steps %v", got)
}
