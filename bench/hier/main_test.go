package main

import (
	"bytes"
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gdist/gdist/internal/cli"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" { // a rank started by TestLoopback
		err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr)
		os.Exit(cli.ExitCode("hier", errUsage, err, os.Stderr))
	}
	goleak.VerifyTestMain(m)
}

// TestLoopback runs one job of each combination (flat and hierarchical,
// over TCP and hybrid) of 4 OS processes on loopback, the hosts simulated
// with GDIST_HOST_ID, and checks the output: the routes each rank's
// transport reported (TCP only, or shared memory within a host on Linux),
// every size, nothing wrong, and less sent across hosts by the
// hierarchical all-reduce (2/3 of the flat ring's bytes for 2 hosts of 2
// ranks).
func TestLoopback(t *testing.T) {
	args := []string{"-b", "64K", "-e", "256K", "-n", "2", "-w", "1", "-runs", "1", "-transport", "tcp,auto"}
	var out, errb bytes.Buffer
	require.NoError(t, run(context.Background(), args, &out, &errb), "stderr:\n%s", errb.String())
	t.Log("\n" + out.String())

	intra := "tcp"
	if runtime.GOOS == "linux" {
		intra = "shm"
	}
	wantRoutes := map[string]string{
		"tcp": "r0=self,tcp,tcp,tcp r1=tcp,self,tcp,tcp r2=tcp,tcp,self,tcp r3=tcp,tcp,tcp,self (hosts 0,0,1,1)",
		"hyb": strings.NewReplacer("X", intra).Replace("r0=self,X,tcp,tcp r1=X,self,tcp,tcp r2=tcp,tcp,self,X r3=tcp,tcp,X,self (hosts 0,0,1,1)"),
	}
	var col map[string]int
	rows := 0
	for _, l := range strings.Split(out.String(), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) > 3 && f[0] == "#" && f[1] == "routes":
			want, ok := wantRoutes[f[2]]
			if assert.True(t, ok, l) {
				assert.Equal(t, want, strings.TrimSpace(l[strings.Index(l, "):")+2:]), l)
				delete(wantRoutes, f[2])
			}
		case len(f) > 0 && f[0] == "size(B)":
			col = map[string]int{}
			for i, name := range f {
				col[name] = i
			}
		case col != nil && len(f) == len(col) && !strings.HasPrefix(l, "#"):
			rows++
			num := func(name string) float64 {
				i, ok := col[name]
				require.True(t, ok, "no column %s", name)
				v, err := strconv.ParseFloat(f[i], 64)
				require.NoError(t, err, l)
				return v
			}
			assert.Zero(t, num("#wrong"), "#wrong: %s", l)
			for _, c := range []string{"flat-tcp", "hier-tcp", "flat-hyb", "hier-hyb"} {
				assert.Positive(t, num(c), "%s: %s", c, l)
			}
			flat, hier := num("x-host:flat"), num("x-host:hier")
			if num("size(B)") >= 256<<10 { // the ring sizes: exactly 2(n-1)/n vs 2(h-1)/h, halved over the ranks
				assert.InDelta(t, flat*2/3, hier, flat*0.01, l)
			} else {
				assert.Less(t, hier, flat, l)
			}
		}
	}
	assert.Empty(t, wantRoutes, "routes not printed")
	assert.Equal(t, 2, rows) // 64K, 256K
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

func TestParseTransports(t *testing.T) {
	for s, want := range map[string][]string{"tcp": {"tcp"}, "auto": {"auto"}, "tcp,auto": {"tcp", "auto"}, "auto,tcp": {"auto", "tcp"}} {
		got, err := parseTransports(s)
		require.NoError(t, err)
		assert.Equal(t, want, got, s)
	}
	for _, s := range []string{"", "shm", "tcp,tcp", "tcp,", "TCP"} {
		_, err := parseTransports(s)
		assert.Error(t, err, s)
	}
}
