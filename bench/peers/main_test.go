package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/internal/cli"
)

// testChildEnv makes the test binary a worker: the tests set it, and the
// workers they start inherit it.
const testChildEnv = "GDIST_BENCH_PEERS_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(testChildEnv) != "" {
		err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr)
		os.Exit(cli.ExitCode("peers", errUsage, err, os.Stderr))
	}
	os.Exit(m.Run())
}

// tiny are settings that make a run take about a second.
var tiny = []string{"-rounds", "2", "-bind", "none", "-pp-sizes", "8,4096", "-pp-iters", "200", "-pp-warmup", "20",
	"-stream-sizes", "65536", "-stream-mib", "4", "-ar-sizes", "16384,1048576", "-ar-iters", "20", "-ar-warmup", "2"}

// rows returns the report's rows by measure.
func rows(out string) map[string][]string {
	m := map[string][]string{}
	for _, l := range strings.Split(out, "\n") {
		if l == "" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, "measure") {
			continue
		}
		i := strings.Index(l, "  ")
		m[strings.TrimSpace(l[:i])] = strings.Fields(l[i:])
	}
	return m
}

// TestGdistOnly runs the gdist side alone (no -mpi) and checks the report.
func TestGdistOnly(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	t.Setenv(testChildEnv, "1")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	require.NoError(t, run(ctx, tiny, &stdout, &stderr), "stderr:\n%s", stderr.String())
	out := stdout.String()
	t.Log("\n" + out)
	r := rows(out)
	for _, m := range []string{"ping-pong RTT 8 B", "ping-pong RTT 4 KiB", "stream 64 KiB", "all-reduce 16 KiB (4096 f32) time", "all-reduce 1 MiB (262144 f32) busbw"} {
		require.Contains(t, r, m)
		assert.Len(t, r[m], 2, "%s: unit and the gdist median", m)
	}
	assert.NotContains(t, out, "WRONG")
}

// TestWithOpenMPI builds mpi_peer with mpicc and runs both peers, when Open
// MPI is installed (bench/peers/run.sh installs it).
func TestWithOpenMPI(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	mpicc, err := exec.LookPath("mpicc")
	if err != nil {
		t.Skip("mpicc not installed")
	}
	if _, err := exec.LookPath("mpirun"); err != nil {
		t.Skip("mpirun not installed")
	}
	// Debian's openmpi-bin brings mpicc without mpi.h (libopenmpi-dev has it).
	probe := exec.Command(mpicc, "-E", "-x", "c", "-")
	probe.Stdin = strings.NewReader("#include <mpi.h>\n")
	if err := probe.Run(); err != nil {
		t.Skip("Open MPI's headers are not installed (libopenmpi-dev)")
	}
	bin := filepath.Join(t.TempDir(), "mpi_peer")
	out, err := exec.Command(mpicc, "-O2", "-Wall", "-o", bin, "mpi/mpi_peer.c").CombinedOutput()
	require.NoError(t, err, "%s", out)
	t.Setenv(testChildEnv, "1")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	require.NoError(t, run(ctx, append([]string{"-mpi", bin}, tiny...), &stdout, &stderr), "stderr:\n%s", stderr.String())
	t.Log("\n" + stdout.String())
	r := rows(stdout.String())
	require.Contains(t, r, "ping-pong RTT 8 B")
	f := r["ping-pong RTT 8 B"]
	require.Len(t, f, 6, "unit, gdist, Open MPI, ratio, range, better")
	assert.Equal(t, "lower", f[5])
	assert.True(t, strings.HasSuffix(f[3], "x"), f[3])
	assert.Equal(t, "higher", r["stream 64 KiB"][5])
	assert.NotContains(t, stdout.String(), "WRONG")
}

// TestFlags: -h prints the usage and exits 0; bad values exit 2.
func TestFlags(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"-h"}, &stdout, &stderr)
	assert.Equal(t, 0, cli.ExitCode("peers", errUsage, err, &stderr))
	assert.Contains(t, stderr.String(), "-mpi string")
	for _, bad := range [][]string{{"-ar-sizes", "6"}, {"-bind", "socket"}, {"-rounds", "0"}, {"-pp-sizes", "x"}, {"extra"}} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), bad, &stdout, &stderr)
		assert.Equal(t, 2, cli.ExitCode("peers", errUsage, err, &stderr), "%q", bad)
		assert.Empty(t, stdout.String())
	}
}
