//go:build unix

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

// TestMain runs a rank when a test below started this binary as one.
func TestMain(m *testing.M) {
	if os.Getenv(roleEnv) != "" {
		os.Exit(cli.ExitCode("federation", errUsage, run(context.Background(), os.Args[1:], os.Stdout, os.Stderr), os.Stderr))
	}
	os.Exit(m.Run())
}

// TestRun runs the stress loop twice (TCP, then shared memory), small.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	args := []string{"-n", "2", "-clients", "3", "-rounds", "30", "-kill-at", "3", "-freeze-at", "9",
		"-freeze", "1500ms", "-heartbeat", "500ms", "-pause", "150ms", "-dim", "256", "-v"}
	require.NoError(t, run(context.Background(), args, &out, io.Discard), out.String())
	t.Log(out.String())
	assert.Contains(t, out.String(), "2 runs (tcp 1, shm 1), 0 failed")
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{{"-clients", "1"}, {"-freeze", "1s", "-heartbeat", "2s"}, {"-transport", "udp"}, {"-rounds", "15"}} {
		var stderr bytes.Buffer
		err := run(context.Background(), args, io.Discard, &stderr)
		assert.ErrorIs(t, err, errUsage, "%v", args)
		assert.NotEmpty(t, stderr.String(), "%v", args)
	}
}
