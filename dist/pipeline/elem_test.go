package pipeline

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// TestElemMatchesOp checks the executor's element-wise addition,
// subtraction and Hadamard product bit for bit against Gorgonia's ops, on
// two tensors and on a tensor and a scalar either way round, with zeros,
// negative zeros, infinities and NaNs among the values.
func TestElemMatchesOp(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	special := []float64{0, math.Copysign(0, -1), math.Inf(1), math.Inf(-1), math.NaN(), 1e-40, 3e38}
	vals := func(n int) []float64 {
		v := randVals(r, n)
		for i := range v {
			if r.IntN(8) == 0 {
				v[i] = special[r.IntN(len(special))]
			}
		}
		return v
	}
	fs := map[elemOp]func(a, b *gorgonia.Node) (*gorgonia.Node, error){
		elemAdd: gorgonia.Add, elemSub: gorgonia.Sub, elemMul: gorgonia.HadamardProd,
	}
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		for e, f := range fs {
			for _, form := range []string{"tt", "ts", "st"} {
				t.Run(fmt.Sprintf("%v/%d/%s", dt, e, form), func(t *testing.T) {
					g := gorgonia.NewGraph()
					shape := tensor.Shape{5, 7}
					node := func(name string, scalar bool) *gorgonia.Node {
						if scalar {
							return gorgonia.NewScalar(g, dt, gorgonia.WithName(name))
						}
						return gorgonia.NewMatrix(g, dt, gorgonia.WithShape(shape...), gorgonia.WithName(name))
					}
					a, b := node("a", form == "st"), node("b", form == "ts")
					n, err := f(a, b)
					if err != nil {
						t.Fatal(err)
					}
					if got := asElem(n.Op()); got != e {
						t.Fatalf("%v recognised as %d, want %d", n.Op(), got, e)
					}
					value := func(scalar bool) gorgonia.Value {
						v := vals(shape.TotalSize())
						if scalar {
							if dt == tensor.Float32 {
								return gorgonia.NewF32(float32(v[0]))
							}
							return gorgonia.NewF64(v[0])
						}
						if dt == tensor.Float32 {
							return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(to32(v)))
						}
						return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(v))
					}
					for range 20 {
						av, bv := value(form == "st"), value(form == "ts")
						want, err := n.Op().Do(av, bv)
						if err != nil {
							t.Fatal(err)
						}
						got, ok := e.run(nil, false, av, bv)
						if !ok {
							t.Fatalf("%v: not run by the executor", n.Op())
						}
						got, ok = e.run(got, true, av, bv)
						if !ok {
							t.Fatalf("%v: not run by the executor into its last value", n.Op())
						}
						requireSameBits(t, n.Op().String(), want, got)
					}
				})
			}
		}
	}
}

// TestElemAllocatesNothing: into its last value, an element-wise
// operation allocates nothing.
func TestElemAllocatesNothing(t *testing.T) {
	a := tensor.New(tensor.WithShape(4, 256), tensor.WithBacking(make([]float32, 1024)))
	b := tensor.New(tensor.WithShape(4, 256), tensor.WithBacking(make([]float32, 1024)))
	s := gorgonia.NewF32(2)
	c, ok := elemMul.run(nil, false, a, b)
	if !ok {
		t.Fatal("not run")
	}
	if n := testing.AllocsPerRun(10, func() { elemMul.run(c, true, a, b) }); n != 0 {
		t.Errorf("tensor ⊙ tensor: %v allocations, want 0", n)
	}
	if n := testing.AllocsPerRun(10, func() { elemSub.run(c, true, s, b) }); n != 0 {
		t.Errorf("scalar - tensor: %v allocations, want 0", n)
	}
}
