package ddp

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/gorgonia"

	"github.com/gdist/gdist/dist"
)

// closeModel is smallModel with every parameter hooked; the machine is
// closed when the test ends.
func closeModel(t *testing.T, pg *dist.ProcessGroup) (*DDP, gorgonia.Nodes, gorgonia.VM) {
	t.Helper()
	d, ps, _, _, vm := smallModel(t, pg, -1)
	t.Cleanup(func() { vm.Close() })
	return d, ps, vm
}

// TestClose: Close waits for the all-reduces a backward pass started,
// leaves the group to its owner, is idempotent, and makes every later call
// fail with ErrClosed (and dist.ErrClosed).
func TestClose(t *testing.T) {
	const lag = 100 * time.Millisecond
	runRanks(t, 2, func(pg *dist.ProcessGroup) error {
		d, ps, vm := closeModel(t, pg)
		if pg.Rank() == 1 {
			// Rank 0 closes while its all-reduces wait for this rank.
			time.Sleep(lag)
			if err := vm.RunAll(); err != nil {
				return err
			}
			if err := d.Solver(sgd()).Step(gorgonia.NodesToValueGrads(ps)); err != nil {
				return err
			}
		} else {
			start := time.Now()
			if err := vm.RunAll(); err != nil { // launches every bucket
				return err
			}
			require.NoError(t, d.Close())
			assert.GreaterOrEqual(t, time.Since(start), lag/2, "Close waited for the peer")
			for bi, b := range d.bkts {
				select {
				case <-b.work.Done():
					require.NoError(t, b.work.Err(), "bucket %d", bi)
				default:
					t.Errorf("bucket %d: all-reduce still in flight after Close", bi)
				}
			}
		}
		// The group is still the caller's and works.
		if err := pg.Barrier(t.Context()); err != nil {
			return err
		}
		if pg.Rank() == 1 {
			require.NoError(t, d.Close())
		}
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() { assert.NoError(t, d.Close(), "idempotent") })
		}
		wg.Wait()

		_, err := d.Hook(ps[0])
		assert.ErrorIs(t, err, ErrClosed)
		assert.ErrorIs(t, err, dist.ErrClosed)
		_, err = d.Hooked()
		assert.ErrorIs(t, err, ErrClosed)
		assert.ErrorIs(t, d.Sync(t.Context()), ErrClosed)
		err = d.Solver(sgd()).Step(gorgonia.NodesToValueGrads(ps))
		assert.ErrorIs(t, err, ErrClosed)
		assert.ErrorIs(t, err, dist.ErrClosed)
		vm.Reset()
		assert.Error(t, vm.RunAll(), "a backward pass through a closed DDP's hooks")
		assert.NoError(t, d.Err(), "Close is not a failure")
		return pg.Barrier(t.Context())
	})
}

// TestCloseUnused: a DDP that never ran closes at once.
func TestCloseUnused(t *testing.T) {
	runRanks(t, 1, func(pg *dist.ProcessGroup) error {
		d, _, _ := closeModel(t, pg)
		require.NoError(t, d.Close())
		assert.ErrorIs(t, d.Sync(t.Context()), ErrClosed)
		return nil
	})
}
