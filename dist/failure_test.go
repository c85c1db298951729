package dist

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gdist/gdist/dist/transport/transporttest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestKillMidAllReduce crashes a rank while all ranks loop on large
// all-reduces: every survivor's collective fails with a *PeerError naming
// the dead rank and the collective, within 5 s, and so do later collectives.
func TestKillMidAllReduce(t *testing.T) {
	for _, victim := range []int{0, 2} {
		t.Run(fmt.Sprintf("victim=%d", victim), func(t *testing.T) {
			const n = 4
			c := newCluster(t, n, withSegment(16<<10))
			requireKillNamed(t, c, victim, 1<<18)
			for r := range n {
				if r == victim {
					continue
				}
				// Later collectives fail the same way, naming themselves.
				var pe *PeerError
				err := c.gs[r].Broadcast(bg, F32(make([]float32, 3)), 0)
				require.ErrorAs(t, err, &pe)
				assert.Equal(t, victim, pe.Rank)
				assert.Equal(t, "broadcast", pe.Op)
			}
		})
	}
}

// requireKillNamed kills rank victim of c while every rank loops on
// all-reduces of length float32s and checks that every survivor's
// all-reduce fails within 5 s with a *PeerError naming the victim and the
// collective, the victim lost (or closed: Local.Kill fails the victim's own
// mailbox before the others', so a send racing with it can see it closed).
func requireKillNamed(t *testing.T, c *cluster, victim, length int) {
	t.Helper()
	var killedAt time.Time
	var once sync.Once
	kill := func() {
		once.Do(func() {
			killedAt = time.Now()
			c.ts[victim].Kill()
		})
	}
	failedAt := make([]time.Time, len(c.gs))
	errs := c.run(func(r int, g *ProcessGroup) error {
		d := make([]float32, length)
		for i := 0; ; i++ {
			if r == victim && i == 3 {
				go func() { time.Sleep(time.Millisecond); kill() }()
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
		assert.Equal(t, victim, pe.Rank, "rank %d: %v", r, err)
		assert.Equal(t, "all_reduce", pe.Op, "rank %d", r)
		assert.True(t, errors.Is(err, ErrPeerLost) || errors.Is(err, ErrPeerClosed), "rank %d: %v", r, err)
		assert.Less(t, failedAt[r].Sub(killedAt), 5*time.Second)
	}
}

// TestKillWhileWaiting kills a rank the others are waiting for.
func TestKillWhileWaiting(t *testing.T) {
	const n, victim = 3, 1
	c := newCluster(t, n)
	time.AfterFunc(50*time.Millisecond, c.ts[victim].Kill)
	start := time.Now()
	errs := c.run(func(r int, g *ProcessGroup) error {
		if r == victim {
			return nil
		}
		return g.AllReduce(bg, F32(make([]float32, 10)), Sum)
	})
	for r, err := range errs {
		if r == victim {
			continue
		}
		var pe *PeerError
		require.ErrorAs(t, err, &pe, "rank %d", r)
		assert.Equal(t, victim, pe.Rank)
		assert.Equal(t, "all_reduce", pe.Op)
	}
	assert.Less(t, time.Since(start), 5*time.Second)
}

func TestDesyncLengths(t *testing.T) {
	for _, n := range []int{2, 3, 4, 5} {
		for _, cfg := range algoConfigs {
			t.Run(fmt.Sprintf("n=%d/%s", n, cfg.name), func(t *testing.T) {
				t.Parallel()
				c := newCluster(t, n, cfg.opts...)
				errs := c.run(func(r int, g *ProcessGroup) error {
					length := 12
					if r == 1 {
						length = 10
					}
					return g.AllReduce(bg, F32(make([]float32, length)), Sum)
				})
				for r, err := range errs {
					var de *DesyncError
					require.ErrorAs(t, err, &de, "rank %d", r)
					var lm *LengthMismatchError
					require.ErrorAs(t, err, &lm, "rank %d: %v", r, err)
					assert.Equal(t, "all_reduce", lm.Op)
					assert.ElementsMatch(t, []int{10, 12}, []int{lm.Want, lm.Got}, "rank %d", r)
					assert.Contains(t, err.Error(), "count=10")
					assert.Contains(t, err.Error(), "count=12")
				}
				// The group is aborted: later collectives fail with the desync.
				errs = c.run(func(r int, g *ProcessGroup) error { return g.Barrier(bg) })
				for r, err := range errs {
					require.ErrorIs(t, err, ErrAborted, "rank %d", r)
					var de *DesyncError
					require.ErrorAs(t, err, &de, "rank %d", r)
				}
			})
		}
	}
}

// TestDesyncCollectives makes one rank call something else than the others.
func TestDesyncCollectives(t *testing.T) {
	type variant struct {
		name  string
		other func(g *ProcessGroup) error
	}
	variants := []variant{
		{"broadcast", func(g *ProcessGroup) error { return g.Broadcast(bg, F32(make([]float32, 8)), 0) }},
		{"broadcast_own_root", func(g *ProcessGroup) error { return g.Broadcast(bg, F32(make([]float32, 8)), g.Rank()) }},
		{"f64", func(g *ProcessGroup) error { return g.AllReduce(bg, F64(make([]float64, 8)), Sum) }},
		{"max", func(g *ProcessGroup) error { return g.AllReduce(bg, F32(make([]float32, 8)), Max) }},
		{"barrier", func(g *ProcessGroup) error { return g.Barrier(bg) }},
		{"reduce", func(g *ProcessGroup) error { return g.Reduce(bg, F32(make([]float32, 8)), Sum, 0) }},
		{"all_gather", func(g *ProcessGroup) error {
			return g.AllGather(bg, F32(make([]float32, 8*g.WorldSize())), F32(make([]float32, 8)))
		}},
	}
	for _, n := range []int{2, 3, 4} {
		for odd := range n {
			for _, v := range variants {
				for _, cfg := range algoConfigs[:2] {
					t.Run(fmt.Sprintf("n=%d/odd=%d/%s/%s", n, odd, v.name, cfg.name), func(t *testing.T) {
						t.Parallel()
						c := newCluster(t, n, cfg.opts...)
						errs := c.run(func(r int, g *ProcessGroup) error {
							if r == odd {
								return v.other(g)
							}
							return g.AllReduce(bg, F32(make([]float32, 8)), Sum)
						})
						for r, err := range errs {
							var de *DesyncError
							require.ErrorAs(t, err, &de, "rank %d", r)
							var lm *LengthMismatchError
							require.False(t, errors.As(err, &lm), "rank %d: not a length mismatch: %v", r, err)
						}
					})
				}
			}
		}
	}
}

func TestBadArgumentsDoNotAbort(t *testing.T) {
	c := newCluster(t, 2)
	requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
		ctx := bg
		assert.ErrorIs(t, g.AllReduce(ctx, Typed(make([]byte, 3), Float16), Sum), ErrInvalidArgument)
		assert.ErrorIs(t, g.AllReduce(ctx, Typed(make([]byte, 4), DType(0)), Sum), ErrUnsupportedDType)
		assert.ErrorIs(t, g.AllReduce(ctx, Typed(make([]byte, 4), DType(9)), Sum), ErrUnsupportedDType)
		assert.ErrorIs(t, g.AllReduceAsync(ctx, Typed(make([]byte, 4), DType(9)), Sum).Wait(ctx), ErrUnsupportedDType)
		assert.ErrorIs(t, g.AllReduceAsync(ctx, Typed(make([]byte, 5), Float32), Sum).Wait(ctx), ErrInvalidArgument)
		assert.ErrorIs(t, g.AllReduce(ctx, F32(make([]float32, 4)), ReduceOp(17)), ErrInvalidArgument)
		assert.ErrorIs(t, g.AllReduceAsync(ctx, F32(make([]float32, 4)), ReduceOp(17)).Wait(ctx), ErrInvalidArgument)
		var lm *LengthMismatchError
		assert.ErrorAs(t, g.AllGather(ctx, F32(make([]float32, 5)), F32(make([]float32, 3))), &lm)
		assert.Equal(t, &LengthMismatchError{Op: "all_gather", Want: 6, Got: 5}, lm)
		assert.ErrorAs(t, g.ReduceScatter(ctx, F32(make([]float32, 3)), F32(make([]float32, 7)), Sum), &lm)
		assert.ErrorAs(t, g.AllGather(ctx, F64(make([]float64, 5)), F64(make([]float64, 3))), &lm)
		assert.ErrorAs(t, g.ReduceScatter(ctx, F64(make([]float64, 3)), F64(make([]float64, 7)), Sum), &lm)
		assert.ErrorIs(t, g.Broadcast(ctx, F32(make([]float32, 3)), 2), ErrInvalidRank)
		assert.ErrorIs(t, g.Reduce(ctx, F32(make([]float32, 3)), Sum, -1), ErrInvalidRank)
		assert.ErrorIs(t, g.Send(ctx, 1, TagReservedBase, nil), ErrReservedTag)
		assert.ErrorIs(t, g.Send(ctx, 1, 0xFFFFFFFF, nil), ErrReservedTag)
		_, err := g.Recv(ctx, 1, TagReservedBase+1)
		assert.ErrorIs(t, err, ErrReservedTag)
		assert.ErrorIs(t, g.Send(ctx, 2, 1, F32(nil).Bytes()), ErrInvalidRank)
		// None of that touched the group: a real collective still works.
		d := []float32{float32(r)}
		if err := g.AllReduce(ctx, F32(d), Sum); err != nil {
			return err
		}
		assert.Equal(t, []float32{1}, d)
		return nil
	}))
}

