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
)

// gdistrunEnv names a gdistrun binary to use instead of building
// ./cmd/gdistrun.
const gdistrunEnv = "GDIST_GDISTRUN"

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

var (
	stagesRE = regexp.MustCompile(`parameters per stage fnv64a ([0-9a-f]{16} [0-9a-f]{16})`)
	ddpRE    = regexp.MustCompile(`parameters identical on all 2 ranks \(fnv64a ([0-9a-f]{16})\)`)
)

// pipelineJob trains the tiny model as a 2-stage pipeline under gdistrun
// -max-restarts 2 with the kill plan (GDIST_CHAOS_KILL) and returns the
// stages' parameter hashes and the output.
func pipelineJob(t *testing.T, text, ckptDir, kill string) (hashes, out string) {
	t.Helper()
	return chaosJob(t, stagesRE, text, ckptDir, kill, "-pipeline", "-micro-batches", "2")
}

// chaosJob trains the tiny model on 2 ranks under gdistrun -max-restarts 2
// with the kill plan (GDIST_CHAOS_KILL) and the extra flags, and returns
// the hash (or hashes) re matches in the output, and the output.
func chaosJob(t *testing.T, re *regexp.Regexp, text, ckptDir, kill string, extra ...string) (hashes, out string) {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	args := append([]string{"train", "-text", text, "-steps", "60", "-eval-every", "20", "-eval-windows", "4",
		"-ctx", "16", "-dim", "16", "-heads", "2", "-layers", "2", "-mlp", "32", "-batch", "4", "-lr", "0.01",
		"-out", filepath.Join(t.TempDir(), "m.gdc")}, extra...)
	if ckptDir != "" {
		args = append(args, "-ckpt-dir", ckptDir, "-ckpt-every", "10")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gdistrun(t), "-max-restarts", "2", "-kill-grace", "1s", "-n", "2", "--", self)
	cmd.Env = append(os.Environ(), childEnv+"=run", childArgsEnv+"="+strings.Join(args, "\n"), chaosEnv+"="+kill)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	start := time.Now()
	err = cmd.Run()
	out = buf.String()
	require.NoError(t, err, "gdistrun:\n%s", out)
	m := re.FindStringSubmatch(out)
	require.NotNil(t, m, "no final hash in:\n%s", out)
	t.Logf("%v, kill %q: fnv64a %s in %.1fs", extra, kill, m[1], time.Since(start).Seconds())
	return m[1], out
}

// TestChaosPipeline: a 2-stage pipeline (two OS processes, each holding
// and saving only its own layers) under gdistrun -max-restarts 2, with a
// stage SIGKILLed mid-run (once, then twice), ends with every stage's
// parameters bit for bit those of the same run never interrupted.
func TestChaosPipeline(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes")
	}
	text := filepath.Join(t.TempDir(), "text.txt")
	require.NoError(t, os.WriteFile(text, []byte(testText), 0o644))
	want, _ := pipelineJob(t, text, "", "")

	got, out := pipelineJob(t, text, t.TempDir(), "1:28:0") // stage 1 dies after step 28: resume from 20
	assert.Equal(t, want, got, "killed once")
	checkResumes(t, out, 10, 20)

	got, out = pipelineJob(t, text, t.TempDir(), "0:27:0,1:48:1") // resume from 20, then from 40
	assert.Equal(t, want, got, "killed twice")
	checkResumes(t, out, 10, 20, 40)
	if testing.Verbose() {
		t.Log(out)
	}
}

// TestChaosDDP: the same for data-parallel training (each rank draws its
// own batches; rank 0 saves every rank's generator state).
func TestChaosDDP(t *testing.T) {
	if testing.Short() {
		t.Skip("real processes")
	}
	text := filepath.Join(t.TempDir(), "text.txt")
	require.NoError(t, os.WriteFile(text, []byte(testText), 0o644))
	want, _ := chaosJob(t, ddpRE, text, "", "")
	got, out := chaosJob(t, ddpRE, text, t.TempDir(), "1:28:0,0:48:1") // resume from 20, then from 40
	assert.Equal(t, want, got, "killed twice")
	checkResumes(t, out, 10, 20, 40)
}

var resumedRE = regexp.MustCompile(`resumed from \S*ckpt-(\d+)\.gdc`)

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
