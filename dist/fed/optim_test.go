package fed_test

import (
	"context"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/gdist/gdist/dist/fed"
)

// TestServerOptimizers checks each optimizer's steps against its formula
// (Reddi et al. 2021, Algorithm 2; Hsu et al. 2019), computed here in
// float64 step by step.
func TestServerOptimizers(t *testing.T) {
	deltas := [][]float64{{0.5, -1, 0}, {0.25, 2, -0.5}, {-0.125, 1, 1}}
	start := []float32{1, 2, 3}
	run := func(o fed.ServerOptimizer) [][]float32 {
		m := append([]float32(nil), start...)
		var out [][]float32
		for _, d := range deltas {
			o.Step(m, d)
			out = append(out, append([]float32(nil), m...))
		}
		return out
	}
	// ref runs the reference update per coordinate: step(i, k, m, d) returns
	// the new value from the old one.
	ref := func(step func(i, k int, x, d float64) float64) [][]float32 {
		x := []float64{1, 2, 3}
		var out [][]float32
		for k, d := range deltas {
			row := make([]float32, len(x))
			for i := range x {
				x[i] = step(i, k, x[i], d[i])
				row[i] = float32(x[i])
			}
			out = append(out, row)
		}
		return out
	}
	check := func(name string, got, want [][]float32) {
		for k := range want {
			assert.InDeltaSlice(t, want[k], got[k], 1e-6, "%s, step %d", name, k+1)
		}
	}

	check("FedAvg", run(&fed.FedAvg{}), ref(func(_, _ int, x, d float64) float64 { return x + d }))
	check("FedAvg lr 0.5", run(&fed.FedAvg{LR: 0.5}), ref(func(_, _ int, x, d float64) float64 { return x + 0.5*d }))

	v := make([]float64, 3)
	check("FedAvgM", run(&fed.FedAvgM{LR: 0.7, Momentum: 0.8}), ref(func(i, _ int, x, d float64) float64 {
		v[i] = 0.8*v[i] + d
		return x + 0.7*v[i]
	}))

	adaptive := func(eta, b1, tau float64, second func(v, d2 float64) float64) [][]float32 {
		m, vv := make([]float64, 3), []float64{tau * tau, tau * tau, tau * tau}
		return ref(func(i, _ int, x, d float64) float64 {
			m[i] = b1*m[i] + (1-b1)*d
			vv[i] = second(vv[i], d*d)
			return x + eta*m[i]/(math.Sqrt(vv[i])+tau)
		})
	}
	check("FedAdam", run(&fed.FedAdam{LR: 0.1, Beta1: 0.9, Beta2: 0.99, Tau: 1e-3}),
		adaptive(0.1, 0.9, 1e-3, func(v, d2 float64) float64 { return 0.99*v + 0.01*d2 }))
	check("FedAdam defaults", run(&fed.FedAdam{}),
		adaptive(0.01, 0.9, 1e-3, func(v, d2 float64) float64 { return 0.99*v + 0.01*d2 }))
	sign := func(x float64) float64 {
		if x > 0 {
			return 1
		} else if x < 0 {
			return -1
		}
		return 0
	}
	check("FedYogi", run(&fed.FedYogi{LR: 0.1, Beta1: 0.9, Beta2: 0.99, Tau: 1e-3}),
		adaptive(0.1, 0.9, 1e-3, func(v, d2 float64) float64 { return v - 0.01*d2*sign(v-d2) }))
	check("FedAdagrad", run(&fed.FedAdagrad{LR: 0.1, Beta1: 0.9, Tau: 1e-3}),
		adaptive(0.1, 0.9, 1e-3, func(v, d2 float64) float64 { return v + d2 }))
	check("FedAdagrad without momentum", run(&fed.FedAdagrad{LR: 0.1, Beta1: -1, Tau: 1e-3}),
		adaptive(0.1, 0, 1e-3, func(v, d2 float64) float64 { return v + d2 }))
}

// TestServerOptimizerInRound: the leader steps the model with the
// optimizer it was given, by the round's weighted mean update.
func TestServerOptimizerInRound(t *testing.T) {
	f := start(t, 3, []float32{1, 2}, []fed.Option{fed.WithServerOptimizer(&fed.FedAvg{LR: 0.5})}, nil)
	for r := 1; r < 3; r++ {
		serve(f.clients[r], trainer{weights: weightsOf, samples: func(r int) int { return r }})
	}
	m := f.leader.Model()
	_, err := f.leader.Round(context.Background())
	if !assert.NoError(t, err) {
		return
	}
	full := fedavg(m, [][]float32{weightsOf(1, 1, m), weightsOf(2, 1, m)}, []int{1, 2})
	want := make([]float32, len(m))
	for i := range m {
		want[i] = float32(float64(m[i]) + 0.5*(float64(full[i])-float64(m[i])))
	}
	assert.InDeltaSlice(t, want, f.leader.Model(), 1e-6, "half of FedAvg's step")
}