func TestCancelledContext(t *testing.T) {
	t.Run("before", func(t *testing.T) {
		c := newCluster(t, 2)
		ctx, cancel := context.WithCancel(bg)
		cancel()
		err := c.gs[0].AllReduce(ctx, F32(make([]float32, 4)), Sum)
		require.ErrorIs(t, err, context.Canceled)
		// It took no turn and aborted nothing.
		requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error { return g.Barrier(bg) }))
	})
	t.Run("during", func(t *testing.T) {
		c := newCluster(t, 3)
		ctx, cancel := context.WithTimeout(bg, 30*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := c.gs[0].AllReduce(ctx, F32(make([]float32, 4)), Sum) // the others never join
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Less(t, time.Since(start), 2*time.Second)
		// The peers learn about it: their collective fails at once.
		errs := c.run(func(r int, g *ProcessGroup) error {
			if r == 0 {
				return nil
			}
			return g.AllReduce(bg, F32(make([]float32, 4)), Sum)
		})
		requireTimeoutNotice(t, errs)
	})
	t.Run("reused context", func(t *testing.T) {
		c := newCluster(t, 2)
		ctx, cancel := context.WithCancel(bg)
		defer cancel()
		for range 3 { // the context is watched once, across collectives
			requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error { return g.Barrier(ctx) }))
		}
		time.AfterFunc(20*time.Millisecond, cancel)
		start := time.Now()
		err := c.gs[0].AllReduce(ctx, F32(make([]float32, 4)), Sum) // rank 1 never joins
		require.ErrorIs(t, err, context.Canceled)
		require.Less(t, time.Since(start), 2*time.Second)
		// A call with the cancelled context returns at once.
		require.ErrorIs(t, c.gs[0].Barrier(ctx), context.Canceled)
	})
	t.Run("default timeout", func(t *testing.T) {
		c := newCluster(t, 2, WithTimeout(50*time.Millisecond))
		start := time.Now()
		err := c.gs[1].Barrier(bg)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Less(t, time.Since(start), 2*time.Second)
		w := c.gs[1].AllReduceAsync(bg, F32(make([]float32, 2)), Sum)
		require.ErrorIs(t, w.Wait(bg), ErrAborted)
	})
	t.Run("waiting for turn", func(t *testing.T) {
		c := newCluster(t, 2)
		w := c.gs[0].AllReduceAsync(bg, F32(make([]float32, 4)), Sum) // rank 1 never joins
		ctx, cancel := context.WithTimeout(bg, 30*time.Millisecond)
		defer cancel()
		err := c.gs[0].Barrier(ctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		// Giving up a turn aborts the group, which fails the async one too.
		select {
		case <-w.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("async all-reduce still running")
		}
		require.Error(t, w.Err())
	})
}

