package dist

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAllReducePairStreamed: between 2 ranks over shared memory, the
// all-reduce sends its segments plainly and streamed as its measurements
// choose (both in the first calls of a size), every result exact, and
// neither way allocates once warm.
func TestAllReducePairStreamed(t *testing.T) {
	_, gs := shmPair(t)
	c := &cluster{gs: gs}
	defer func() {
		for _, g := range gs {
			require.NoError(t, g.Close())
		}
	}()
	const n = 1 << 18 // 1 MiB: four 256 KiB segments
	bufs := [][]float32{make([]float32, n), make([]float32, n)}
	fill := func() {
		for r, b := range bufs {
			for i := range b {
				b[i] = float32((i*7+r*3)%101 - 50)
			}
		}
	}
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	step, stop := lockstep(t, c, func(r int, g *ProcessGroup) error {
		return g.AllReduce(ctx, F32(bufs[r]), Sum)
	})
	defer stop()
	for k := range 8 { // the first four alternate plain and streamed
		fill()
		step()
		for r, b := range bufs {
			for i, v := range b {
				if want := float32((i*7)%101-50) + float32((i*7+3)%101-50); v != want {
					t.Fatalf("call %d, rank %d, element %d: %v, want %v", k, r, i, v, want)
				}
			}
		}
	}
	if !raceEnabled {
		require.Zero(t, testing.AllocsPerRun(40, step)) // probes included
	}
}
