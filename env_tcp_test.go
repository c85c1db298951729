package gdist

import (
	"context"
	"io"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/metrics"
	"github.com/gdist/gdist/dist/transport/hybrid"
	"github.com/gdist/gdist/dist/transport/tcp"
	"github.com/gdist/gdist/internal/launch"
	"github.com/gdist/gdist/internal/launchenv"
	"github.com/gdist/gdist/internal/portpick"
)

// lookupOf is an environment lookup (os.LookupEnv's shape) over the
// key/value pairs kv.
func lookupOf(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// freePort returns a loopback port nothing listens on.
func freePort(t *testing.T) int {
	t.Helper()
	port, err := portpick.Free("127.0.0.1")
	require.NoError(t, err)
	return port
}

// tcpWorldOne clears the environment, then describes a world of one that
// still meets over TCP (MASTER_ADDR on loopback, a free port, no token),
// plus the key/value pairs kv.
func tcpWorldOne(t *testing.T, kv ...string) {
	t.Helper()
	clearEnv(t, append([]string{EnvRank, "0", EnvWorldSize, "1", EnvMasterAddr, "127.0.0.1",
		EnvMasterPort, strconv.Itoa(freePort(t)), EnvInsecure, "1"}, kv...)...)
}

// dialPair runs dialFromEnv with cfg for ranks 0 and 1 of a job on a free
// loopback port, concurrently, and returns each rank's transport and
// error; rank r's heartbeat round trips go to ms[r] when ms is given. The
// caller closes the transports.
func dialPair(t *testing.T, cfg config, ms ...*metrics.Metrics) ([]*hybrid.Transport, []error) {
	t.Helper()
	port := freePort(t)
	ts := make([]*hybrid.Transport, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			var p atomic.Pointer[metrics.Metrics]
			if len(ms) > r {
				p.Store(ms[r])
			}
			c := cfg
			ts[r], errs[r] = dialFromEnv(bg, launchenv.Job{Rank: r, WorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: port}, &c, &p)
		})
	}
	wg.Wait()
	return ts, errs
}

// envOptions calls parse on the environment env and checks its answer: an
// error matching dist.ErrEnv that names the variable bad, if bad is set
// (ok is false then), else n options, which it returns.
func envOptions[O any](t *testing.T, parse func(func(string) (string, bool)) ([]O, error), env []string, n int, bad string) (opts []O, ok bool) {
	t.Helper()
	opts, err := parse(lookupOf(env...))
	if bad != "" {
		require.ErrorIs(t, err, dist.ErrEnv, "%v", env)
		assert.Contains(t, err.Error(), bad, "%v", env)
		return nil, false
	}
	require.NoError(t, err, "%v", env)
	require.Len(t, opts, n, "%v", env)
	return opts, true
}

func TestTCPEnvOptions(t *testing.T) {
	for _, c := range []struct {
		env  []string
		n    int // options
		bad  string
		tcpE bool // the transport refuses the options
	}{
		{nil, 0, "", false},
		{[]string{EnvHeartbeatTimeout, "10s"}, 1, "", false},
		{[]string{EnvHeartbeatInterval, "500ms"}, 1, "", false},
		{[]string{EnvHeartbeatTimeout, "2s", EnvHeartbeatInterval, "100ms"}, 1, "", false},
		{[]string{EnvHeartbeatTimeout, "1s", EnvHeartbeatInterval, "600ms"}, 0, EnvHeartbeatTimeout, false},
		{[]string{EnvHeartbeatTimeout, "ten"}, 0, EnvHeartbeatTimeout, false},
		{[]string{EnvHeartbeatTimeout, "-1s"}, 0, EnvHeartbeatTimeout, false},
		{[]string{EnvHeartbeatInterval, "0"}, 0, EnvHeartbeatInterval, false},
		{[]string{EnvInitTimeout, "5s"}, 1, "", false},
		{[]string{EnvInitTimeout, "5"}, 0, EnvInitTimeout, false},
		{[]string{EnvMaxFrame, "64M"}, 1, "", false},
		{[]string{EnvMaxFrame, "1048576"}, 1, "", false},
		{[]string{EnvMaxFrame, "2G"}, 1, "", false},
		{[]string{EnvMaxFrame, "2048GiB"}, 1, "", true}, // over the wire limit of 1 TiB
		{[]string{EnvMaxFrame, "lots"}, 0, EnvMaxFrame, false},
		{[]string{EnvMaxFrame, "0"}, 0, EnvMaxFrame, false},
		{[]string{EnvSocketBuffer, "256K"}, 1, "", false},
		{[]string{EnvSocketBuffer, "256KiB"}, 1, "", false},
		{[]string{EnvSocketBuffer, "-5"}, 0, EnvSocketBuffer, false},
		{[]string{EnvHeartbeatTimeout, "3s", EnvInitTimeout, "1m", EnvMaxFrame, "1M", EnvSocketBuffer, "1M"}, 4, "", false},
	} {
		opts, ok := envOptions(t, tcpEnvOptions, c.env, c.n, c.bad)
		if !ok {
			continue
		}
		// The transport accepts (or refuses) them: a world of one on loopback.
		tr, err := tcp.Rendezvous(bg, 0, 1, "127.0.0.1:0", append(opts, tcp.WithInsecure())...)
		if c.tcpE {
			require.ErrorIs(t, err, tcp.ErrInvalidArgument, "%v", c.env)
			continue
		}
		require.NoError(t, err, "%v", c.env)
		require.NoError(t, tr.Close())
	}
}

