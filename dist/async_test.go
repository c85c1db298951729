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
		w := g.AllReduceAsync(d, Sum)
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
		want := refAllReduce(Sum, F32, n, length)
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
			wa = g.AllReduceAsync(a, Sum)
			wb = g.AllReduceF64Async(b, Max)
		} else {
			if err := g.AllReduce(bg, a, Sum); err != nil {
				return err
			}
			wb = g.AllReduceF64Async(b, Max)
		}
		if err := g.AllReduce(bg, d, Sum); err != nil {
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
			works[i] = g.AllReduceAsync(bufs[i], Sum)
		}
		typed := make([]byte, 2)
		codecBF16.store(typed, float64(r))
		wt := g.AllReduceTypedAsync(typed, BF16, Sum)
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
	w := c.gs[0].AllReduceAsync(d0, Sum)
	ctx, cancel := context.WithTimeout(bg, 10*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, w.Wait(ctx), context.DeadlineExceeded)
	// The collective went on: once rank 1 joins it completes.
	require.NoError(t, c.gs[1].AllReduce(bg, []float32{2}, Sum))
	require.NoError(t, w.Wait(bg))
	require.Equal(t, []float32{3}, d0)
}
