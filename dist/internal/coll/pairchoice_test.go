package coll

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPairClass(t *testing.T) {
	for n, want := range map[int]int{0: 0, 1: 0, 16<<10 - 1: 0, 16 << 10: 0, 32<<10 - 1: 0, 32 << 10: 1,
		1 << 20: 6, 16 << 20: 10, 1 << 40: pairClasses - 1} {
		require.Equal(t, want, pairClass(n), "%d bytes", n)
	}
}

// TestPairChoiceFollowsTheFaster: the first four calls of a class
// alternate; then the faster way is chosen, the other tried every
// probeEvery-th call; a lasting change turns the choice within a few
// calls, a single slow call does not, and classes do not mix.
func TestPairChoiceFollowsTheFaster(t *testing.T) {
	var p pairChoice
	const n = 1 << 20
	cost := [2]time.Duration{100 * time.Microsecond, 300 * time.Microsecond} // plain, streamed
	slow := -1                                                               // a call whose time is 100x
	run := func(calls int) (streamed, plain int, last bool) {
		for range calls {
			c, s := p.pick(n)
			d := cost[b2i(s)]
			if slow == 0 {
				d *= 100
			}
			slow--
			p.record(c, s, d, n)
			if s {
				streamed++
			} else {
				plain++
			}
			last = s
		}
		return streamed, plain, last
	}
	var ways []bool
	for range 4 {
		c, s := p.pick(n)
		ways = append(ways, s)
		p.record(c, s, cost[b2i(s)], n)
	}
	require.Equal(t, []bool{false, true, false, true}, ways)

	streamed, plain, _ := run(4 * probeEvery)
	require.Equal(t, 4, streamed, "only the probes stream")
	require.Equal(t, 4*probeEvery-4, plain)

	slow = 3 // one plain call 100 times slower: the choice stays
	streamed, _, _ = run(2 * probeEvery)
	require.Equal(t, 2, streamed)

	cost = [2]time.Duration{400 * time.Microsecond, 150 * time.Microsecond} // the placement changed
	streamed, plain, last := run(probeEvery)
	require.True(t, last, "streams after the change")
	require.LessOrEqual(t, plain, 8, "turned within a few calls")
	require.GreaterOrEqual(t, streamed, probeEvery-8)

	// Another class starts afresh.
	c, s := p.pick(64 << 10)
	require.NotEqual(t, pairClass(n), c)
	require.False(t, s)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
