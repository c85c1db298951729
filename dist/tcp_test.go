package dist

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/tcp"
)

var testToken = []byte("dist-test-token-0123456789")

// newTCPCluster is n ranks in this process connected by the TCP transport
// over loopback.
func newTCPCluster(t testing.TB, n int, opts ...Option) (*cluster, []*tcp.Transport) {
	t.Helper()
	ts := tcpMesh(t, n)
	return tcpCluster(t, ts, opts...), ts
}

// tcpMesh is n TCP transports in this process, connected over loopback,
// with opts.
func tcpMesh(t testing.TB, n int, opts ...tcp.Option) []*tcp.Transport {
	t.Helper()
	lns := make([]net.Listener, n)
	addrs := make([]string, n)
	for r := range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		lns[r], addrs[r] = ln, ln.Addr().String()
	}
	return startRanks(t, n, func(ctx context.Context, r int) (*tcp.Transport, error) {
		return tcp.New(ctx, r, n, lns[r], addrs, append([]tcp.Option{tcp.WithToken(testToken)}, opts...)...)
	})
}

// startRanks starts the transports of n ranks in this process at once,
// rank r's with start, and requires every one to succeed.
func startRanks[T transport.Transport](t testing.TB, n int, start func(ctx context.Context, r int) (T, error)) []T {
	t.Helper()
	ts := make([]T, n)
	errs := make([]error, n)
	ctx, cancel := context.WithTimeout(bg, 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() { ts[r], errs[r] = start(ctx, r) })
	}
	wg.Wait()
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	return ts
}

// tcpCluster is a group over each of ts, closed concurrently when the test
// ends: a closing rank says goodbye and waits (briefly) for its peers to
// acknowledge.
func tcpCluster[T transport.Transport](t testing.TB, ts []T, opts ...Option) *cluster {
	t.Helper()
	c := &cluster{gs: groupsOn(t, ts, opts...)}
	t.Cleanup(func() {
		c.run(func(r int, g *ProcessGroup) error { return g.Close() })
	})
	return c
}

func TestTCPCollectives(t *testing.T) {
	for _, n := range []int{2, 3} {
		for _, cfg := range algoConfigs[:2] {
			t.Run(fmt.Sprintf("n=%d/%s", n, cfg.name), func(t *testing.T) {
				c, _ := newTCPCluster(t, n, cfg.opts...)
				requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
					for _, length := range []int{0, 1, 7, 333} {
						if err := checkRank(t, g, n, r, length); err != nil {
							return err
						}
					}
					return nil
				}))
			})
		}
	}
}

func TestTCPZeroAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, tc := range []struct{ n, length int }{{2, 4096}, {3, 4096}, {2, 1 << 18}} {
		t.Run(fmt.Sprintf("n=%d/len=%d", tc.n, tc.length), func(t *testing.T) {
			c, _ := newTCPCluster(t, tc.n)
			bufs := make([][]float32, tc.n)
			for r := range bufs {
				bufs[r] = make([]float32, tc.length)
			}
			step, stop := lockstep(t, c, func(r int, g *ProcessGroup) error {
				return g.AllReduce(bg, F32(bufs[r]), Sum)
			})
			defer stop()
			for range 20 {
				step()
			}
			allocs := testing.AllocsPerRun(100, step)
			// The TCP transport's heartbeat goroutine may allocate while we
			// measure; allow a stray allocation, not one per collective.
			t.Logf("allocations per all-reduce: %v", allocs)
			assert.Less(t, allocs, 0.5, "allocations per all-reduce")
		})
	}
}

func TestTCPKillMidAllReduce(t *testing.T) {
	const n, victim = 3, 1
	c, ts := newTCPCluster(t, n, withSegment(64<<10))
	var killedAt time.Time
	var once sync.Once
	failedAt := make([]time.Time, n)
	errs := c.run(func(r int, g *ProcessGroup) error {
		d := make([]float32, 1<<18)
		for i := 0; ; i++ {
			if r == victim && i == 3 {
				go once.Do(func() {
					time.Sleep(time.Millisecond)
					killedAt = time.Now()
					ts[victim].Kill()
				})
			}
			if err := g.AllReduce(bg, F32(d), Sum); err != nil {
				failedAt[r] = time.Now()
				return err
			}
		}
	})
	for r, err := range errs {
		if r == victim {
			continue
		}
		var pe *PeerError
		require.ErrorAs(t, err, &pe, "rank %d", r)
		// The TCP transport fails as a whole when it loses a peer and drops
		// its other links, so a survivor may notice a fellow survivor's
		// links drop before the victim's EOF and blame that rank instead.
		t.Logf("rank %d: %v", r, err)
		assert.NotEqual(t, r, pe.Rank)
		require.ErrorIs(t, err, ErrPeerLost)
		assert.Equal(t, "all_reduce", pe.Op)
		assert.Less(t, failedAt[r].Sub(killedAt), 5*time.Second)
	}
}
