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

// TestP2PZeroAllocs: a steady-state Send/RecvInto pair under
// context.Background() allocates nothing on the in-process transport (the
// group's failure context serves as the transport's).
func TestP2PZeroAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	c := newCluster(t, 2)
	src, dst := make([]byte, 4096), make([]byte, 4096)
	step, stop := lockstep(t, c, func(r int, g *ProcessGroup) error {
		if r == 0 {
			return g.Send(bg, 1, 7, src)
		}
		n, err := g.RecvInto(bg, 0, 7, dst)
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
}

// TestSubgroupZeroAllocs: steady-state collectives on a subgroup allocate
// nothing either: all-reduce (small and ring), all-gather, reduce-scatter,
// even all-to-all and broadcast, on the pairs of a 4-rank job.
func TestSubgroupZeroAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	c := newCluster(t, 4)
	pairs := make([]*ProcessGroup, 4)
	requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
		p, err := g.Split(bg, r%2, r)
		pairs[r] = p
		return err
	}))
	small, large := make([][]float32, 4), make([][]float32, 4)
	for r := range small {
		small[r], large[r] = make([]float32, 4096), make([]float32, 1<<18)
	}
	step, stop := lockstep(t, c, func(r int, g *ProcessGroup) error {
		p := pairs[r]
		s, l := F32(small[r]), F32(large[r])
		if err := p.AllReduce(bg, s, Sum); err != nil {
			return err
		}
		if err := p.AllReduce(bg, l, Sum); err != nil {
			return err
		}
		if err := p.AllGather(bg, l, l.Slice(p.Rank()*len(large[r])/2, (p.Rank()+1)*len(large[r])/2)); err != nil {
			return err
		}
		if err := p.ReduceScatter(bg, s.Slice(0, 2048), l.Slice(0, 4096), Sum); err != nil {
			return err
		}
		if err := p.AllToAll(bg, s, l.Slice(0, 4096)); err != nil {
			return err
		}
		return p.Broadcast(bg, s, 1)
	})
	defer stop()
	for range 10 {
		step()
	}
	require.Zero(t, testing.AllocsPerRun(50, step))
}
