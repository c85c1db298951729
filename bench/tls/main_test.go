package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/internal/cli"
)

// TestMain runs a rank when the test below started this binary as one.
func TestMain(m *testing.M) {
	if os.Getenv(certsEnv) != "" {
		os.Exit(cli.ExitCode("tls", errUsage, run(context.Background(), os.Args[1:], os.Stdout, os.Stderr), os.Stderr))
	}
	os.Exit(m.Run())
}

// TestRun measures one small round.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), []string{"-rounds", "1", "-stream-msgs", "1", "-allreduce-iters", "20"}, &out, io.Discard))
	t.Log(out.String())
	assert.Contains(t, out.String(), "stream of 16 MiB messages, GB/s")
	assert.Contains(t, out.String(), "all-reduce 4096 float32, us")
}
