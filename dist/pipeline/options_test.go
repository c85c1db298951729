package pipeline

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/transport/transporttest"
)

// TestNewRefusesOptions: New fails on the first invalid option with an
// error matching ErrInvalidArgument that names the option, before any
// graph is built or message sent.
func TestNewRefusesOptions(t *testing.T) {
	ts := transporttest.NewLocal(t, 1)
	pg, err := dist.New(ts[0])
	require.NoError(t, err)
	defer pg.Close()
	build := mlpBuilder(testSizes, 1, 0, 2, tensor.Float64)
	for _, tc := range []struct {
		o    Option
		name string
	}{
		{WithMicroBatches(0), "WithMicroBatches(0)"},
		{WithMicroBatches(1<<16 + 1), "WithMicroBatches(65537)"},
		{WithSchedule(7), "WithSchedule(Schedule(7))"},
		{WithLoss(nil), "WithLoss(nil)"},
		{WithTargetShape(), "WithTargetShape()"},
		{WithTargetShape(2, 0), "WithTargetShape([2 0])"},
		{WithRanks(), "WithRanks()"},
		{WithRanks(0, 0), "WithRanks([0 0])"},
		{WithRanks(-1), "WithRanks([-1])"},
		{WithTagBase(dist.TagReservedBase - 1), "WithTagBase("},
		{WithBuildLock(nil), "WithBuildLock(nil)"},
		{nil, "option 0 is nil"},
	} {
		_, err := New(context.Background(), pg, build, tc.o)
		require.ErrorIs(t, err, ErrInvalidArgument, tc.name)
		assert.Contains(t, err.Error(), tc.name)
	}
	_, err = New(context.Background(), pg, build, WithRecompute(true), WithMicroBatches(-3), WithLoss(nil))
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "WithMicroBatches(-3)", "the first refusal wins")
}
