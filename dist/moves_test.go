package dist

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// moveVal is rank r's element i in the tests of the collectives that move
// data: small integers, exact in every dtype, different on every rank.
func moveVal(r, i int) float64 { return float64((r*97+i*31)%251 - 125) }

// moveCount is how many elements rank from sends rank to in the uneven
// tests of length l: 0 to l+1, some zero.
func moveCount(from, to, l int) int { return (from*3 + to*5 + l) % (l + 2) }

// typedOf encodes vs as a Buffer of dt.
func typedOf(t require.TestingT, dt DType, vs []float64) Buffer {
	return Typed(encodeValues(t, dt, vs), dt)
}

// checkMoves runs AllToAll, AllToAllV, Gather, Scatter and AllGatherV on
// every dtype once on rank r of n, for blocks of length elements, and
// compares with the reference.
func checkMoves(ctx context.Context, t require.TestingT, g *ProcessGroup, n, r, length int) error {
	for _, dt := range allDTypes {
		where := func(what string) string {
			return fmt.Sprintf("%s %v n=%d rank=%d len=%d", what, dt, n, r, length)
		}

		// AllToAll: block j of rank r's src goes to rank j.
		src := make([]float64, n*length)
		for i := range src {
			src[i] = moveVal(r, i)
		}
		dst := typedOf(t, dt, make([]float64, n*length))
		if err := g.AllToAll(ctx, dst, typedOf(t, dt, src)); err != nil {
			return err
		}
		want := make([]float64, 0, n*length)
		for j := range n {
			for i := range length {
				want = append(want, moveVal(j, r*length+i))
			}
		}
		assert.Equal(t, want, decodeValues(t, dt, dst.Bytes()), where("all_to_all"))

		// AllToAllV: rank r sends moveCount(r, j) elements to rank j.
		send, recv := make([]int, n), make([]int, n)
		var ns, nr int
		for j := range n {
			send[j], recv[j] = moveCount(r, j, length), moveCount(j, r, length)
			ns += send[j]
			nr += recv[j]
		}
		src = src[:0]
		for i := range ns {
			src = append(src, moveVal(r, i))
		}
		dst = typedOf(t, dt, make([]float64, nr))
		if err := g.AllToAllV(ctx, dst, typedOf(t, dt, src), send, recv); err != nil {
			return err
		}
		want = want[:0]
		for j := range n {
			off := 0
			for k := range r {
				off += moveCount(j, k, length)
			}
			for i := range moveCount(j, r, length) {
				want = append(want, moveVal(j, off+i))
			}
		}
		assert.Equal(t, want, decodeValues(t, dt, dst.Bytes()), where("all_to_all_v"))

		// Gather to one root, Scatter from another.
		mine := make([]float64, length)
		for i := range mine {
			mine[i] = moveVal(r, i)
		}
		root := length % n
		var gathered Buffer
		if r == root {
			gathered = typedOf(t, dt, make([]float64, n*length))
		}
		if err := g.Gather(ctx, gathered, typedOf(t, dt, mine), root); err != nil {
			return err
		}
		all := make([]float64, 0, n*length)
		for q := range n {
			for i := range length {
				all = append(all, moveVal(q, i))
			}
		}
		if r == root {
			assert.Equal(t, all, decodeValues(t, dt, gathered.Bytes()), where("gather"))
		}
		root = (length + 1) % n
		var whole Buffer
		if r == root {
			whole = typedOf(t, dt, all)
		}
		part := typedOf(t, dt, make([]float64, length))
		if err := g.Scatter(ctx, part, whole, root); err != nil {
			return err
		}
		assert.Equal(t, all[r*length:(r+1)*length], decodeValues(t, dt, part.Bytes()), where("scatter"))

		// AllGatherV: rank q contributes moveCount(q, 0) elements.
		counts := make([]int, n)
		total := 0
		for q := range n {
			counts[q] = moveCount(q, 0, length)
			total += counts[q]
		}
		contrib := func(q int) []float64 {
			x := make([]float64, counts[q])
			for i := range x {
				x[i] = moveVal(q, i)
			}
			return x
		}
		dst = typedOf(t, dt, make([]float64, total))
		if err := g.AllGatherV(ctx, dst, typedOf(t, dt, contrib(r)), counts); err != nil {
			return err
		}
		want = want[:0]
		for q := range n {
			want = append(want, contrib(q)...)
		}
		assert.Equal(t, want, decodeValues(t, dt, dst.Bytes()), where("all_gather_v"))
	}
	return nil
}

