package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/internal/cli"
	"github.com/gdist/gdist/internal/procjob"
	"github.com/gdist/gdist/models/transformer"
)

// childEnv names the environment variable that makes the test binary run
// the program as one rank of a multi-process test instead of running tests;
// its value is the role ("run"). The program's arguments come from
// childArgsEnv, separated by newlines.
const (
	childEnv     = "GDIST_TRANSFORMER_TEST_CHILD"
	childArgsEnv = "GDIST_TRANSFORMER_TEST_ARGS"
)

// childMain runs the program with the arguments in childArgsEnv, the way
// main does, and returns its exit code.
func childMain(role string) int {
	if role != "run" {
		fmt.Fprintln(os.Stderr, "unknown child role", role)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	args := strings.Split(os.Getenv(childArgsEnv), "\n")
	if err := run(ctx, args, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "transformer: error:", err)
		return 1
	}
	return 0
}

// spawnRanks starts n ranks of the test binary running the program with
// args, over TCP on loopback, as gdistrun would, and waits for them.
func spawnRanks(t *testing.T, n int, args ...string) []*procjob.Proc {
	t.Helper()
	procs := procjob.Start(t, n, procjob.Config{RoleEnv: childEnv, Role: "run",
		Env: []string{childArgsEnv + "=" + strings.Join(args, "\n")}})
	for r, p := range procs {
		if err := p.Wait(90 * time.Second); err != nil {
			t.Fatalf("rank %d: %v; stderr:\n%s", r, err, p.Stderr())
		}
	}
	return procs
}

// TestGenerateProcesses runs generate as a 2-stage pipeline of two OS
// processes over TCP and checks that rank 0 prints exactly the text one
// process generates.
func TestGenerateProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	path := tinyCheckpoint(t)
	want := genOnRanks(t, 1, genConfig{Ckpt: path, Prompt: "Light is", N: 40, Temperature: 0.8, Seed: 11})
	procs := spawnRanks(t, 2, "generate", "-ckpt", path, "-prompt", "Light is", "-n", "40", "-temperature", "0.8", "-seed", "11")
	assert.Equal(t, want.Text+"\n", procs[0].Output(), "rank 0 prints the single-process text")
	assert.Empty(t, procs[1].Output())
	assert.Contains(t, procs[0].Stderr(), "2-stage pipeline, layers 0..1 | 2..3")
	assert.Contains(t, procs[1].Stderr(), "stage 1 of 2 ran layers 2..3")
	t.Logf("rank 0: %s", procs[0].Stderr())
}

// TestTrainProcesses trains with DDP on two OS processes over TCP: the
// ranks end identical and rank 0 saves a checkpoint that generates.
func TestTrainProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	dir := t.TempDir()
	text := filepath.Join(dir, "text.txt")
	require.NoError(t, os.WriteFile(text, []byte(testText), 0o644))
	ckpt := filepath.Join(dir, "m.gdc")
	procs := spawnRanks(t, 2, "train", "-text", text, "-steps", "10", "-eval-every", "5", "-eval-windows", "4",
		"-ctx", "16", "-dim", "16", "-heads", "2", "-layers", "1", "-mlp", "32", "-batch", "4", "-lr", "0.01", "-out", ckpt)
	out := procs[0].Output()
	t.Log(out)
	assert.Contains(t, out, "2 rank(s)")
	assert.Contains(t, out, "DDP in 1 bucket(s); batch 4 per rank (8 global)")
	assert.Contains(t, out, "parameters identical on all 2 ranks")
	assert.Empty(t, procs[1].Output())
	_, err := os.Stat(ckpt)
	require.NoError(t, err)
}

// TestHelp: -h on the program and on each command prints the usage and
// exits 0 without running.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"-help"}, {"train", "-h"}, {"generate", "-help"}} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), args, &stdout, &stderr)
		assert.Equal(t, 0, cli.ExitCode("transformer", errUsage, err, &stderr), "%q", args)
		assert.Contains(t, stdout.String()+stderr.String(), "Usage", "%q", args)
	}
}

// TestTrain3DGdistrun: train -dp 2 -pp 2 -tp 2 launched by gdistrun on 8
// processes saves the single-process model's checkpoint: the same names and
// shapes, and parameters within float32 rounding of one process trained
// with -dp 1 -pp 1 -tp 1 on the same global batches.
func TestTrain3DGdistrun(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	for _, v := range []string{"RANK", "WORLD_SIZE", "MASTER_ADDR"} {
		if _, ok := os.LookupEnv(v); ok {
			t.Skipf("%s is set: the one-process run needs a world of one", v)
		}
	}
	dir := t.TempDir()
	text := filepath.Join(dir, "text.txt")
	require.NoError(t, os.WriteFile(text, []byte(testText), 0o644))
	common := []string{"train", "-text", text, "-steps", "8", "-eval-every", "4", "-ctx", "16", "-dim", "16",
		"-heads", "2", "-layers", "2", "-mlp", "32", "-batch", "4", "-lr", "0.01"}
	one := filepath.Join(dir, "one.gdc")
	var stdout, stderr bytes.Buffer
	require.NoError(t, run(context.Background(), append(common, "-dp", "1", "-pp", "1", "-tp", "1", "-out", one), &stdout, &stderr), stderr.String())

	self, err := os.Executable()
	require.NoError(t, err)
	eight := filepath.Join(dir, "eight.gdc")
	args := append(common, "-dp", "2", "-pp", "2", "-tp", "2", "-out", eight)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	cmd := exec.CommandContext(ctx, gdistrun(t), "-n", "8", "--", self)
	cmd.Env = append(os.Environ(), childEnv+"=run", childArgsEnv+"="+strings.Join(args, "\n"))
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	require.NoError(t, cmd.Run(), "gdistrun:\n%s", buf.String())
	out := buf.String()
	t.Logf("gdistrun -n 8 in %.1fs:\n%s", time.Since(start).Seconds(), out)
	assert.Contains(t, out, "8 rank(s) as dp=2 pp=2 tp=2")
	assert.Contains(t, out, "the single-process model, gathered from every rank")

	a, err := transformer.Load(one)
	require.NoError(t, err)
	b, err := transformer.Load(eight)
	require.NoError(t, err)
	assert.Equal(t, a.Config, b.Config)
	require.Equal(t, len(a.Tensors), len(b.Tensors))
	worst := 0.0
	for i := range a.Tensors {
		require.Equal(t, a.Tensors[i].Name, b.Tensors[i].Name)
		require.Equal(t, a.Tensors[i].Tensor.Shape(), b.Tensors[i].Tensor.Shape())
		x, y := a.Tensors[i].Tensor.Data().([]float32), b.Tensors[i].Tensor.Data().([]float32)
		var diff, scale float64
		for j := range x {
			diff = max(diff, math.Abs(float64(x[j])-float64(y[j])))
			scale = max(scale, math.Abs(float64(x[j])))
		}
		worst = max(worst, diff/scale)
	}
	t.Logf("largest relative parameter difference from one process after 8 float32 steps: %.3g", worst)
	assert.Less(t, worst, 1e-4)
}