func TestClose(t *testing.T) {
	c := newCluster(t, 2)
	g := c.gs[0]
	// A blocked collective and queued async ones end with ErrClosed.
	blocked := make(chan error, 1)
	go func() { blocked <- g.AllReduce(bg, F32(make([]float32, 4)), Sum) }()
	time.Sleep(20 * time.Millisecond)
	w := g.AllReduceAsync(bg, F32(make([]float32, 4)), Sum)
	require.NoError(t, g.Close())
	require.NoError(t, g.Close(), "idempotent")
	select {
	case err := <-blocked:
		require.ErrorIs(t, err, ErrClosed)
	case <-time.After(5 * time.Second):
		t.Fatal("collective still blocked after Close")
	}
	require.ErrorIs(t, w.Wait(bg), ErrClosed)

	ctx := bg
	require.ErrorIs(t, g.AllReduce(ctx, F32(make([]float32, 4)), Sum), ErrClosed)
	require.ErrorIs(t, g.AllReduce(ctx, F64(make([]float64, 4)), Sum), ErrClosed)
	require.ErrorIs(t, g.AllReduce(ctx, Typed(make([]byte, 4), Float16), Sum), ErrClosed)
	require.ErrorIs(t, g.AllReduceAsync(ctx, F32(make([]float32, 4)), Sum).Wait(ctx), ErrClosed)
	require.ErrorIs(t, g.AllGather(ctx, F32(make([]float32, 2)), F32(make([]float32, 1))), ErrClosed)
	require.ErrorIs(t, g.ReduceScatter(ctx, F32(make([]float32, 1)), F32(make([]float32, 2)), Sum), ErrClosed)
	require.ErrorIs(t, g.Broadcast(ctx, F32(make([]float32, 1)), 0), ErrClosed)
	require.ErrorIs(t, g.Reduce(ctx, F32(make([]float32, 1)), Sum, 0), ErrClosed)
	require.ErrorIs(t, g.Barrier(ctx), ErrClosed)
	_, err := g.FederatedAverage(ctx, make([]float32, 1), time.Now())
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, g.Send(ctx, 1, 1, nil), ErrClosed)
	_, err = g.Recv(ctx, 1, 1)
	require.ErrorIs(t, err, ErrClosed)
	_, err = g.RecvInto(ctx, 1, 1, make([]byte, 4))
	require.ErrorIs(t, err, ErrClosed)
	require.Equal(t, 0, g.Rank())
	require.Equal(t, 2, g.WorldSize())

	// The peer sees a clean departure.
	err = c.gs[1].Barrier(bg)
	var pe *PeerError
	require.ErrorAs(t, err, &pe)
	require.ErrorIs(t, err, ErrPeerClosed)
}

