package ddp

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/models/mlp"
)

// TestMLPModel trains the project's MLP (ReLU, fused mean softmax
// cross-entropy) through ForwardWith(d.Hooked()) on 3 ranks and compares with
// one process on the whole batch.
func TestMLPModel(t *testing.T) {
	const n, global, steps = 3, 12, 3
	sizes := []int{6, 8, 4}
	for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
		t.Run(dt.String(), func(t *testing.T) {
			data := func(step, lo, hi int) (x, y tensor.Tensor) {
				xv, _ := batch(dt, step, lo, hi, sizes[0], 1)
				ys := make([]float64, (hi-lo)*sizes[2])
				for r := lo; r < hi; r++ {
					ys[(r-lo)*sizes[2]+(r*7+step)%sizes[2]] = 1
				}
				return xv, dense(dt, []int{hi - lo, sizes[2]}, ys)
			}
			train := func(pg *dist.ProcessGroup, rows int, lo int) ([][]float64, error) {
				buildMu.Lock()
				g := gorgonia.NewGraph()
				m, err := mlp.New(g, mlp.Config{Sizes: sizes, Batch: rows, Dtype: dt, Seed: 7})
				buildMu.Unlock()
				if err != nil {
					return nil, err
				}
				params := m.Learnables()
				var d *DDP
				solver := gorgonia.Solver(gorgonia.NewAdamSolver(gorgonia.WithLearnRate(0.05)))
				if pg != nil {
					if d, err = Wrap(context.Background(), pg, params, WithBucketCap(100)); err != nil {
						return nil, err
					}
					solver = d.Solver(solver)
				}
				buildMu.Lock()
				x, y := m.NewInputs()
				fw := params
				if d != nil {
					fw, err = d.Hooked()
				}
				var logits, loss *gorgonia.Node
				if err == nil {
					logits, err = m.ForwardWith(x, fw)
				}
				if err == nil {
					loss, err = mlp.Loss(logits, y)
				}
				if err == nil {
					_, err = gorgonia.Grad(loss, params...)
				}
				buildMu.Unlock()
				if err != nil {
					return nil, err
				}
				vm := gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(params...))
				defer vm.Close()
				for step := range steps {
					xv, yv := data(step, lo, lo+rows)
					if err := gorgonia.Let(x, xv); err != nil {
						return nil, err
					}
					if err := gorgonia.Let(y, yv); err != nil {
						return nil, err
					}
					if err := vm.RunAll(); err != nil {
						return nil, err
					}
					if err := solver.Step(gorgonia.NodesToValueGrads(params)); err != nil {
						return nil, err
					}
					vm.Reset()
				}
				var out [][]float64
				for _, p := range params {
					out = append(out, toFloat64(p.Value()))
				}
				return out, nil
			}
			want, err := train(nil, global, 0)
			require.NoError(t, err)
			got := make([][][]float64, n)
			runRanks(t, n, func(pg *dist.ProcessGroup) error {
				var err error
				got[pg.Rank()], err = train(pg, global/n, pg.Rank()*global/n)
				return err
			})
			for r := 1; r < n; r++ {
				assert.Equal(t, got[0], got[r])
			}
			assert.LessOrEqual(t, maxRelErr(want, got[0]), tolerance(dt))
		})
	}
}
