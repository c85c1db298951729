package mlp

import (
	"math/rand/v2"
	"testing"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// BenchmarkTrainStep measures one training step (forward, backward, solver
// step, reset) of the 784-256-128-10 MLP on a batch of 64 (128 for the
// b128 cases) and reports samples/s. Run with GOMAXPROCS=1 to match one rank of a gdist job:
//
//	GOMAXPROCS=1 go test -run - -bench TrainStep ./models/mlp
func BenchmarkTrainStep(b *testing.B) {
	for _, bc := range []struct {
		name   string
		batch  int
		dt     tensor.Dtype
		solver func() gorgonia.Solver
	}{
		{"f32/adam", 64, tensor.Float32, func() gorgonia.Solver { return gorgonia.NewAdamSolver(gorgonia.WithLearnRate(1e-3)) }},
		{"f32/sgd", 64, tensor.Float32, func() gorgonia.Solver { return gorgonia.NewVanillaSolver(gorgonia.WithLearnRate(0.1)) }},
		{"f32/momentum", 64, tensor.Float32, func() gorgonia.Solver {
			return gorgonia.NewMomentum(gorgonia.WithLearnRate(0.05), gorgonia.WithMomentum(0.9))
		}},
		{"f64/adam", 64, tensor.Float64, func() gorgonia.Solver { return gorgonia.NewAdamSolver(gorgonia.WithLearnRate(1e-3)) }},
		{"b128/f32/adam", 128, tensor.Float32, func() gorgonia.Solver { return gorgonia.NewAdamSolver(gorgonia.WithLearnRate(1e-3)) }},
		{"b128/f32/sgd", 128, tensor.Float32, func() gorgonia.Solver { return gorgonia.NewVanillaSolver(gorgonia.WithLearnRate(0.1)) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			batch := bc.batch
			n := build(b, Config{Sizes: []int{784, 256, 128, 10}, Batch: batch, Dtype: bc.dt, Seed: 1})
			rng := rand.New(rand.NewPCG(1, 2))
			xs := make([]float64, batch*784)
			for i := range xs {
				xs[i] = rng.Float64()
			}
			ys := make([]float64, batch*10)
			for r := range batch {
				ys[r*10+rng.IntN(10)] = 1
			}
			x, y := dense(bc.dt, []int{batch, 784}, xs), dense(bc.dt, []int{batch, 10}, ys)
			if err := gorgonia.Let(n.x, x); err != nil {
				b.Fatal(err)
			}
			if err := gorgonia.Let(n.y, y); err != nil {
				b.Fatal(err)
			}
			solver := bc.solver()
			learn := n.m.Learnables()
			b.ReportAllocs()
			for b.Loop() {
				if err := n.vm.RunAll(); err != nil {
					b.Fatal(err)
				}
				if err := solver.Step(gorgonia.NodesToValueGrads(learn)); err != nil {
					b.Fatal(err)
				}
				n.vm.Reset()
			}
			b.ReportMetric(float64(batch*b.N)/b.Elapsed().Seconds(), "samples/s")
		})
	}
}
