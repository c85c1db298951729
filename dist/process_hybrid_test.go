//go:build linux

package dist_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist"
	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/transport/hybrid"
	"github.com/gdist/gdist/internal/procjob"
)

// Multi-process hybrid jobs, joined through gdist.InitFromEnv (which
// package dist cannot import, hence this external test package; the
// collective checks come from export_test.go): the test binary re-executes
// itself with hybridChildEnv set; init sends such a process to hybridChild
// before any test runs (TestMain belongs to the package's other tests).
const (
	hybridChildEnv = "GDIST_DIST_TEST_HYBRID"      // the expected mode: tcp, shm or auto
	hybridHostsEnv = "GDIST_DIST_TEST_HOSTS"       // every rank's GDIST_HOST_ID, comma-separated
	hybridKillEnv  = "GDIST_DIST_TEST_HYBRID_KILL" // "1": after the checks, loop on all-reduces (dist.ChildKill)
)

func init() {
	if mode := os.Getenv(hybridChildEnv); mode != "" {
		os.Exit(hybridChild(mode))
	}
}

// TestProcessHybrid runs every collective against the naive reference in
// jobs of 2 to 4 OS processes on two simulated hosts (GDIST_HOST_ID), for
// each GDIST_TRANSPORT; each rank checks its routes: shared memory within
// a host unless the mode is tcp, TCP across hosts.
func TestProcessHybrid(t *testing.T) {
	env := []string{}
	if testing.Short() || dist.RaceEnabled {
		env = append(env, dist.LightEnv+"=1")
	}
	for _, c := range []struct {
		mode  string
		hosts string
	}{
		{"tcp", "A,A,B,B"},
		{"shm", "A,A,B,B"},
		{"auto", "A,A,B,B"},
		{"auto", "A,B,A"},
		{"shm", "A,A"},
	} {
		hosts := strings.Split(c.hosts, ",")
		t.Run(c.mode+"/"+c.hosts, func(t *testing.T) {
			before := gdistSHMFiles(t)
			defer func() { assert.Equal(t, before, gdistSHMFiles(t), "/dev/shm unchanged") }()
			procs := procjob.Start(t, len(hosts), procjob.Config{RoleEnv: hybridChildEnv, Role: c.mode, LogStderr: true,
				Env: append([]string{"GOMAXPROCS=1", gdist.EnvTransport + "=" + c.mode, hybridHostsEnv + "=" + c.hosts}, env...)})
			for r, p := range procs {
				require.NoError(t, p.Wait(2*time.Minute), "rank %d", r)
				assert.Contains(t, p.Lines(), "ok", "rank %d", r)
			}
		})
	}
}

// gdistSHMFiles lists the entries of /dev/shm that mention gdist. (Other
// programs on the machine may add files there meanwhile; gdist's shared
// memory is anonymous memfds, which never appear there.)
func gdistSHMFiles(t *testing.T) []string {
	es, err := os.ReadDir("/dev/shm")
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	var names []string
	for _, e := range es {
		if strings.Contains(strings.ToLower(e.Name()), "gdist") {
			names = append(names, e.Name())
		}
	}
	return names
}

func hybridChild(mode string) int {
	hosts := strings.Split(os.Getenv(hybridHostsEnv), ",")
	rank, err := strconv.Atoi(os.Getenv(gdist.EnvRank))
	if err != nil || rank < 0 || rank >= len(hosts) {
		fmt.Fprintln(os.Stderr, "bad rank", os.Getenv(gdist.EnvRank))
		return 2
	}
	os.Setenv(gdist.EnvHostID, hosts[rank])
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g, err := gdist.InitFromEnv(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "InitFromEnv:", err)
		return 1
	}
	defer g.Close()
	tr, ok := g.Transport().(*hybrid.Transport)
	if !ok {
		fmt.Fprintf(os.Stderr, "transport %T\n", g.Transport())
		return 1
	}
	var wantHosts []int
	index := map[string]int{}
	for _, h := range hosts {
		if _, ok := index[h]; !ok {
			index[h] = len(index)
		}
		wantHosts = append(wantHosts, index[h])
	}
	if got := tr.Hosts(); !slices.Equal(got, wantHosts) {
		fmt.Fprintf(os.Stderr, "Hosts %v, want %v\n", got, wantHosts)
		return 1
	}
	for p := range hosts {
		want := hybrid.ViaTCP
		switch {
		case p == rank:
			want = hybrid.ViaSelf
		case hosts[p] == hosts[rank] && mode != "tcp":
			want = hybrid.ViaSHM
		}
		if got := tr.Via(p); got != want {
			fmt.Fprintf(os.Stderr, "rank %d reaches rank %d via %s, want %s\n", rank, p, got, want)
			return 1
		}
		if got := tr.SharedMemory(p); got != (want != hybrid.ViaTCP) {
			fmt.Fprintf(os.Stderr, "rank %d: SharedMemory(%d) = %v via %s\n", rank, p, got, want)
			return 1
		}
	}
	if os.Getenv(hybridKillEnv) == "1" {
		return dist.ChildKill(g)
	}
	if code := dist.ChildCollectives(g); code != 0 {
		return code
	}
	fmt.Println("ok")
	return 0
}

// TestProcessHybridKill SIGKILLs rank 2 of a 3-process job on hosts A, B,
// A in the middle of a stream of all-reduces: rank 0 reaches it through
// shared memory, rank 1 through TCP, and both fail within 5 s with a
// *PeerError naming it.
func TestProcessHybridKill(t *testing.T) {
	const victim = 2
	procs := procjob.Start(t, 3, procjob.Config{RoleEnv: hybridChildEnv, Role: "auto", LogStderr: true,
		Env: []string{"GOMAXPROCS=1", hybridHostsEnv + "=A,B,A", hybridKillEnv + "=1"}})
	dist.KillMidStream(t, procs, victim, "peer_error rank=2 ")
}
