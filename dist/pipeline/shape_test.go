package pipeline

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// TestSumRowsMatchesOp checks the executor's sum over rows bit for bit,
// shape included, against Gorgonia's Sum along axis 0.
func TestSumRowsMatchesOp(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		for _, sh := range [][2]int{{1, 5}, {4, 256}, {7, 3}, {65, 9}} {
			t.Run(fmt.Sprintf("%v/%dx%d", dt, sh[0], sh[1]), func(t *testing.T) {
				g := gorgonia.NewGraph()
				a := gorgonia.NewMatrix(g, dt, gorgonia.WithShape(sh[0], sh[1]))
				s := gorgonia.Must(gorgonia.Sum(a, 0))
				if f := asFast(s.Op()); f != fastSumRows {
					t.Fatalf("%v recognised as %d", s.Op(), f)
				}
				if f := asFast(gorgonia.Must(gorgonia.Sum(a, 1)).Op()); f != fastNone {
					t.Fatalf("Sum along 1 recognised as %d", f)
				}
				for range 10 {
					av := randDense(r, dt, tensor.Shape{sh[0], sh[1]})
					want, err := s.Op().Do(av)
					if err != nil {
						t.Fatal(err)
					}
					got, ok := fastSumRows.run(nil, false, av, s.Shape())
					if !ok {
						t.Fatal("not run by the executor")
					}
					if got, ok = fastSumRows.run(got, true, av, s.Shape()); !ok {
						t.Fatal("not run by the executor into its last value")
					}
					requireSameBits(t, s.Op().String(), want, got)
				}
			})
		}
	}
}

// TestReshapeKeepsLastValue: the executor keeps a reshape's last value
// while its input's data stays where it was, and runs the op otherwise.
func TestReshapeKeepsLastValue(t *testing.T) {
	g := gorgonia.NewGraph()
	a := gorgonia.NewMatrix(g, tensor.Float32, gorgonia.WithShape(4, 6))
	n := gorgonia.Must(gorgonia.Reshape(a, tensor.Shape{2, 12}))
	if f := asFast(n.Op()); f != fastReshape {
		t.Fatalf("%v recognised as %d", n.Op(), f)
	}
	r := rand.New(rand.NewPCG(9, 10))
	av := randDense(r, tensor.Float32, tensor.Shape{4, 6})
	if _, ok := fastReshape.run(nil, false, av, n.Shape()); ok {
		t.Fatal("reshape without a last value did not run the op")
	}
	last, err := n.Op().Do(av)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := fastReshape.run(last, false, av, n.Shape())
	if !ok || got != last {
		t.Fatal("reshape of the same data did not keep its last value")
	}
	// The input changes in place: the kept header shows it, as the op's
	// value would.
	av.Float32s()[5] = 42
	want, err := n.Op().Do(av)
	if err != nil {
		t.Fatal(err)
	}
	requireSameBits(t, "reshape", want, got)
	if _, ok := fastReshape.run(last, false, randDense(r, tensor.Float32, tensor.Shape{4, 6}), n.Shape()); ok {
		t.Fatal("reshape of other data kept its last value")
	}
}

// TestUnaryMatchesOp checks the executor's tanh and square bit for bit
// against Gorgonia's ops, with zeros, infinities and NaNs among the
// values.
func TestUnaryMatchesOp(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	ops := map[fastOp]func(*gorgonia.Node) (*gorgonia.Node, error){fastTanh: gorgonia.Tanh, fastSquare: gorgonia.Square}
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		for f, build := range ops {
			t.Run(fmt.Sprintf("%v/%d", dt, f), func(t *testing.T) {
				g := gorgonia.NewGraph()
				a := gorgonia.NewMatrix(g, dt, gorgonia.WithShape(6, 40))
				n := gorgonia.Must(build(a))
				if got := asFast(n.Op()); got != f {
					t.Fatalf("%v recognised as %d, want %d", n.Op(), got, f)
				}
				for range 10 {
					av := randDense(r, dt, tensor.Shape{6, 40})
					if dt == tensor.Float32 {
						d := av.Float32s()
						d[0], d[1], d[2], d[3] = float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 30
					} else {
						d := av.Float64s()
						d[0], d[1], d[2], d[3] = math.Inf(1), math.Inf(-1), math.NaN(), 30
					}
					want, err := n.Op().Do(av)
					if err != nil {
						t.Fatal(err)
					}
					got, ok := f.run(nil, false, av, n.Shape())
					if !ok {
						t.Fatal("not run by the executor")
					}
					if got, ok = f.run(got, true, av, n.Shape()); !ok {
						t.Fatal("not run by the executor into its last value")
					}
					requireSameBits(t, n.Op().String(), want, got)
				}
			})
		}
	}
}
