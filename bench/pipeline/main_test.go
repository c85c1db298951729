package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/internal/cli"
)

// testChildEnv makes the test binary a worker: TestSweep sets it, and the
// workers it starts inherit it.
const testChildEnv = "GDIST_BENCH_PIPELINE_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(testChildEnv) != "" {
		err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr)
		os.Exit(cli.ExitCode("pipeline", errUsage, err, os.Stderr))
	}
	os.Exit(m.Run())
}

// TestSweep runs a tiny sweep with 1 and 2 stage processes.
func TestSweep(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	t.Setenv(testChildEnv, "1")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err := run(ctx, []string{"-stages", "1,2", "-micro", "2", "-modes", "gpipe,1f1b,zb-h1,interleaved,infer", "-layers", "4", "-width", "16",
		"-batch", "8", "-steps", "2", "-warmup", "1", "-rounds", "2", "-repeat", "2"}, &stdout, &stderr)
	require.NoError(t, err, "stderr:\n%s", stderr.String())
	out := stdout.String()
	t.Log("\n" + out)
	assert.Contains(t, out, "between ranks 0 and 1, one way: raw TCP")
	assert.Contains(t, out, "# plain Gorgonia")
	for _, m := range []string{"gpipe", "1f1b", "zb-h1", "interleaved", "infer"} {
		assert.Contains(t, out, "## "+m)
	}
	assert.Contains(t, out, "# recommended for 2 stages")
	assert.Regexp(t, `# p=2: 1F1B / GPipe \(median of paired rounds\): m=2 \d+\.\d\dx\n`, out)
	assert.Regexp(t, `# p=2: inference / one stage \(median of paired rounds\): m=2 \d+\.\d\dx\n`, out)
	assert.Regexp(t, `# p=2: inference / one stage alone in the same job.*: m=2 \d+\.\d\dx\n`, out)
	assert.Regexp(t, `# p=2: control, 2 one-stage processes at once / one alone.*: m=2 \d+\.\d\dx\n`, out)
	assert.Regexp(t, `# p=2: inference / the control's 2 processes at once.*: m=2 \d+\.\d\dx\n`, out)
	rows := 0
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 2 && (f[0] == "1" || f[0] == "2") && f[1] == "2" {
			rows++
			assert.True(t, strings.HasSuffix(f[3], "x"), "the /plain column: %q", l)
		}
	}
	assert.Equal(t, 10, rows, "p = 1, 2 at m = 2 for five modes")
}

// TestHelp: -h and -help print the usage and exit 0; bad values exit 2.
func TestHelp(t *testing.T) {
	for _, h := range []string{"-h", "-help"} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), []string{h}, &stdout, &stderr)
		assert.Equal(t, 0, cli.ExitCode("pipeline", errUsage, err, &stderr), h)
		assert.Contains(t, stderr.String(), "-micro string", h)
		assert.Empty(t, stdout.String(), "%s runs nothing", h)
	}
	for _, bad := range [][]string{{"-micro", "3"}, {"-stages", "x"}, {"-dtype", "int8"}, {"-modes", "2f2b"}, {"-stages", "3"}, {"-rounds", "0"}, {"extra"}} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), bad, &stdout, &stderr)
		assert.Equal(t, 2, cli.ExitCode("pipeline", errUsage, err, &stderr), "%q", bad)
		assert.Empty(t, stdout.String())
	}
}
