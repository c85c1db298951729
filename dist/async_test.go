package dist

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAsyncOverlaps shows the caller computing while its all-reduce is in
// flight: rank 0 starts first, finds the Work not done while it computes
// (the others join 50 ms later), and the result is right.
func TestAsyncOverlaps(t *testing.T) {
	const n, length = 4, 1 << 16
	c := newCluster(t, n)
	requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
		if r != 0 {
			time.Sleep(50 * time.Millisecond)
		}
		d := make([]float32, length)
		for i := range d {
			d[i] = float32(exactInput(Sum, r, i))
		}
		w := g.AllReduceAsync(bg, F32(d), Sum)
		if r == 0 {
			// Caller work while the collective waits for the others.
			x := 0.0
			for i := range 1000 {
				x += float64(i)
			}
			assert.Equal(t, 499500.0, x)
			assert.Nil(t, w.Err(), "not done yet")
			select {
			case <-w.Done():
				t.Error("all-reduce finished before the other ranks joined")
			default:
			}
		}
		if err := w.Wait(bg); err != nil {
			return err
		}
		want := refAllReduce(Sum, Float32, n, length)
		for i := range d {
			if float64(d[i]) != want[i] {
				t.Errorf("rank %d [%d] = %v, want %v", r, i, d[i], want[i])
				break
			}
		}
		return nil
	}))
}

// TestAsyncOrdering mixes async and sync calls differently on each rank; the
// sequence of collectives is the same, so all agree, and a sync call issued
// after async ones runs after them.
func TestAsyncOrdering(t *testing.T) {
	const n = 3
	c := newCluster(t, n)
	requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
		a := []float32{float32(r), 1}
		b := []float64{float64(r * 10), 2}
		d := []float32{float32(r * 100)}
		var wa, wb *Work
		if r == 0 {
			wa = g.AllReduceAsync(bg, F32(a), Sum)
			wb = g.AllReduceAsync(bg, F64(b), Max)
		} else {
			if err := g.AllReduce(bg, F32(a), Sum); err != nil {
				return err
			}
			wb = g.AllReduceAsync(bg, F64(b), Max)
		}
		if err := g.AllReduce(bg, F32(d), Sum); err != nil {
			return err
		}
		// The sync call ran after the async ones, so they are done.
		for _, w := range []*Work{wa, wb} {
			if w == nil {
				continue
			}
			select {
			case <-w.Done():
			default:
				t.Errorf("rank %d: async collective not done after a later sync one", r)
			}
			require.NoError(t, w.Err())
		}
		assert.Equal(t, []float32{3, 3}, a)
		assert.Equal(t, []float64{20, 2}, b)
		assert.Equal(t, []float32{300}, d)
		return nil
	}))
}

// TestAsyncManyInFlight queues many async collectives and a typed one.
func TestAsyncManyInFlight(t *testing.T) {
	const n, k = 4, 50
	c := newCluster(t, n)
	requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
		bufs := make([][]float32, k)
		works := make([]*Work, k)
		for i := range k {
			bufs[i] = []float32{float32(r + i)}
			works[i] = g.AllReduceAsync(bg, F32(bufs[i]), Sum)
		}
		typed := make([]byte, 2)
		codecBF16.store(typed, float64(r))
		wt := g.AllReduceAsync(bg, Typed(typed, BFloat16), Sum)
		for i, w := range works {
			if err := w.Wait(bg); err != nil {
				return err
			}
			assert.Equal(t, float32(6+4*i), bufs[i][0])
		}
		require.NoError(t, wt.Wait(bg))
		assert.Equal(t, 6.0, codecBF16.load(typed))
		return nil
	}))
}

func TestWorkWaitContext(t *testing.T) {
	c := newCluster(t, 2)
	d0 := []float32{1}
	w := c.gs[0].AllReduceAsync(bg, F32(d0), Sum)
	ctx, cancel := context.WithTimeout(bg, 10*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, w.Wait(ctx), context.DeadlineExceeded)
	// The collective went on: once rank 1 joins it completes.
	require.NoError(t, c.gs[1].AllReduce(bg, F32([]float32{2}), Sum))
	require.NoError(t, w.Wait(bg))
	require.Equal(t, []float32{3}, d0)
}

