//go:build linux

package gdist

import (
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/metrics"
	"github.com/gdist/gdist/dist/transport/hybrid"
	"github.com/gdist/gdist/dist/transport/shm"
	"github.com/gdist/gdist/internal/launchenv"
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
			require.ErrorIs(t, err, dist.ErrEnv, "%v", c.env)
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
			require.ErrorIs(t, err, dist.ErrEnv, "%v", c.env)
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
				var cfg config
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
	require.ErrorIs(t, err, dist.ErrEnv)
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
