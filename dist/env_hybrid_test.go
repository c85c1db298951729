//go:build linux

package dist

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/metrics"
	"github.com/gdist/gdist/dist/transport/hybrid"
	"github.com/gdist/gdist/dist/transport/shm"
	"github.com/gdist/gdist/internal/launchenv"
	"github.com/gdist/gdist/internal/procjob"
)

func TestHybridEnvOptions(t *testing.T) {
	for _, c := range []struct {
		env []string
		n   int
		bad string
	}{
		{nil, 0, ""},
		{[]string{EnvTransport, ""}, 0, ""},
		{[]string{EnvTransport, "auto"}, 1, ""},
		{[]string{EnvTransport, "tcp"}, 1, ""},
		{[]string{EnvTransport, "shm"}, 1, ""},
		{[]string{EnvTransport, "SHM"}, 0, EnvTransport},
		{[]string{EnvTransport, "rdma"}, 0, EnvTransport},
		{[]string{EnvHostID, "node-a"}, 1, ""},
		{[]string{EnvHostID, strings.Repeat("h", hybrid.MaxHostID+1)}, 0, EnvHostID},
		{[]string{EnvTransport, "tcp", EnvHostID, "b"}, 2, ""},
	} {
		opts, err := hybridEnvOptions(lookupOf(c.env...))
		if c.bad != "" {
			require.ErrorIs(t, err, ErrEnv, "%v", c.env)
			assert.Contains(t, err.Error(), c.bad, "%v", c.env)
			continue
		}
		require.NoError(t, err, "%v", c.env)
		assert.Len(t, opts, c.n, "%v", c.env)
	}
}

// TestSHMEnvOptions: the heartbeat and maximum frame reach the
// shared-memory links too, and the shm transport accepts what the
// environment allows.
func TestSHMEnvOptions(t *testing.T) {
	for _, c := range []struct {
		env []string
		n   int // hybrid options
		bad string
	}{
		{nil, 0, ""},
		{[]string{EnvHeartbeatTimeout, "3s"}, 1, ""},
		{[]string{EnvHeartbeatInterval, "500ms"}, 1, ""},
		{[]string{EnvHeartbeatTimeout, "2s", EnvHeartbeatInterval, "1s"}, 1, ""},
		{[]string{EnvHeartbeatTimeout, "1s", EnvHeartbeatInterval, "600ms"}, 0, EnvHeartbeatTimeout},
		{[]string{EnvMaxFrame, "1M"}, 1, ""},
		{[]string{EnvMaxFrame, "x"}, 0, EnvMaxFrame},
		{[]string{EnvInitTimeout, "1m", EnvSocketBuffer, "1M"}, 0, ""}, // TCP only
	} {
		opts, err := shmEnvOptions(lookupOf(c.env...))
		if c.bad != "" {
			require.ErrorIs(t, err, ErrEnv, "%v", c.env)
			assert.Contains(t, err.Error(), c.bad, "%v", c.env)
			continue
		}
		require.NoError(t, err, "%v", c.env)
		require.Len(t, opts, c.n, "%v", c.env)
		// A 2-rank job on one host takes them (the shm transport validates).
		ts := hybridPair(t, opts...)
		assert.Equal(t, hybrid.ViaSHM, ts[0].Via(1), "%v", c.env)
	}
}

// hybridPair starts a 2-rank hybrid job on loopback in this process.
func hybridPair(t *testing.T, opts ...hybrid.Option) []*hybrid.Transport {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	master := ln.Addr().String()
	require.NoError(t, ln.Close())
	ts := make([]*hybrid.Transport, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			ts[r], errs[r] = hybrid.Rendezvous(bg, r, 2, master, append([]hybrid.Option{hybrid.WithInsecure()}, opts...)...)
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, tr := range ts {
			if tr != nil {
				tr.Close()
			}
		}
	})
	for r := range 2 {
		require.NoError(t, errs[r], "rank %d", r)
	}
	return ts
}

