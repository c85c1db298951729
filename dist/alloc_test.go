package dist

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// lockstep runs op on every rank of c once per call of the returned
// function: rank 0 on the caller's goroutine, the others on goroutines
// driven through channels, so that driving them allocates nothing.
func lockstep(tb testing.TB, c *cluster, op func(r int, g *ProcessGroup) error) (step func(), stop func()) {
	n := len(c.gs)
	start := make([]chan struct{}, n)
	done := make(chan error, n)
	for r := 1; r < n; r++ {
		start[r] = make(chan struct{})
		go func() {
			for range start[r] {
				done <- op(r, c.gs[r])
			}
		}()
	}
	step = func() {
		for r := 1; r < n; r++ {
			start[r] <- struct{}{}
		}
		if err := op(0, c.gs[0]); err != nil {
			tb.Fatal(err)
		}
		for r := 1; r < n; r++ {
			if err := <-done; err != nil {
				tb.Fatal(err)
			}
		}
	}
	stop = func() {
		for r := 1; r < n; r++ {
			close(start[r])
		}
	}
	return step, stop
}

// TestAllReduceZeroAllocs: a steady-state AllReduce of 4096 float32s (and a
// large one on the ring path) allocates nothing on the in-process transport.
func TestAllReduceZeroAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, tc := range []struct {
		n, length int
	}{{2, 4096}, {4, 4096}, {3, 1 << 18}} {
		t.Run(fmt.Sprintf("n=%d/len=%d", tc.n, tc.length), func(t *testing.T) {
			c := newCluster(t, tc.n)
			bufs := make([][]float32, tc.n)
			for r := range bufs {
				bufs[r] = make([]float32, tc.length)
			}
			// A cancellable context is watched once, not per call.
			ctx, cancel := context.WithCancel(bg)
			defer cancel()
			step, stop := lockstep(t, c, func(r int, g *ProcessGroup) error {
				return g.AllReduce(ctx, F32(bufs[r]), Sum)
			})
			defer stop()
			for range 10 {
				step()
			}
			require.Zero(t, testing.AllocsPerRun(100, step))
		})
	}
}

// TestP2PZeroAllocs: a steady-state Send/RecvInto pair allocates nothing
// on the in-process transport, under context.Background() (the group's
// failure context serves as the transport's) and under a cancellable
// context (its join with the failure context is made once and reused).
func TestP2PZeroAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	cctx, cancel := context.WithCancel(bg)
	defer cancel()
	for name, ctx := range map[string]context.Context{"background": bg, "cancellable": cctx} {
		t.Run(name, func(t *testing.T) {
			c := newCluster(t, 2)
			src, dst := make([]byte, 4096), make([]byte, 4096)
			step, stop := lockstep(t, c, func(r int, g *ProcessGroup) error {
				if r == 0 {
					return g.Send(ctx, 1, 7, src)
				}
				n, err := g.RecvInto(ctx, 0, 7, dst)
				if err == nil && n != len(src) {
					err = fmt.Errorf("received %d bytes, want %d", n, len(src))
				}
				return err
			})
			defer stop()
			for range 10 {
				step()
			}
			require.Zero(t, testing.AllocsPerRun(100, step))
		})
	}
}
