package dist

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFederatedAverageStraggler: rank 3 sleeps through round 1, so rank 0
// averages the three others, returns before rank 3 even calls, and all ranks
// (rank 3 too, late) get that average. In round 2 everyone is on time; rank
// 3's stale round-1 vector is still queued at rank 0 and must be dropped,
// not averaged into round 2.
func TestFederatedAverageStraggler(t *testing.T) {
	const n = 4
	const sleep = 400 * time.Millisecond
	c := newCluster(t, n)
	vec := func(round, r int) []float32 {
		return []float32{float32(round*100 + r), float32(-r), float32(round)}
	}
	counts := make([]int, n)
	round1 := make([][]float32, n)
	var leaderDone, stragglerCalled time.Time
	requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
		d := vec(1, r)
		if r == 3 {
			time.Sleep(sleep)
			stragglerCalled = time.Now()
		}
		cnt, err := g.FederatedAverage(bg, d, time.Now().Add(100*time.Millisecond))
		if err != nil {
			return err
		}
		if r == 0 {
			leaderDone = time.Now()
		}
		counts[r], round1[r] = cnt, d
		return nil
	}))
	assert.Equal(t, []int{3, 0, 0, 0}, counts)
	assert.True(t, leaderDone.Before(stragglerCalled), "rank 0 returned before the straggler arrived")
	want1 := []float32{(100 + 101 + 102) / 3.0, -1, 1}
	for r := range n {
		assert.Equal(t, want1, round1[r], "rank %d round 1", r)
	}

	round2 := make([][]float32, n)
	requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
		d := vec(2, r)
		cnt, err := g.FederatedAverage(bg, d, time.Now().Add(5*time.Second))
		counts[r], round2[r] = cnt, d
		return err
	}))
	assert.Equal(t, []int{4, 0, 0, 0}, counts)
	want2 := []float32{(200 + 201 + 202 + 203) / 4.0, -1.5, 2}
	for r := range n {
		assert.Equal(t, want2, round2[r], "rank %d round 2 (not contaminated by round 1)", r)
	}
}

func TestFederatedAverageDeadlinePassed(t *testing.T) {
	c := newCluster(t, 3)
	// Rank 0 alone, with a deadline already past: it averages only itself
	// and does not wait.
	d := []float32{6, 9}
	cnt, err := c.gs[0].FederatedAverage(bg, d, time.Now().Add(-time.Second))
	require.NoError(t, err)
	require.Equal(t, 1, cnt)
	require.Equal(t, []float32{6, 9}, d)
	// The others' late calls still get the result of that round; the round
	// after that is clean.
	requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
		if r == 0 {
			return nil
		}
		x := []float32{1, 1}
		_, err := g.FederatedAverage(bg, x, time.Now())
		assert.Equal(t, []float32{6, 9}, x)
		return err
	}))
	requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
		x := []float32{float32(r), 3}
		cnt, err := g.FederatedAverage(bg, x, time.Now().Add(5*time.Second))
		assert.Equal(t, []float32{1, 3}, x)
		if r == 0 {
			assert.Equal(t, 3, cnt)
		}
		return err
	}))
}

func TestFederatedAverageWorldOne(t *testing.T) {
	c := newCluster(t, 1)
	d := []float32{1, 2}
	cnt, err := c.gs[0].FederatedAverage(bg, d, time.Now())
	require.NoError(t, err)
	require.Equal(t, 1, cnt)
	require.Equal(t, []float32{1, 2}, d)
}

func TestFederatedAverageLengthMismatch(t *testing.T) {
	c := newCluster(t, 2)
	errs := c.run(func(r int, g *ProcessGroup) error {
		_, err := g.FederatedAverage(bg, make([]float32, 2+r), time.Now().Add(5*time.Second))
		return err
	})
	for r, err := range errs {
		var lm *LengthMismatchError
		require.ErrorAs(t, err, &lm, "rank %d: %v", r, err)
	}
}
