package transporttest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/transporttest"
)

// TestFaultyConformance: delays alone change no guarantee, so a delayed
// transport still passes the suite.
func TestFaultyConformance(t *testing.T) {
	cfg := transporttest.FaultConfig{Seed: 42, DelayProb: 0.3, MaxDelay: 200 * time.Microsecond}
	transporttest.Run(t, func(t *testing.T, n int) []transport.Transport {
		return transporttest.WrapAll(transporttest.Locals(t, n), cfg)
	}, transporttest.WithLimited(func(t *testing.T, n, limit int) []transport.Transport {
		return transporttest.WrapAll(transporttest.Locals(t, n, transport.WithLocalQueueLimit(limit)), cfg)
	}))
}

// TestFaultyCutAfter: the CutAfter-th operation crashes the rank; its peers
// see it as lost.
func TestFaultyCutAfter(t *testing.T) {
	ctx := context.Background()
	ts := transporttest.WrapAll(transporttest.Locals(t, 2), transporttest.FaultConfig{})
	f := transporttest.NewFaulty(ts[1].(*transporttest.Faulty).Unwrap(), transporttest.FaultConfig{CutAfter: 3})
	require.NoError(t, f.Send(ctx, 0, 1, transport.Header{}, []byte("a")))
	require.NoError(t, f.Send(ctx, 0, 1, transport.Header{}, []byte("b")))
	assert.False(t, f.IsCut())
	require.ErrorIs(t, f.Send(ctx, 0, 1, transport.Header{}, []byte("c")), transport.ErrClosed)
	assert.True(t, f.IsCut())
	_, err := f.Recv(ctx, 0, 1)
	require.ErrorIs(t, err, transport.ErrClosed)

	_, err = ts[0].Recv(ctx, 1, 1)
	var pe *transport.PeerError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, 1, pe.Rank)
	require.ErrorIs(t, err, transport.ErrPeerLost)
	ts[0].Close()
}

// TestFaultyDeterministic: the same seed makes the same decisions.
func TestFaultyDeterministic(t *testing.T) {
	run := func(seed uint64) int {
		ctx := context.Background()
		f := transporttest.NewFaulty(transporttest.Locals(t, 1)[0], transporttest.FaultConfig{Seed: seed, CutProb: 0.05})
		defer f.Close()
		for i := range 1000 {
			if err := f.Send(ctx, 0, 1, transport.Header{}, nil); err != nil {
				return i
			}
			if _, err := f.Recv(ctx, 0, 1); err != nil {
				return i
			}
		}
		return -1
	}
	a, b := run(7), run(7)
	assert.Equal(t, a, b)
	assert.GreaterOrEqual(t, a, 0, "a 5% cut chance over 2000 ops cuts")
}

// TestFaultyDelayHonoursContext: a delayed call still returns when its
// context ends.
func TestFaultyDelayHonoursContext(t *testing.T) {
	f := transporttest.NewFaulty(transporttest.Locals(t, 1)[0], transporttest.FaultConfig{DelayProb: 1, MaxDelay: time.Hour})
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := f.Send(ctx, 0, 1, transport.Header{}, nil)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 5*time.Second)
}
