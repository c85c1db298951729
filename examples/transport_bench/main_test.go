package main

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/internal/cli"
)

// testChildEnv makes the test binary a rank: TestRun sets it, and the ranks
// it starts inherit it.
const testChildEnv = "GDIST_TRANSPORT_BENCH_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(testChildEnv) != "" {
		err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr)
		os.Exit(cli.ExitCode("transport_bench", errUsage, err, os.Stderr))
	}
	os.Exit(m.Run())
}

// TestRun runs a tiny benchmark: the program starts both ranks and prints
// rank 0's report.
func TestRun(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	if os.Getenv("RANK") != "" {
		t.Skip("RANK is set: the test starts its own ranks")
	}
	t.Setenv(testChildEnv, "1")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err := run(ctx, []string{"-rounds", "1", "-pingpong-iters", "100", "-warmup", "10", "-stream-mib", "1",
		"-sizes", "65536", "-allreduce-iters", "50", "-allreduce-big-iters", "1"}, &stdout, &stderr)
	require.NoError(t, err, "stderr:\n%s", stderr.String())
	out := stdout.String()
	t.Log("\n" + out)
	assert.Contains(t, out, "ping-pong RTT")
	assert.Contains(t, out, "64 KiB")
	assert.Contains(t, out, "a raw 16 MiB exchange, both ways at once")
}

// TestHelp: -h and -help print the usage and exit 0; bad values exit 2.
func TestHelp(t *testing.T) {
	for _, h := range []string{"-h", "-help"} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), []string{h}, &stdout, &stderr)
		assert.Equal(t, 0, cli.ExitCode("transport_bench", errUsage, err, &stderr), h)
		assert.Contains(t, stderr.String(), "-pingpong-iters int", h)
		assert.Empty(t, stdout.String(), "%s runs nothing", h)
	}
	for _, bad := range [][]string{{"-rounds", "0"}, {"-sizes", "x"}, {"extra"}} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), bad, &stdout, &stderr)
		assert.Equal(t, 2, cli.ExitCode("transport_bench", errUsage, err, &stderr), "%q", bad)
		assert.Empty(t, stdout.String())
	}
}
