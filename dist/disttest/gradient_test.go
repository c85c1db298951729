package disttest_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/disttest"
)

// recorder is a testing.TB that keeps the failures reported to it.
type recorder struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// TestCheckGradients: on 3 ranks each holding a vector of its own length
// and a replicated one, loss = Σ_r (Σ_i c_r·a_r[i]² + Σ_j s[j]·a_r[0]): the
// true gradients pass, and each wrong element is reported once, by the rank
// that holds it.
func TestCheckGradients(t *testing.T) {
	for _, wrong := range []bool{false, true} {
		rec := &recorder{TB: t}
		errs := disttest.Run(t, disttest.Cluster(t, 3), func(rank int, pg *dist.ProcessGroup) error {
			a := make([]float64, rank+2) // lengths 2, 3, 4
			for i := range a {
				a[i] = float64(rank) + 0.5*float64(i)
			}
			s := []float64{0.3, -0.7}
			c := float64(rank + 1)
			loss := func() (float64, error) {
				var l float64
				for _, x := range a {
					l += c * x * x
				}
				for _, x := range s {
					l += x * a[0]
				}
				v := []float64{l}
				err := pg.AllReduce(context.Background(), dist.F64(v), dist.Sum)
				return v[0], err
			}
			ga := make([]float64, len(a))
			for i, x := range a {
				ga[i] = 2 * c * x
			}
			ga[0] += s[0] + s[1]
			// d/ds[j] of Σ_r s[j]·a_r[0] = Σ_r a_r[0] = 0 + 1 + 2.
			gs := []float64{3, 3}
			if wrong && rank == 1 {
				ga[2] += 0.1
			}
			if wrong {
				gs[1] = 4 // every rank holds it wrong
			}
			return disttest.CheckGradients(rec, pg, loss, []disttest.Gradient{
				{Name: "a", Data: a, Grad: ga},
				{Name: "s", Data: s, Grad: gs, Replicated: true},
			}, 1e-6, 1e-6)
		})
		for r, err := range errs {
			require.NoError(t, err, "rank %d", r)
		}
		if !wrong {
			assert.Empty(t, rec.errs)
			continue
		}
		assert.ElementsMatch(t, []string{"rank 1 a[2]", "rank 0 s[1]", "rank 1 s[1]", "rank 2 s[1]"}, where(rec.errs), "%q", rec.errs)
	}
}

// where returns the part of each failure before its colon: rank and element.
func where(msgs []string) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i], _, _ = strings.Cut(m, ":")
	}
	return out
}
