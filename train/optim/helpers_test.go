package optim_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"go.uber.org/goleak"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/train/optim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// param is a gorgonia.ValueGrad over a value and a gradient, as a *Node with
// bound dual values is to a solver.
type param struct {
	name string
	v, g gorgonia.Value
}

func (p *param) Value() gorgonia.Value         { return p.v }
func (p *param) Grad() (gorgonia.Value, error) { return p.g, nil }
func (p *param) Name() string                  { return p.name }

// shapes of the test parameters; nil is a scalar (*gorgonia.F32/F64), {} a
// scalar *tensor.Dense (not in testShapes: Gorgonia's Momentum and Adam panic
// on one).
var testShapes = [][]int{{7, 5}, {13}, {1}, {3, 4, 2}, nil}

// newModel returns parameters of testShapes with values from seed.
func newModel(dt tensor.Dtype, seed uint64) []gorgonia.ValueGrad {
	rng := rand.New(rand.NewPCG(seed, 1))
	var model []gorgonia.ValueGrad
	for i, sh := range testShapes {
		p := &param{name: fmt.Sprintf("p%d", i)}
		n := 1
		for _, d := range sh {
			n *= d
		}
		vals := make([]float64, n)
		for k := range vals {
			vals[k] = rng.NormFloat64()
		}
		if n > 2 {
			vals[1] = 0 // exercise sign(0) in L1
		}
		p.v, p.g = makeValue(dt, sh, vals), makeValue(dt, sh, make([]float64, n))
		model = append(model, p)
	}
	return model
}

func makeValue(dt tensor.Dtype, shape []int, vals []float64) gorgonia.Value {
	if shape == nil {
		if dt == tensor.Float32 {
			return gorgonia.NewF32(float32(vals[0]))
		}
		return gorgonia.NewF64(vals[0])
	}
	if len(shape) == 0 {
		if dt == tensor.Float32 {
			return tensor.New(tensor.FromScalar(float32(vals[0])))
		}
		return tensor.New(tensor.FromScalar(vals[0]))
	}
	if dt == tensor.Float32 {
		f := make([]float32, len(vals))
		for i, v := range vals {
			f[i] = float32(v)
		}
		return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(f))
	}
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(append([]float64(nil), vals...)))
}

// setGrads writes step's gradients (the same for every model built alike)
// into model's gradient values: normal values at a scale that varies by step
// (so that clipping bites on some steps), with zeros and negative zeros.
func setGrads(model []gorgonia.ValueGrad, step int) {
	rng := rand.New(rand.NewPCG(uint64(step), 99))
	scale := 0.1 + 3*math.Abs(math.Sin(float64(step)))
	next := func(k int) float64 {
		switch k % 11 {
		case 3:
			return 0
		case 7:
			return math.Copysign(0, -1)
		}
		return rng.NormFloat64() * scale
	}
	for _, p := range model {
		g, _ := p.Grad()
		k := 0
		switch gv := g.(type) {
		case *tensor.Dense:
			if gv.Dtype() == tensor.Float32 {
				for i, f := 0, gv.Float32s(); i < len(f); i++ {
					f[i] = float32(next(k))
					k++
				}
			} else {
				for i, f := 0, gv.Float64s(); i < len(f); i++ {
					f[i] = next(k)
					k++
				}
			}
		case *gorgonia.F32:
			*gv = gorgonia.F32(next(1))
		case *gorgonia.F64:
			*gv = gorgonia.F64(next(1))
		}
	}
}

// bits returns every weight and gradient element of model as raw bits.
func bits(model []gorgonia.ValueGrad) []uint64 {
	var out []uint64
	add := func(v gorgonia.Value) {
		switch x := v.(type) {
		case *tensor.Dense:
			if x.Dtype() == tensor.Float32 {
				for _, e := range x.Float32s() {
					out = append(out, uint64(math.Float32bits(e)))
				}
			} else {
				for _, e := range x.Float64s() {
					out = append(out, math.Float64bits(e))
				}
			}
		case *gorgonia.F32:
			out = append(out, uint64(math.Float32bits(float32(*x))))
		case *gorgonia.F64:
			out = append(out, math.Float64bits(float64(*x)))
		}
	}
	for _, p := range model {
		add(p.Value())
		g, _ := p.Grad()
		add(g)
	}
	return out
}

