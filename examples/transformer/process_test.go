package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/internal/cli"
	"github.com/gdist/gdist/internal/procjob"
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
