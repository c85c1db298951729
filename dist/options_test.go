package dist

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport/transporttest"
)

// TestOptionsRefused: every invalid option value makes New and CheckOptions
// (which gdist.InitFromEnv calls before it connects) fail with an error
// matching ErrInvalidArgument that names the option, and the first refusal
// wins.
func TestOptionsRefused(t *testing.T) {
	for _, tc := range []struct {
		opt  Option
		name string
	}{
		{WithTimeout(0), "WithTimeout"},
		{WithTimeout(-time.Second), "WithTimeout"},
		{WithSmallThreshold(-1), "WithSmallThreshold"},
		{WithLogger(nil), "WithLogger"},
		{withSegment(0), "withSegment"},
		{withPairSegment(12), "withPairSegment"},
		{withPairSegment(-8), "withPairSegment"},
		{withSegment(12), "withSegment"},
		{WithLocalRank(-1), "WithLocalRank"},
		{WithRestartCount(-1), "WithRestartCount"},
		{nil, "option 0 is nil"},
	} {
		ts := transporttest.NewLocal(t, 1)
		_, err := New(ts[0], tc.opt)
		require.ErrorIs(t, err, ErrInvalidArgument)
		assert.Contains(t, err.Error(), tc.name)
		require.NoError(t, ts[0].Close(), "on error the caller keeps the transport")

		err = CheckOptions(tc.opt)
		require.ErrorIs(t, err, ErrInvalidArgument)
		assert.Contains(t, err.Error(), tc.name)
	}
	ts := transporttest.NewLocal(t, 1)
	defer ts[0].Close()
	_, err := New(ts[0], WithTimeout(time.Second), WithSmallThreshold(-2), WithTimeout(0))
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "WithSmallThreshold(-2)")
}

// TestOptionsDefaults: options not given keep their documented defaults,
// and given ones are applied.
func TestOptionsDefaults(t *testing.T) {
	cfg, err := newConfig(nil)
	require.NoError(t, err)
	assert.Equal(t, DefaultTimeout, cfg.timeout)
	assert.Equal(t, DefaultSmallThreshold, cfg.small)
	assert.Equal(t, 4<<20, cfg.segment)
	assert.NotNil(t, cfg.logger)
	assert.False(t, cfg.loggerSet)

	l := slog.New(slog.DiscardHandler)
	cfg, err = newConfig([]Option{WithTimeout(time.Second), WithSmallThreshold(0), withSegment(64), WithLogger(l)})
	require.NoError(t, err)
	assert.Equal(t, time.Second, cfg.timeout)
	assert.Equal(t, 0, cfg.small)
	assert.Equal(t, 64, cfg.segment)
	assert.Same(t, l, cfg.logger)
	assert.True(t, cfg.loggerSet)
}

// TestWithLocalRank: LocalRank is Rank unless WithLocalRank says otherwise.
func TestWithLocalRank(t *testing.T) {
	ts := transporttest.NewLocal(t, 2)
	g0, err := New(ts[0])
	require.NoError(t, err)
	defer g0.Close()
	g1, err := New(ts[1], WithLocalRank(0), WithRestartCount(2))
	require.NoError(t, err)
	defer g1.Close()
	assert.Equal(t, 0, g0.LocalRank())
	assert.Equal(t, 0, g1.LocalRank())
	assert.Equal(t, 1, g1.Rank())
	assert.Equal(t, 2, g1.d.cfg.restarts)
}