// TestDialFromEnvTransport: GDIST_TRANSPORT picks the route between two
// ranks of this host; a bad value is refused naming it.
func TestDialFromEnvTransport(t *testing.T) {
	for _, c := range []struct{ mode, via string }{
		{"", hybrid.ViaSHM},
		{"auto", hybrid.ViaSHM},
		{"shm", hybrid.ViaSHM},
		{"tcp", hybrid.ViaTCP},
	} {
		clearEnv(t)
		t.Setenv(EnvInsecure, "1")
		t.Setenv(EnvTransport, c.mode)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		port := ln.Addr().(*net.TCPAddr).Port
		require.NoError(t, ln.Close())
		ts := make([]*hybrid.Transport, 2)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for r := range 2 {
			wg.Go(func() {
				var p atomic.Pointer[metrics.Metrics]
				cfg := defaultConfig()
				ts[r], errs[r] = dialFromEnv(bg, launchenv.Job{Rank: r, WorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: port}, &cfg, &p)
			})
		}
		wg.Wait()
		for r := range 2 {
			require.NoError(t, errs[r], "%q rank %d", c.mode, r)
		}
		assert.Equal(t, c.via, ts[0].Via(1), "%q", c.mode)
		assert.Equal(t, c.via, ts[1].Via(0), "%q", c.mode)
		assert.Equal(t, []int{0, 0}, ts[1].Hosts())
		for _, tr := range ts {
			require.NoError(t, tr.Close())
		}
	}

	clearEnv(t)
	t.Setenv(EnvRank, "0")
	t.Setenv(EnvWorldSize, "1")
	t.Setenv(EnvMasterAddr, "127.0.0.1")
	t.Setenv(EnvMasterPort, "1")
	t.Setenv(EnvInsecure, "1")
	t.Setenv(EnvTransport, "infiniband")
	_, err := InitFromEnv(bg)
	require.ErrorIs(t, err, ErrEnv)
	assert.Contains(t, err.Error(), EnvTransport)
}

// TestInitFromEnvSHMOptions: WithSHMOptions reaches the shared-memory
// transport (an invalid one fails the setup in mode shm) and a nil one is
// refused.
func TestInitFromEnvSHMOptions(t *testing.T) {
	_, err := InitFromEnv(bg, WithSHMOptions(nil))
	require.ErrorIs(t, err, ErrInvalidArgument)

	clearEnv(t)
	t.Setenv(EnvInsecure, "1")
	t.Setenv(EnvTransport, "shm")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			var p atomic.Pointer[metrics.Metrics]
			cfg, err := newConfig([]Option{WithSHMOptions(shm.WithRingSize(5))})
			if err != nil {
				errs[r] = err
				return
			}
			tr, err := dialFromEnv(bg, launchenv.Job{Rank: r, WorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: port}, &cfg, &p)
			if err == nil {
				tr.Close()
			}
			errs[r] = err
		})
	}
	wg.Wait()
	for r := range 2 {
		require.ErrorIs(t, errs[r], hybrid.ErrSHMSetup, "rank %d", r)
	}
	require.ErrorIs(t, errs[0], shm.ErrInvalidArgument)
}

// Multi-process hybrid jobs: the test binary re-executes itself with
// hybridChildEnv set; init sends such a process to hybridChild before any
// test runs (TestMain belongs to the package's other tests).
const (
	hybridChildEnv = "GDIST_DIST_TEST_HYBRID"      // the expected mode: tcp, shm or auto
	hybridHostsEnv = "GDIST_DIST_TEST_HOSTS"       // every rank's GDIST_HOST_ID, comma-separated
	hybridKillEnv  = "GDIST_DIST_TEST_HYBRID_KILL" // "1": after the checks, loop on all-reduces (childKill)
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
	if testing.Short() || raceEnabled {
		env = append(env, lightEnv+"=1")
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
				Env: append([]string{"GOMAXPROCS=1", EnvTransport + "=" + c.mode, hybridHostsEnv + "=" + c.hosts}, env...)})
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
	rank, err := strconv.Atoi(os.Getenv(EnvRank))
	if err != nil || rank < 0 || rank >= len(hosts) {
		fmt.Fprintln(os.Stderr, "bad rank", os.Getenv(EnvRank))
		return 2
	}
	os.Setenv(EnvHostID, hosts[rank])
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g, err := InitFromEnv(ctx)
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
	}
	if os.Getenv(hybridKillEnv) == "1" {
		return childKill(g)
	}
	if code := childCollectives(g); code != 0 {
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
	killMidStream(t, procs, victim, "peer_error rank=2 ")
}
