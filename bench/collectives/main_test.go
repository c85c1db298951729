package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/gdist/gdist/internal/cli"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" { // a rank started by TestSweep
		err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr)
		os.Exit(cli.ExitCode("collectives", errUsage, err, os.Stderr))
	}
	os.Exit(m.Run())
}

// TestSweep runs a small sweep of every collective with 2 and 3 OS
// processes and checks the table: every size present, nothing wrong.
func TestSweep(t *testing.T) {
	args := []string{"-np", "2,3", "-b", "8", "-e", "64K", "-f", "8", "-n", "2", "-w", "1", "-group", "world,sub"}
	var out, errb bytes.Buffer
	require.NoError(t, run(context.Background(), args, &out, &errb), "stderr:\n%s", errb.String())
	t.Log("\n" + out.String())
	rows := map[string]int{}
	op := ""
	for _, l := range strings.Split(out.String(), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) == 2 && f[0] == "#":
			op = f[1]
		case len(f) == 13 && !strings.HasPrefix(l, "#"):
			rows[op+" "+f[5]]++
			wrong, err := strconv.Atoi(f[9])
			require.NoError(t, err, l)
			assert.Zero(t, wrong, "%s: %s", op, l)
		}
	}
	// Sizes 8, 64, 512, 4096, 32768 for each of 2 world sizes and on each
	// group (all_gather and reduce_scatter skip 8 B with 3 ranks: less than
	// one element each).
	for _, g := range []string{"world", "sub"} {
		assert.Equal(t, 10, rows["all_reduce "+g])
		assert.Equal(t, 10, rows["broadcast "+g])
		assert.Equal(t, 9, rows["all_gather "+g])
		assert.Equal(t, 9, rows["reduce_scatter "+g])
	}
	assert.Contains(t, out.String(), "raw TCP baseline")
}

func TestCountWrong(t *testing.T) {
	const n, me = 3, 1
	dst := make([]float32, 6)
	for i := range dst {
		for r := range n {
			dst[i] += input(r, i)
		}
	}
	assert.Zero(t, countWrong("all_reduce", n, me, dst))
	dst[4]++
	assert.Equal(t, 1, countWrong("all_reduce", n, me, dst))
	rs := make([]float32, 2)
	for i := range rs {
		for r := range n {
			rs[i] += input(r, me*2+i)
		}
	}
	assert.Zero(t, countWrong("reduce_scatter", n, me, rs))
}

// TestHelp: -h and -help print the usage and exit 0; a bad flag exits 2.
func TestHelp(t *testing.T) {
	for _, h := range []string{"-h", "-help"} {
		var out, errb bytes.Buffer
		err := run(context.Background(), []string{h}, &out, &errb)
		assert.Equal(t, 0, cli.ExitCode("collectives", errUsage, err, &errb), h)
		assert.Contains(t, errb.String(), "-np string", h)
		assert.Empty(t, out.String(), "%s runs nothing", h)
	}
	var out, errb bytes.Buffer
	err := run(context.Background(), []string{"-np", "0"}, &out, &errb)
	assert.Equal(t, 2, cli.ExitCode("collectives", errUsage, err, &errb))
	assert.Contains(t, errb.String(), "bad -np entry")
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags(flag.NewFlagSet("x", flag.ContinueOnError), []string{"-b", "1K", "-e", "2M", "-ops", "broadcast", "-np", "4"})
	require.NoError(t, err)
	assert.Equal(t, int64(1024), o.minBytes)
	assert.Equal(t, int64(2<<20), o.maxBytes)
	assert.Equal(t, []string{"broadcast"}, o.ops)
	assert.Equal(t, []int{4}, o.nps)
	for _, bad := range [][]string{{"-ops", "gather"}, {"-np", "0"}, {"-group", "both"}, {"-b", "2K", "-e", "1K"}, {"-f", "1"}, {"-b", "x"}} {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		_, err := parseFlags(fs, bad)
		assert.ErrorIs(t, err, errUsage, "%v", bad)
	}
}

// TestTransports: -transport runs one job per transport, each table
// naming the transport that ran, with nothing wrong; an unknown one is a
// usage error.
func TestTransports(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the shared-memory transport needs Linux")
	}
	args := []string{"-np", "2", "-transport", "tcp,shm", "-ops", "all_reduce,reduce_scatter", "-b", "8", "-e", "1M", "-f", "32", "-n", "2", "-w", "1"}
	var out, errb bytes.Buffer
	require.NoError(t, run(context.Background(), args, &out, &errb), "stderr:\n%s", errb.String())
	t.Log("\n" + out.String())
	s := out.String()
	assert.Contains(t, s, "transport tcp (rank 0: tcp to 1 peer)")
	assert.Contains(t, s, "transport shm (rank 0: shm to 1 peer)")
	assert.Less(t, strings.Index(s, "transport tcp"), strings.Index(s, "transport shm"))
	rows := 0
	for _, l := range strings.Split(s, "\n") {
		if f := strings.Fields(l); len(f) == 13 && !strings.HasPrefix(l, "#") {
			rows++
			assert.Equal(t, "0", f[9], "#wrong: %s", l)
		}
	}
	assert.Equal(t, 2*2*4, rows, "2 transports x 2 collectives x 4 sizes")
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	_, err := parseFlags(fs, []string{"-transport", "udp"})
	assert.ErrorIs(t, err, errUsage)
}