// setting is one solver configuration, built both ways.
type setting struct {
	name   string
	ours   func() (optim.Solver, error)
	theirs func() gorgonia.Solver
}

func settings() []setting {
	G := gorgonia.WithLearnRate // shorter lines below
	return []setting{
		{"sgd/default", func() (optim.Solver, error) { return optim.NewSGD() }, func() gorgonia.Solver { return gorgonia.NewVanillaSolver() }},
		{"sgd/l2+clip", func() (optim.Solver, error) {
			return optim.NewSGD(optim.WithLearnRate(0.1), optim.WithL2Reg(0.01), optim.WithClip(0.5))
		}, func() gorgonia.Solver {
			return gorgonia.NewVanillaSolver(G(0.1), gorgonia.WithL2Reg(0.01), gorgonia.WithClip(0.5))
		}},
		{"sgd/l1+batch+l2+clip", func() (optim.Solver, error) {
			return optim.NewSGD(optim.WithLearnRate(0.03), optim.WithL1Reg(0.002), optim.WithBatchSize(4), optim.WithL2Reg(0.003), optim.WithClip(0.25))
		}, func() gorgonia.Solver {
			return gorgonia.NewVanillaSolver(G(0.03), gorgonia.WithL1Reg(0.002), gorgonia.WithBatchSize(4), gorgonia.WithL2Reg(0.003), gorgonia.WithClip(0.25))
		}},
		{"momentum/default", func() (optim.Solver, error) { return optim.NewMomentum() }, func() gorgonia.Solver { return gorgonia.NewMomentum() }},
		{"momentum/l2+clip", func() (optim.Solver, error) {
			return optim.NewMomentum(optim.WithLearnRate(0.05), optim.WithMomentum(0.8), optim.WithL2Reg(0.01), optim.WithClip(0.7))
		}, func() gorgonia.Solver {
			return gorgonia.NewMomentum(G(0.05), gorgonia.WithMomentum(0.8), gorgonia.WithL2Reg(0.01), gorgonia.WithClip(0.7))
		}},
		{"momentum/l1+batch", func() (optim.Solver, error) {
			return optim.NewMomentum(optim.WithLearnRate(0.02), optim.WithL1Reg(0.001), optim.WithBatchSize(3))
		}, func() gorgonia.Solver {
			return gorgonia.NewMomentum(G(0.02), gorgonia.WithL1Reg(0.001), gorgonia.WithBatchSize(3))
		}},
		{"adam/default", func() (optim.Solver, error) { return optim.NewAdam() }, func() gorgonia.Solver { return gorgonia.NewAdamSolver() }},
		{"adam/l2+clip", func() (optim.Solver, error) {
			return optim.NewAdam(optim.WithLearnRate(0.01), optim.WithL2Reg(0.01), optim.WithClip(1))
		}, func() gorgonia.Solver {
			return gorgonia.NewAdamSolver(G(0.01), gorgonia.WithL2Reg(0.01), gorgonia.WithClip(1))
		}},
		{"adam/all", func() (optim.Solver, error) {
			return optim.NewAdam(optim.WithLearnRate(0.003), optim.WithL1Reg(0.0005), optim.WithL2Reg(0.002),
				optim.WithBatchSize(3), optim.WithClip(0.9), optim.WithBeta1(0.8), optim.WithBeta2(0.99), optim.WithEps(1e-6))
		}, func() gorgonia.Solver {
			return gorgonia.NewAdamSolver(G(0.003), gorgonia.WithL1Reg(0.0005), gorgonia.WithL2Reg(0.002),
				gorgonia.WithBatchSize(3), gorgonia.WithClip(0.9), gorgonia.WithBeta1(0.8), gorgonia.WithBeta2(0.99), gorgonia.WithEps(1e-6))
		}},
	}
}

var dtypes = []tensor.Dtype{tensor.Float32, tensor.Float64}
