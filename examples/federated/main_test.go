package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gdist/gdist/internal/cli"
	"github.com/gdist/gdist/internal/launchenv"
	"github.com/gdist/gdist/internal/mnist"
)

// TestMain runs a rank when the supervisor of a test below started this
// binary as one (MASTER_PORT set), the tests otherwise.
func TestMain(m *testing.M) {
	if _, ok := os.LookupEnv(launchenv.EnvMasterPort); ok {
		os.Exit(cli.ExitCode("federated", errUsage, run(context.Background(), os.Args[1:], os.Stdout, os.Stderr), os.Stderr))
	}
	goleak.VerifyTestMain(m)
}

func needMNIST(t *testing.T) {
	if _, err := mnist.Locate(""); err != nil {
		t.Skipf("MNIST data not found: %v", err)
	}
}

// TestRun runs the example small: 3 clients of 300 images, 4 rounds, client
// 2 killed before round 2 and started again before round 3; with and
// without secure aggregation. It checks the supervisor's story and that
// every round reports who took part. (Rounds this small end before a
// restarted process has loaded its data: its return is package dist/fed's
// process tests' to check.)
func TestRun(t *testing.T) {
	needMNIST(t)
	for _, secure := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "secagg"}[secure], func(t *testing.T) {
			args := []string{"-clients", "3", "-limit", "300", "-rounds", "4", "-kill", "2", "-kill-at", "2", "-restart-at", "3", "-batch", "50", "-heartbeat", "1s"}
			if secure {
				args = append(args, "-secagg")
			}
			var out bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			require.NoError(t, run(ctx, args, &out, io.Discard), "%s", out.String())
			text := out.String()
			t.Log(text)
			assert.Contains(t, text, "supervisor: killed client 2 with SIGKILL before round 2")
			assert.Contains(t, text, "supervisor: started client 2 again before round 3")
			rounds := regexp.MustCompile(`(?m)^\[0\] round +(\d)/4 +test accuracy +[\d.]+% +took part: ((?:\d+ )*\d+|-) `).FindAllStringSubmatch(text, -1)
			require.Len(t, rounds, 4, "a line per round")
			assert.Equal(t, "1 2 3", rounds[0][2], "round 1: everybody")
			assert.NotContains(t, rounds[1][2], "2", "round 2: client 2 was killed")
			assert.Contains(t, text, "final test accuracy")
			if secure {
				assert.Contains(t, text, "secure aggregation")
			}
			assert.True(t, strings.Contains(text, "left: 2"), "the leader reports client 2 left")
		})
	}
}

func TestDigits(t *testing.T) {
	assert.Equal(t, []uint8{0, 1}, digitsOf(1, 5))
	assert.Equal(t, []uint8{8, 9}, digitsOf(5, 5))
	assert.Equal(t, []uint8{0, 1, 2, 3}, digitsOf(1, 3))
	assert.Equal(t, []uint8{4, 5, 6}, digitsOf(2, 3))
	assert.Equal(t, []uint8{7, 8, 9}, digitsOf(3, 3))
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-clients", "1"}, {"-kill", "9"}, {"-kill-at", "1"}, {"-restart-at", "3"}, {"-lr", "0"}, {"-lr-decay", "2"}, {"-server-lr", "0"},
	} {
		var stderr bytes.Buffer
		err := run(context.Background(), args, io.Discard, &stderr)
		require.ErrorIs(t, err, errUsage, "%v", args)
		assert.NotEmpty(t, stderr.String(), "%v says why", args)
	}
}
