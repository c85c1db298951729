package pipeline

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAcquireReusesLastSlot: a chunk hands out the slot released last,
// unless a send of its values is still in flight; then the one released
// first.
func TestAcquireReusesLastSlot(t *testing.T) {
	mk := func() *slot { return &slot{mb: -1, sent: make(chan struct{}, 4)} }
	a, b, c := mk(), mk(), mk()
	ch := &chunk{train: []*slot{a, b, c}, free: []*slot{a, b, c}}
	for mb, want := range []*slot{c, b} {
		s, err := ch.acquire(mb)
		require.NoError(t, err)
		require.Same(t, want, s, "micro-batch %d", mb)
	}
	ch.release(b)
	s, err := ch.acquire(2)
	require.NoError(t, err)
	require.Same(t, b, s, "the slot released last")
	// b's send is in flight: a, released before it, comes first.
	b.sending = 1
	ch.release(b)
	s, err = ch.acquire(3)
	require.NoError(t, err)
	require.Same(t, a, s, "the slot released first, as the last one's send is in flight")
	require.Equal(t, []*slot{b}, ch.free)
}