func TestNewValidates(t *testing.T) {
	c := newCluster(t, 1)
	_, err := New(nil)
	require.ErrorIs(t, err, ErrInvalidArgument)
	for _, o := range []Option{WithTimeout(0), WithSmallThreshold(-1), WithLogger(nil), withSegment(12)} {
		_, err := New(c.ts[0], o)
		require.ErrorIs(t, err, ErrInvalidArgument)
	}
}

// TestCauseReachesPeerBeforeClose: a rank whose collective fails and which
// then closes at once still tells its peers why: Close lets the abort
// message go out before the goodbye, so a peer that reaches the same
// collective reports the abort (naming the rank and its cause), not a bare
// "peer closed".
func TestCauseReachesPeerBeforeClose(t *testing.T) {
	for range 20 {
		ts := transporttest.NewLocal(t, 2)
		g0, err := New(ts[0])
		require.NoError(t, err)
		g1, err := New(ts[1])
		require.NoError(t, err)

		ctx, cancel := context.WithTimeout(bg, 5*time.Millisecond)
		err1 := g1.Barrier(ctx) // rank 0 is not there yet: times out
		cancel()
		require.ErrorIs(t, err1, context.DeadlineExceeded)
		require.NoError(t, g1.Close())

		err0 := g0.Barrier(bg)
		require.ErrorIs(t, err0, ErrAborted, "%v", err0)
		require.NotErrorIs(t, err0, ErrPeerClosed)
		var pe *PeerError
		require.ErrorAs(t, err0, &pe)
		assert.Equal(t, 1, pe.Rank)
		var a *AbortError
		require.ErrorAs(t, err0, &a)
		assert.Equal(t, KindTimeout, a.Kind)
		assert.Equal(t, 1, a.Reporter)
		require.NoError(t, g0.Close())
	}
}

// requireTimeoutNotice checks the errors of ranks 1 and 2 after rank 0's
// collective timed out waiting for them: each names a peer (rank 1 is
// named as the first rank rank 0 waited for, on rank 2; rank 1 names rank
// 0, which gave up), and carries the timeout record.
func requireTimeoutNotice(t *testing.T, errs []error) {
	t.Helper()
	for r, want := range map[int]int{1: 0, 2: 1} {
		var pe *PeerError
		require.ErrorAs(t, errs[r], &pe, "rank %d", r)
		assert.Equal(t, want, pe.Rank, "rank %d: %v", r, errs[r])
		require.ErrorIs(t, errs[r], ErrAborted)
		require.ErrorIs(t, errs[r], ErrTimeout)
		var a *AbortError
		require.ErrorAs(t, errs[r], &a)
		assert.Equal(t, KindTimeout, a.Kind)
		assert.Equal(t, 0, a.Reporter)
		assert.Equal(t, 1, a.Rank)
		assert.Contains(t, a.Msg, "waiting for ranks 1, 2")
	}
}
