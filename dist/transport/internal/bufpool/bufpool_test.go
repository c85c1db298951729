package bufpool

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestGetPut(t *testing.T) {
	var p Pool
	for _, n := range []int{0, 1, 63, 64, 65, 1000, 1 << 20, 1<<20 + 1} {
		b := p.Get(n)
		require.Len(t, b, n)
		if n > 0 {
			require.GreaterOrEqual(t, cap(b), n)
			require.Zero(t, cap(b)&(cap(b)-1), "capacity is a power of two")
		}
		p.Put(b)
		b2 := p.Get(n)
		require.Len(t, b2, n)
		p.Put(b2)
	}
	p.Put(make([]byte, 100)) // foreign slice: ignored, no panic
}

func TestSteadyStateNoAlloc(t *testing.T) {
	var p Pool
	p.Put(p.Get(4096))
	allocs := testing.AllocsPerRun(100, func() { p.Put(p.Get(4096)) })
	require.Zero(t, allocs)
}

// TestKeepBounded: a burst of small slices put back is not all kept.
func TestKeepBounded(t *testing.T) {
	var p Pool
	bs := make([][]byte, 3*keepMax)
	for i := range bs {
		bs[i] = p.Get(64)
	}
	for _, b := range bs {
		p.Put(b)
	}
	require.Len(t, p.classes[6], keepMax)
}
