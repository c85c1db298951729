package disttest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/disttest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRunAllReduce(t *testing.T) {
	got, errs := disttest.Results(t, disttest.Cluster(t, 3), func(rank int, pg *dist.ProcessGroup) ([]float64, error) {
		assert.Equal(t, rank, pg.Rank())
		v := []float64{float64(rank + 1)}
		return v, pg.AllReduce(context.Background(), dist.F64(v), dist.Sum)
	})
	require.NoError(t, errors.Join(errs...))
	for r := range 3 {
		assert.Equal(t, []float64{6}, got[r], "rank %d", r)
	}
}

func TestRunFailingRankUnblocksPeers(t *testing.T) {
	boom := errors.New("boom")
	errs := disttest.Run(t, disttest.Cluster(t, 2), func(rank int, pg *dist.ProcessGroup) error {
		if rank == 0 {
			return boom
		}
		return pg.AllReduce(context.Background(), dist.F64([]float64{1}), dist.Sum)
	})
	assert.ErrorIs(t, errs[0], boom)
	assert.Error(t, errs[1])
}

// TestCheck: every rank's error reaches t, naming the rank.
func TestCheck(t *testing.T) {
	rec := &recorder{TB: t}
	disttest.Check(rec, 3, func(pg *dist.ProcessGroup) error {
		if pg.Rank() == 1 {
			return errors.New("boom")
		}
		return nil
	})
	assert.Equal(t, []string{"rank 1: boom"}, rec.errs)
	disttest.Check(t, 2, func(pg *dist.ProcessGroup) error {
		v := []float64{1}
		return pg.AllReduce(context.Background(), dist.F64(v), dist.Sum)
	})
}
