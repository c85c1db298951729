package fed_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/fed"
)

// TestScaffold: the leader's control variate c is the mean of the clients'
// changes Δcᵢ = -c - Δyᵢ/(K·η) over the job's clients, and each task's
// correction is c - cᵢ; with secure aggregation too.
func TestScaffold(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []fed.Option
	}{{"plain", nil}, {"secure", secure(nil)}} {
		t.Run(tc.name, func(t *testing.T) {
			f := start(t, 3, []float32{1, 2, 3}, append([]fed.Option{fed.WithScaffold()}, tc.opts...), nil)
			// Round 1: c = 0, so the corrections are 0. Each client moves its
			// weights by dy_r = rank·(1, 2, 3) in steps·lr = 2·0.5 = 1.
			dy := func(r int) []float32 { return []float32{float32(r), float32(2 * r), float32(3 * r)} }
			corrections := make(chan []float32, 4)
			for r := 1; r < 3; r++ {
				go func() {
					c := f.clients[r]
					for {
						task, err := c.Next(context.Background())
						if err != nil {
							return
						}
						corrections <- task.Correction
						w := task.Model
						for i := range w {
							w[i] += dy(r)[i]
						}
						assert.ErrorIs(t, c.Report(context.Background(), task, w, 5), fed.ErrInvalidArgument, "no Trained")
						task.Trained(2, 0.5)
						assert.NoError(t, c.Report(context.Background(), task, w, 5))
					}
				}()
			}
			ctx := context.Background()
			_, err := f.leader.Round(ctx)
			require.NoError(t, err)
			for range 2 {
				assert.Equal(t, []float32{0, 0, 0}, <-corrections, "round 1: no correction")
			}
			// c_r = Δc_r = -dy_r; c = (c_1 + c_2)/2 = -1.5·(1, 2, 3).
			_, err = f.leader.Round(ctx)
			require.NoError(t, err)
			got := [][]float32{<-corrections, <-corrections}
			want := map[float32][]float32{} // by the first value: client 1's, then client 2's
			for r := 1; r < 3; r++ {
				cr := []float32{float32(-r), float32(-2 * r), float32(-3 * r)}
				corr := make([]float32, 3)
				for i := range corr {
					corr[i] = -1.5*float32(i+1) - cr[i]
				}
				want[corr[0]] = corr
			}
			for _, g := range got {
				require.Contains(t, want, g[0])
				assert.InDeltaSlice(t, want[g[0]], g, 1e-4, "round 2: c - c_i")
			}
		})
	}
}
