package dist

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/transporttest"
)

// newFaultyCluster is an in-process cluster whose transports inject the
// faults of cfg (rank i seeded with cfg.Seed+i).
func newFaultyCluster(t testing.TB, n int, cfg transporttest.FaultConfig, opts ...Option) (*cluster, []transport.Transport) {
	t.Helper()
	locals := transporttest.NewLocal(t, n)
	ts := make([]transport.Transport, n)
	for i, l := range locals {
		ts[i] = l
	}
	ts = transporttest.WrapAll(ts, cfg)
	c := &cluster{gs: groupsOn(t, ts, opts...), ts: locals}
	t.Cleanup(func() {
		for _, g := range c.gs {
			g.Close()
		}
	})
	return c, ts
}

// TestCollectivesUnderDelays checks every collective with random delays
// before sends and receives, which reorders when ranks get to each step.
func TestCollectivesUnderDelays(t *testing.T) {
	for _, n := range []int{3, 4} {
		for _, cfg := range algoConfigs[:2] {
			t.Run(fmt.Sprintf("n=%d/%s", n, cfg.name), func(t *testing.T) {
				t.Parallel()
				c, _ := newFaultyCluster(t, n, transporttest.FaultConfig{Seed: uint64(n), DelayProb: 0.2, MaxDelay: 300 * time.Microsecond}, cfg.opts...)
				requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
					for _, length := range []int{1, n - 1, 33} {
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

// TestRandomCuts crashes one rank's transport at a different point of a
// stream of mixed collectives for each seed: the others must all fail with
// a *PeerError, promptly, and none may hang.
func TestRandomCuts(t *testing.T) {
	seeds := 12
	if testing.Short() {
		seeds = 4
	}
	for seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			const n, victim = 4, 1
			c, ts := newFaultyCluster(t, n, transporttest.FaultConfig{Seed: uint64(seed), DelayProb: 0.1, MaxDelay: 200 * time.Microsecond},
				withSegment(4<<10), WithSmallThreshold(8<<10))
			cutAt := 5 + seed*7
			failed := make([]time.Time, n)
			var cutTime time.Time
			errs := c.run(func(r int, g *ProcessGroup) error {
				small := make([]float32, 64)
				big := make([]float32, 10000)
				for i := 0; ; i++ {
					if r == victim && i == cutAt/5 {
						cutTime = time.Now()
						ts[victim].(*transporttest.Faulty).Cut()
					}
					var err error
					switch i % 5 {
					case 0:
						err = g.AllReduce(bg, F32(small), Sum)
					case 1:
						err = g.AllReduceAsync(bg, F32(big), Max).Wait(bg)
					case 2:
						err = g.Broadcast(bg, F32(big), i%n)
					case 3:
						err = g.AllGather(bg, F32(big[:n*100]), F32(big[:100]))
					default:
						err = g.Barrier(bg)
					}
					if err != nil {
						failed[r] = time.Now()
						return err
					}
				}
			})
			for r, err := range errs {
				if r == victim {
					require.ErrorIs(t, err, ErrClosed)
					continue
				}
				var pe *PeerError
				require.ErrorAs(t, err, &pe, "rank %d", r)
				assert.Equal(t, victim, pe.Rank, "rank %d: %v", r, err)
				assert.Less(t, failed[r].Sub(cutTime), 5*time.Second)
			}
		})
	}
}