// TestMovesRefuse: bad arguments are refused on the calling rank, before
// anything is sent, with a matchable error.
func TestMovesRefuse(t *testing.T) {
	c := newCluster(t, 2)
	g := c.gs[0]
	f := func(n int) Buffer { return F32(make([]float32, n)) }
	var lm *LengthMismatchError
	require.ErrorIs(t, g.AllToAll(bg, f(3), f(3)), ErrInvalidArgument, "3 elements do not split in 2")
	require.ErrorAs(t, g.AllToAll(bg, f(2), f(4)), &lm)
	require.ErrorIs(t, g.AllToAll(bg, F64(make([]float64, 4)), f(4)), ErrInvalidArgument, "dtypes differ")
	buf := make([]float32, 4)
	require.ErrorIs(t, g.AllToAll(bg, F32(buf), F32(buf)), ErrInvalidArgument, "overlap")
	require.ErrorIs(t, g.AllToAllV(bg, f(2), f(2), []int{1}, []int{1, 1}), ErrInvalidArgument)
	require.ErrorIs(t, g.AllToAllV(bg, f(2), f(2), []int{-1, 3}, []int{1, 1}), ErrInvalidArgument)
	require.ErrorIs(t, g.AllToAllV(bg, f(2), f(2), []int{2, 0}, []int{1, 1}), ErrInvalidArgument, "keeps 2, receives 1 from itself")
	require.ErrorAs(t, g.AllToAllV(bg, f(2), f(3), []int{1, 1}, []int{1, 1}), &lm)
	require.ErrorAs(t, g.Gather(bg, f(3), f(2), 0), &lm)
	require.ErrorIs(t, g.Gather(bg, f(4), f(2), 2), ErrInvalidRank)
	require.ErrorAs(t, g.Scatter(bg, f(2), f(3), 0), &lm)
	require.ErrorIs(t, g.AllGatherV(bg, f(3), f(1), []int{1}), ErrInvalidArgument)
	require.ErrorIs(t, g.AllGatherV(bg, f(3), f(1), []int{1, -2}), ErrInvalidArgument)
	require.ErrorAs(t, g.AllGatherV(bg, f(3), f(2), []int{1, 2}), &lm)
	require.ErrorIs(t, g.AllReduce(bg, Typed(make([]byte, 3), Float16), Sum), ErrInvalidArgument)
	require.ErrorIs(t, g.AllReduce(bg, Buffer{}, Sum), ErrUnsupportedDType)
	require.ErrorIs(t, g.ReduceScatter(bg, F32(buf[:2]), F32(buf), Sum), ErrInvalidArgument, "overlap")
	// Nothing was sent: the group still works.
	requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
		x := []float32{float32(r)}
		if err := g.AllReduce(bg, F32(x), Sum); err != nil {
			return err
		}
		assert.Equal(t, []float32{1}, x)
		return nil
	}))
	// Counts that disagree between ranks are a desync.
	errs := c.run(func(r int, g *ProcessGroup) error {
		counts := []int{1, 2}
		if r == 1 {
			counts = []int{2, 1}
		}
		return g.AllGatherV(bg, f(3), f(counts[r]), counts)
	})
	for r, err := range errs {
		require.ErrorIs(t, err, ErrDesync, "rank %d", r)
	}
}
