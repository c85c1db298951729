package fed_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/fed"
	"github.com/gdist/gdist/dist/fed/secagg"
)

// secure are the leader options of these tests: secure aggregation on 64
// bits with room for the test's updates, so that its fixed point is far
// finer than float32.
func secure(threshold func(int) int) []fed.Option {
	return []fed.Option{fed.WithSecureAggregation(fed.SecureAggregation{Clip: 64, MaxSamples: 1000, Bits: 64,
		Threshold: threshold, StageTimeout: 5 * time.Second})}
}

// TestSecureRounds: with secure aggregation the rounds average exactly what
// plain FedAvg averages (to float32 rounding), weighted by the sample
// counts, which the leader only learns in total.
func TestSecureRounds(t *testing.T) {
	init := []float32{1, -2, 3.5, 0, 0.125}
	f := start(t, 5, init, secure(nil), nil)
	for r := 1; r < 5; r++ {
		serve(f.clients[r], trainer{weights: weightsOf, samples: func(r int) int { return 10 * r }})
	}
	want := init
	for k := 1; k <= 3; k++ {
		res, err := f.leader.Round(context.Background())
		require.NoError(t, err)
		assert.Equal(t, []int{1, 2, 3, 4}, res.Reported)
		assert.Equal(t, int64(100), res.Samples)
		var ws [][]float32
		for r := 1; r < 5; r++ {
			ws = append(ws, weightsOf(r, k, want))
		}
		want = fedavg(want, ws, []int{10, 20, 30, 40})
		assert.InDeltaSlice(t, want, f.leader.Model(), 1e-5, "round %d", k)
		want = f.leader.Model()
	}
}

// TestSecureDropouts: a client that drops after its masked update arrived
// is still in the sum (its self mask is rebuilt from the others' shares);
// one that drops before masking is left out; either way the round ends
// with the exact weighted average of the updates in the sum.
func TestSecureDropouts(t *testing.T) {
	f := start(t, 5, []float32{1, 2, 3}, secure(nil), nil)
	// Rank 3 drops in round 1 once its masked update has arrived: when the
	// leader asks it to help unmask.
	f.clients[3].DropAt(1, secagg.StageUnmask)
	masked := trainer{weights: weightsOf, samples: func(r int) int { return r }}
	for r := 1; r < 5; r++ {
		tr := masked
		switch r {
		case 4: // drops before masking in round 2
			tr.before = func(rank, round int) {
				if round == 2 {
					f.clients[4].KillLink()
				}
			}
		}
		serve(f.clients[r], tr)
	}
	ctx := context.Background()
	m0 := f.leader.Model()
	res, err := f.leader.Round(ctx)
	require.NoError(t, err)
	assert.Equal(t, []int{1, 2, 3, 4}, res.Reported, "rank 3's update is in the sum")
	m1 := fedavg(m0, [][]float32{weightsOf(1, 1, m0), weightsOf(2, 1, m0), weightsOf(3, 1, m0), weightsOf(4, 1, m0)}, []int{1, 2, 3, 4})
	assert.InDeltaSlice(t, m1, f.leader.Model(), 1e-5)

	m1 = f.leader.Model()
	res, err = f.leader.Round(ctx)
	require.NoError(t, err)
	assert.NotContains(t, res.Reported, 4, "rank 4 dropped before masking")
	var ws [][]float32
	var ns []int
	for _, r := range res.Reported {
		ws = append(ws, weightsOf(r, 2, m1))
		ns = append(ns, r)
	}
	assert.InDeltaSlice(t, fedavg(m1, ws, ns), f.leader.Model(), 1e-5)
}

// TestSecureTooFew: a round left with fewer clients than the threshold
// fails with an error matching secagg.ErrTooFewClients and leaves the
// model as it was; the next round works.
func TestSecureTooFew(t *testing.T) {
	all := func(n int) int { return n } // every sampled client is needed
	f := start(t, 4, []float32{5, 5}, secure(all), nil)
	var once sync.Once
	for r := 1; r < 4; r++ {
		tr := trainer{weights: weightsOf, samples: func(int) int { return 1 }}
		if r == 2 {
			tr.before = func(rank, round int) {
				if round == 1 {
					once.Do(f.clients[2].KillLink)
				}
			}
		}
		serve(f.clients[r], tr)
	}
	res, err := f.leader.Round(context.Background())
	require.ErrorIs(t, err, secagg.ErrTooFewClients)
	assert.Empty(t, res.Reported)
	assert.Equal(t, []float32{5, 5}, f.leader.Model())
	require.Eventually(t, func() bool {
		res, err = f.leader.Round(context.Background())
		return err == nil && len(res.Reported) == 3
	}, 20*time.Second, 10*time.Millisecond, "rank 2 rejoins and the rounds succeed again: %v", err)
}

// TestSecureNeedsTwo: a secure round of one sampled client fails: secure
// aggregation cannot hide a lone update.
func TestSecureNeedsTwo(t *testing.T) {
	f := start(t, 2, []float32{1}, secure(nil), nil)
	serve(f.clients[1], trainer{weights: weightsOf, samples: func(int) int { return 1 }})
	_, err := f.leader.Round(context.Background())
	require.Error(t, err)
	assert.True(t, errors.Is(err, secagg.ErrInvalidArgument), "%v", err)
	assert.Equal(t, []float32{1}, f.leader.Model())
}