// TestAsyncContext: an async collective's ctx governs it as the sync
// form's does.
func TestAsyncContext(t *testing.T) {
	t.Run("done before", func(t *testing.T) {
		c := newCluster(t, 2)
		ctx, cancel := context.WithCancel(bg)
		cancel()
		w := c.gs[0].AllReduceAsync(ctx, F32(make([]float32, 4)), Sum)
		require.ErrorIs(t, w.Wait(bg), context.Canceled)
		// It took no turn and aborted nothing.
		requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error { return g.Barrier(bg) }))
	})
	t.Run("nil", func(t *testing.T) {
		c := newCluster(t, 1)
		//nolint:staticcheck // a nil context is what is tested
		require.ErrorIs(t, c.gs[0].AllReduceAsync(nil, F32(make([]float32, 4)), Sum).Wait(bg), ErrInvalidArgument)
	})
	t.Run("running", func(t *testing.T) {
		c := newCluster(t, 3)
		ctx, cancel := context.WithTimeout(bg, 30*time.Millisecond)
		defer cancel()
		start := time.Now()
		w := c.gs[0].AllReduceAsync(ctx, F64(make([]float64, 4)), Sum) // the others never join
		require.ErrorIs(t, w.Wait(bg), context.DeadlineExceeded)
		require.Less(t, time.Since(start), 2*time.Second)
		// It aborted the group: the peers' collective fails at once.
		errs := c.run(func(r int, g *ProcessGroup) error {
			if r == 0 {
				return nil
			}
			return g.AllReduce(bg, F64(make([]float64, 4)), Sum)
		})
		requireTimeoutNotice(t, errs)
	})
	t.Run("queued", func(t *testing.T) {
		c := newCluster(t, 2)
		first := c.gs[0].AllReduceAsync(bg, F32(make([]float32, 4)), Sum) // rank 1 never joins
		ctx, cancel := context.WithCancel(bg)
		second := c.gs[0].AllReduceAsync(ctx, Typed(make([]byte, 8), Float16), Sum)
		time.AfterFunc(20*time.Millisecond, cancel)
		// The second gives up its turn while the first still runs, which
		// aborts the group and so fails the first too.
		select {
		case <-second.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("queued async all-reduce not failed by its context")
		}
		require.ErrorIs(t, second.Err(), context.Canceled)
		select {
		case <-first.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("running async all-reduce not failed by the abort")
		}
		// The running collective reports the abort's cause itself, as it
		// does when a sync call gives up its turn.
		require.ErrorIs(t, first.Err(), context.Canceled)
		// The peer learns about it. Its part of the first all-reduce may
		// complete (rank 0 sent its data before it aborted); the next
		// collective fails.
		_ = c.gs[1].AllReduce(bg, F32(make([]float32, 4)), Sum)
		err := c.gs[1].Barrier(bg)
		var pe *PeerError
		require.ErrorAs(t, err, &pe)
		assert.Equal(t, 0, pe.Rank)
		require.ErrorIs(t, err, ErrAborted)
	})
	t.Run("default timeout", func(t *testing.T) {
		c := newCluster(t, 2, WithTimeout(50*time.Millisecond))
		start := time.Now()
		w := c.gs[0].AllReduceAsync(bg, F32(make([]float32, 4)), Sum) // rank 1 never joins
		require.ErrorIs(t, w.Wait(bg), context.DeadlineExceeded)
		require.Less(t, time.Since(start), 2*time.Second)
	})
	t.Run("reused", func(t *testing.T) {
		// One cancellable context across many async and sync calls, and
		// cancelled only after they finished: nothing fails, and the
		// cancellation afterwards aborts nothing.
		c := newCluster(t, 2)
		ctx, cancel := context.WithCancel(bg)
		requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
			ws := make([]*Work, 10)
			for i := range ws {
				ws[i] = g.AllReduceAsync(ctx, F32([]float32{1}), Sum)
			}
			if err := g.Barrier(ctx); err != nil {
				return err
			}
			for _, w := range ws {
				if err := w.Err(); err != nil {
					return err
				}
			}
			return nil
		}))
		cancel()
		requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error { return g.Barrier(bg) }))
	})
}

// TestWorkFinished: a Work records when it finished, before Done is closed.
func TestWorkFinished(t *testing.T) {
	c := newCluster(t, 2)
	start := time.Now()
	var ws [2]*Work
	requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
		if r == 1 {
			time.Sleep(20 * time.Millisecond)
		}
		ws[r] = g.AllReduceAsync(bg, F32(make([]float32, 1<<16)), Sum)
		if r == 0 {
			assert.True(t, ws[r].Finished().IsZero(), "not finished yet")
		}
		return ws[r].Wait(bg)
	}))
	end := time.Now()
	for r, w := range ws {
		at := w.Finished()
		assert.False(t, at.Before(start), "rank %d", r)
		assert.False(t, at.After(end), "rank %d", r)
		assert.GreaterOrEqual(t, at.Sub(start), 20*time.Millisecond, "rank %d: rank 1 joined after 20 ms", r)
	}
	// Failed and refused Works record a time too.
	w := c.gs[0].AllReduceAsync(bg, F32(make([]float32, 1)), ReduceOp(99))
	require.ErrorIs(t, w.Err(), ErrInvalidArgument)
	assert.False(t, w.Finished().IsZero())
}

// TestAsyncAllocs: with context.Background() a steady-state async
// all-reduce allocates only its Work and Done channel, on every rank; the
// sync path stays at zero (TestAllReduceZeroAllocs).
func TestAsyncAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	c := newCluster(t, 2)
	bufs := [][]float32{make([]float32, 4096), make([]float32, 4096)}
	step, stop := lockstep(t, c, func(r int, g *ProcessGroup) error {
		return g.AllReduceAsync(bg, F32(bufs[r]), Sum).Wait(bg)
	})
	defer stop()
	for range 10 {
		step()
	}
	require.LessOrEqual(t, testing.AllocsPerRun(100, step), 4.0) // 2 ranks x (Work + channel)
}

// BenchmarkAllReduceAsync4096 is the steady-state async all-reduce of 4096
// float32s between two in-process ranks: every rank starts it and waits for
// its Work, under context.Background() and under a cancellable context
// (watched per call). Run with -benchmem.
func BenchmarkAllReduceAsync4096(b *testing.B) {
	b.Run("background", func(b *testing.B) { benchAsync(b, bg) })
	b.Run("cancellable", func(b *testing.B) {
		ctx, cancel := context.WithCancel(bg)
		defer cancel()
		benchAsync(b, ctx)
	})
}

func benchAsync(b *testing.B, ctx context.Context) {
	const n, length = 2, 4096
	c := newCluster(b, n)
	bufs := make([][]float32, n)
	for r := range bufs {
		bufs[r] = make([]float32, length)
	}
	step, stop := lockstep(b, c, func(r int, g *ProcessGroup) error {
		return g.AllReduceAsync(ctx, F32(bufs[r]), Sum).Wait(bg)
	})
	defer stop()
	for range 5 {
		step()
	}
	b.SetBytes(4 * length)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		step()
	}
}
