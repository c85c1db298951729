//go:build linux

package gdist

import (
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/transport/hybrid"
	"github.com/gdist/gdist/dist/transport/shm"
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
		envOptions(t, hybridEnvOptions, c.env, c.n, c.bad)
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
		opts, ok := envOptions(t, shmEnvOptions, c.env, c.n, c.bad)
		if !ok {
			continue
		}
		// A 2-rank job on one host takes them (the shm transport validates).
		ts := hybridPair(t, opts...)
		assert.Equal(t, hybrid.ViaSHM, ts[0].Via(1), "%v", c.env)
	}
}

// hybridPair starts a 2-rank hybrid job on loopback in this process.
func hybridPair(t *testing.T, opts ...hybrid.Option) []*hybrid.Transport {
	t.Helper()
	master := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))
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
		clearEnv(t, EnvInsecure, "1", EnvTransport, c.mode)
		ts, errs := dialPair(t, config{})
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

	clearEnv(t, EnvRank, "0", EnvWorldSize, "1", EnvMasterAddr, "127.0.0.1", EnvMasterPort, "1", EnvInsecure, "1", EnvTransport, "infiniband")
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

	clearEnv(t, EnvInsecure, "1", EnvTransport, "shm")
	cfg, err := newConfig([]Option{WithSHMOptions(shm.WithRingSize(5))})
	require.NoError(t, err)
	ts, errs := dialPair(t, cfg)
	for _, tr := range ts {
		if tr != nil {
			tr.Close()
		}
	}
	for r := range 2 {
		require.ErrorIs(t, errs[r], hybrid.ErrSHMSetup, "rank %d", r)
	}
	require.ErrorIs(t, errs[0], shm.ErrInvalidArgument)
}
