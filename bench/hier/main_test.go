package main

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/internal/cli"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" { // a rank started by TestLoopback
		err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr)
		os.Exit(cli.ExitCode("hier", errUsage, err, os.Stderr))
	}
	os.Exit(m.Run())
}

// TestLoopback runs one flat and one hierarchical job of 4 OS processes on
// loopback and checks the table: every size, nothing wrong, and less sent
// across hosts by the hierarchical all-reduce (2/3 of the flat ring's
// bytes for 2 hosts of 2 ranks).
func TestLoopback(t *testing.T) {
	args := []string{"-b", "64K", "-e", "1M", "-n", "2", "-w", "1", "-runs", "1"}
	var out, errb bytes.Buffer
	require.NoError(t, run(context.Background(), args, &out, &errb), "stderr:\n%s", errb.String())
	t.Log("\n" + out.String())
	rows := 0
	for _, l := range strings.Split(out.String(), "\n") {
		f := strings.Fields(l)
		if len(f) != 9 || strings.HasPrefix(l, "#") || f[0] == "size(B)" {
			continue
		}
		rows++
		num := func(i int) float64 {
			v, err := strconv.ParseFloat(f[i], 64)
			require.NoError(t, err, l)
			return v
		}
		assert.Zero(t, num(8), "#wrong: %s", l)
		flat, hier := num(5), num(6)
		if num(0) >= 256<<10 { // the ring sizes: exactly 2(n-1)/n vs 2(h-1)/h, halved over the ranks
			assert.InDelta(t, flat*2/3, hier, flat*0.01, l)
		} else {
			assert.Less(t, hier, flat, l)
		}
	}
	assert.Equal(t, 3, rows) // 64K, 256K, 1M
}

func TestParseSize(t *testing.T) {
	for s, want := range map[string]int64{"8": 8, "64K": 64 << 10, "16M": 16 << 20, "1G": 1 << 30} {
		got, err := parseSize(s)
		require.NoError(t, err)
		assert.Equal(t, want, got, s)
	}
	for _, s := range []string{"", "K", "-1", "1T"} {
		_, err := parseSize(s)
		assert.Error(t, err, s)
	}
}
