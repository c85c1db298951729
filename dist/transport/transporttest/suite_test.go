package transporttest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
)

// TestSuiteOptions: Run's options are applied in order, and a nil one, a
// nil LimitedMaker or a nil Maker is refused with ErrInvalidArgument.
func TestSuiteOptions(t *testing.T) {
	mk := func(t *testing.T, n int) []transport.Transport { return nil }
	lim := func(t *testing.T, n, limit int) []transport.Transport { return nil }
	s, err := newSuite(mk, []Option{WithLimited(lim), WithoutKill()})
	require.NoError(t, err)
	assert.NotNil(t, s.limited)
	assert.True(t, s.noKill)

	for name, c := range map[string]struct {
		mk   Maker
		opts []Option
	}{
		"WithLimited(nil)": {mk, []Option{WithLimited(nil)}},
		"option 1 is nil":  {mk, []Option{WithoutKill(), nil}},
		"nil Maker":        {nil, nil},
	} {
		_, err := newSuite(c.mk, c.opts)
		require.ErrorIs(t, err, transport.ErrInvalidArgument, name)
		assert.Contains(t, err.Error(), name)
	}
}