// TestInitFromEnvTCPOptions: WithTCPOptions reaches the transport, the
// environment's options too, and a short token is refused naming
// GDIST_TOKEN.
func TestInitFromEnvTCPOptions(t *testing.T) {
	tcpWorldOne(t)
	_, err := InitFromEnv(bg, WithTCPOptions(tcp.WithMaxFrame(0)))
	require.ErrorIs(t, err, tcp.ErrInvalidArgument, "the caller's TCP options reach the transport")
	_, err = InitFromEnv(bg, WithTCPOptions(nil))
	require.ErrorIs(t, err, ErrInvalidArgument)

	tcpWorldOne(t, EnvHeartbeatTimeout, "bad")
	_, err = InitFromEnv(bg)
	require.ErrorIs(t, err, dist.ErrEnv)
	assert.Contains(t, err.Error(), EnvHeartbeatTimeout)

	tcpWorldOne(t, EnvHeartbeatTimeout, "3s", EnvMaxFrame, "1M")
	g, err := InitFromEnv(bg, WithTCPOptions(tcp.WithInitTimeout(time.Minute)))
	require.NoError(t, err)
	require.NoError(t, g.Barrier(bg))
	require.NoError(t, g.Close())

	tcpWorldOne(t, EnvInsecure, "")
	t.Setenv(EnvToken, "0123456789abcdef") // 64 bits
	_, err = InitFromEnv(bg)
	require.ErrorIs(t, err, dist.ErrEnv)
	require.ErrorIs(t, err, tcp.ErrInvalidArgument)
	assert.Contains(t, err.Error(), EnvToken)
	assert.Contains(t, err.Error(), "too short")
}

// TestProcessRendezvousRefused: with GDIST_INIT_TIMEOUT=5s, a rank 1 with a
// wrong GDIST_TOKEN or WORLD_SIZE fails at once with the reason, and rank 0
// fails within 6 s naming rank 1 and the reason it refused it. Ranks are OS
// processes joining through InitFromEnv.
func TestProcessRendezvousRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a 5 s init timeout twice")
	}
	for _, c := range []struct {
		name   string
		rank1  []string
		reason string
	}{
		{"token", []string{EnvToken + "=" + strings.Repeat("ab", 32)}, "authentication failed: wrong GDIST_TOKEN?"},
		{"world", []string{EnvWorldSize + "=3"}, "world size 3, this job has 2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var mu sync.Mutex
			stderr := make([][]string, 2)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			start := time.Now()
			run, err := launch.Start(ctx, launch.Job{
				Spec: launch.Spec{NProc: 2},
				Args: []string{"-test.run=^$"},
				Env:  []string{childEnv + "=init-only", EnvInitTimeout + "=5s", "GOMAXPROCS=1"},
				RankEnv: func(r int) []string {
					if r == 1 {
						return c.rank1
					}
					return nil
				},
				KeepGoing: true,
				Output: func(r int) (io.Writer, io.Writer) {
					return io.Discard, launch.LineFunc(func(l string) {
						mu.Lock()
						stderr[r] = append(stderr[r], l)
						mu.Unlock()
						t.Logf("rank %d: %s", r, l)
					})
				},
			})
			require.NoError(t, err)
			procs := run.Procs()
			ended := make([]time.Duration, 2)
			for r, p := range procs {
				select {
				case <-p.Done():
					ended[r] = p.Ended().Sub(start)
				case <-time.After(20 * time.Second):
					t.Fatalf("rank %d still running after 20 s", r)
				}
			}
			_ = run.Wait() // both ranks fail on purpose
			mu.Lock()
			defer mu.Unlock()
			for r, p := range procs {
				assert.NotZero(t, p.ExitCode(), "rank %d exits non-zero", r)
			}
			t.Logf("rank 1 failed after %v, rank 0 after %v", ended[1].Round(time.Millisecond), ended[0].Round(time.Millisecond))
			assert.Less(t, ended[1], 3*time.Second, "rank 1 fails at once (process start included)")
			assert.Less(t, ended[0], 6*time.Second+time.Second, "rank 0 fails within 6 s of the rendezvous (process start included)")
			assert.GreaterOrEqual(t, ended[0], 5*time.Second)
			out0 := strings.Join(stderr[0], "\n")
			assert.Contains(t, out0, "rank 1 never joined")
			assert.Contains(t, out0, c.reason)
			out1 := strings.Join(stderr[1], "\n")
			assert.Contains(t, out1, "refused the connection")
		})
	}
}

// TestHeartbeatRTTMetrics: the transport InitFromEnv builds reports its
// heartbeat round trips to the group's metrics.
func TestHeartbeatRTTMetrics(t *testing.T) {
	clearEnv(t, EnvInsecure, "1")
	t.Setenv(EnvHeartbeatTimeout, "400ms") // a heartbeat every 50 ms
	ms := []*metrics.Metrics{metrics.New(0, 2, nil), metrics.New(1, 2, nil)}
	ts, errs := dialPair(t, config{}, ms...)
	for r := range 2 {
		require.NoError(t, errs[r], "rank %d", r)
		defer ts[r].Close()
	}
	require.Eventually(t, func() bool {
		rec := httptest.NewRecorder()
		ms[0].Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		return regexp.MustCompile(`gdist_heartbeat_rtt_seconds_count\{[^}]*peer="1"[^}]*\} [1-9]`).MatchString(rec.Body.String())
	}, 5*time.Second, 20*time.Millisecond, "rank 0 records round trips to rank 1")
}
