package optim_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/train/optim"
)

// mnistShapes are the parameters of the MNIST MLP 784-256-128-10.
var mnistShapes = [][]int{{784, 256}, {256}, {256, 128}, {128}, {128, 10}, {10}}

// mnistModel returns the MLP's parameters (float32) with random values and
// gradients, and a copy of the gradients to restore before every step.
func mnistModel() (model []gorgonia.ValueGrad, grads [][]float32) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i, sh := range mnistShapes {
		n := 1
		for _, d := range sh {
			n *= d
		}
		w, g := make([]float32, n), make([]float32, n)
		for k := range w {
			w[k] = float32(rng.NormFloat64() * 0.05)
			g[k] = float32(rng.NormFloat64() * 0.01)
		}
		grads = append(grads, append([]float32(nil), g...))
		model = append(model, &param{
			name: fmt.Sprintf("p%d", i),
			v:    tensor.New(tensor.WithShape(sh...), tensor.WithBacking(w)),
			g:    tensor.New(tensor.WithShape(sh...), tensor.WithBacking(g)),
		})
	}
	return model, grads
}

// benchStep measures Step; the gradients (which Step zeroes) are restored
// outside the timer so that every step does the same arithmetic on normal
// numbers.
func benchStep(b *testing.B, s gorgonia.Solver) {
	model, grads := mnistModel()
	restore := func() {
		for i, p := range model {
			g, _ := p.Grad()
			copy(g.(*tensor.Dense).Data().([]float32), grads[i])
		}
	}
	restore()
	if err := s.Step(model); err != nil { // allocate the state
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		restore()
		b.StartTimer()
		if err := s.Step(model); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStep compares each solver's Step with Gorgonia's of the same kind
// on the MNIST MLP's 235,146 float32 parameters.
func BenchmarkStep(b *testing.B) {
	must := func(s optim.Solver, err error) optim.Solver {
		if err != nil {
			b.Fatal(err)
		}
		return s
	}
	cases := []struct {
		name string
		s    func() gorgonia.Solver
	}{
		{"sgd/optim", func() gorgonia.Solver {
			return must(optim.NewSGD(optim.WithLearnRate(0.01), optim.WithL2Reg(1e-4), optim.WithClip(5)))
		}},
		{"sgd/gorgonia", func() gorgonia.Solver {
			return gorgonia.NewVanillaSolver(gorgonia.WithLearnRate(0.01), gorgonia.WithL2Reg(1e-4), gorgonia.WithClip(5))
		}},
		{"momentum/optim", func() gorgonia.Solver { return must(optim.NewMomentum(optim.WithLearnRate(0.01))) }},
		{"momentum/gorgonia", func() gorgonia.Solver { return gorgonia.NewMomentum(gorgonia.WithLearnRate(0.01)) }},
		{"adam/optim", func() gorgonia.Solver { return must(optim.NewAdam(optim.WithLearnRate(0.001))) }},
		{"adam/gorgonia", func() gorgonia.Solver { return gorgonia.NewAdamSolver(gorgonia.WithLearnRate(0.001)) }},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) { benchStep(b, c.s()) })
	}
}
