package pipeline

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
)

// stepBits trains two steps of an MLP wide enough for gonum to split its
// products into blocks, on two ranks, and returns every rank's loss,
// gradients, outputs and parameters as bits, rank by rank.
func stepBits(t *testing.T, dt tensor.Dtype, opts ...Option) [][]uint64 {
	t.Helper()
	sizes := []int{130, 130, 70, 130, 130}
	const m, rows, p = 4, 3, 2
	out := make([][]uint64, p)
	errs := runRanks(t, p, func(pg *dist.ProcessGroup) error {
		ctx := context.Background()
		from, to := splitLayers(len(sizes)-1, p, pg.Rank())
		pl, err := New(ctx, pg, func(g *gorgonia.ExprGraph) (Stage, error) {
			return newMLPStage(g, sizes, from, to, rows, dt), nil
		}, append([]Option{WithMicroBatches(m), WithLoss(mseLoss)}, opts...)...)
		if err != nil {
			return err
		}
		defer pl.Close()
		var bits []uint64
		add := func(d any) {
			switch x := d.(type) {
			case []float32:
				for _, v := range x {
					bits = append(bits, uint64(math.Float32bits(v)))
				}
			case []float64:
				for _, v := range x {
					bits = append(bits, math.Float64bits(v))
				}
			}
		}
		solver := gorgonia.NewVanillaSolver(gorgonia.WithLearnRate(0.1))
		for step := range 2 {
			loss, err := pl.TrainStep(ctx, mlpData(step, rows, func(mb int, o *tensor.Dense) error {
				add(o.Data())
				return nil
			}))
			if err != nil {
				return err
			}
			bits = append(bits, math.Float64bits(loss))
			for _, n := range pl.Learnables() {
				d, err := gradData(n)
				if err != nil {
					return err
				}
				add(d)
			}
			if err := solver.Step(gorgonia.NodesToValueGrads(pl.Learnables())); err != nil {
				return err
			}
			for _, n := range pl.Learnables() {
				d, err := denseData(n.Value())
				if err != nil {
					return err
				}
				add(d)
			}
		}
		out[pg.Rank()] = bits
		return nil
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
	return out
}

// TestOwnKernelsBitwise checks that the executor's own matrix products
// and element-wise arithmetic (gemm.go, elem.go) leave every loss, gradient, output and parameter bitwise what
// Gorgonia's op makes them, for every schedule, with recomputation and in
// both dtypes.
func TestOwnKernelsBitwise(t *testing.T) {
	defer func() { ownKernels = true }()
	cases := []struct {
		name string
		opts []Option
	}{
		{"gpipe", nil},
		{"1f1b", []Option{WithSchedule(OneFOneB)}},
		{"zb-h1", []Option{WithSchedule(ZeroBubble)}},
		{"recompute", []Option{WithRecompute(true)}},
	}
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		for _, c := range cases {
			t.Run(fmt.Sprintf("%v/%s", dt, c.name), func(t *testing.T) {
				ownKernels = false
				want := stepBits(t, dt, c.opts...)
				ownKernels = true
				got := stepBits(t, dt, c.opts...)
				for r := range want {
					require.NotEmpty(t, want[r])
					require.Equal(t, want[r], got[r], "rank %d", r)
				}
			})
		}
	}
}

// TestWeightGradsAddedByPass: every weight gradient of an MLP stage (a
// matrix product) is added to its parameter's gradient by the weight pass
// itself, in every schedule; bias gradients (sums) are added afterwards.
func TestWeightGradsAddedByPass(t *testing.T) {
	sizes := []int{8, 8, 8}
	for _, opts := range [][]Option{nil, {WithSchedule(ZeroBubble)}, {WithRecompute(true)}} {
		errs := runRanks(t, 1, func(pg *dist.ProcessGroup) error {
			pl, err := New(context.Background(), pg, func(g *gorgonia.ExprGraph) (Stage, error) {
				return newMLPStage(g, sizes, 0, 2, 2, tensor.Float64), nil
			}, append([]Option{WithMicroBatches(2), WithLoss(mseLoss)}, opts...)...)
			if err != nil {
				return err
			}
			defer pl.Close()
			for _, s := range pl.chunks[0].train {
				for j, i := range s.added {
					if w := j%2 == 0; w != (i >= 0) {
						return fmt.Errorf("parameter %d (%s): added by the pass: %v", j, s.params[j].Name(), i >= 0)
					}
				}
			}
			return nil
		})
		for _, err := range errs {
			require.NoError(t, err)
		}
	}
}
