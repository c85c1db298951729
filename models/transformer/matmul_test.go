package transformer

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// TestMatMulBitwise: the product op and its gradients give bitwise what
// gorgonia.Mul gives, in both precisions, on shapes of gonum's serial and
// parallel paths.
func TestMatMulBitwise(t *testing.T) {
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		for _, s := range [][3]int{{1, 3, 2}, {5, 70, 9}, {64, 64, 64}, {66, 130, 200}, {2, 256, 1024}} {
			t.Run(fmt.Sprintf("%v/%dx%dx%d", dt, s[0], s[1], s[2]), func(t *testing.T) {
				ref := productAndGrads(t, dt, s, gorgonia.Mul)
				got := productAndGrads(t, dt, s, mul)
				for i := range ref {
					require.Equal(t, len(ref[i]), len(got[i]))
					for j := range ref[i] {
						if math.Float64bits(ref[i][j]) != math.Float64bits(got[i][j]) {
							t.Fatalf("value %d, element %d: %v, gorgonia.Mul gives %v", i, j, got[i][j], ref[i][j])
						}
					}
				}
			})
		}
	}
}

// productAndGrads builds y = f(x, w), loss = sum(y ⊙ r) and returns y, d
// loss/d x and d loss/d w after one run.
func productAndGrads(t *testing.T, dt tensor.Dtype, s [3]int, f func(a, b *gorgonia.Node) (*gorgonia.Node, error)) [][]float64 {
	m, k, n := s[0], s[1], s[2]
	rng := rand.New(rand.NewPCG(uint64(m), uint64(k*n)))
	val := func(shape ...int) *tensor.Dense {
		v := make([]float64, shape[0]*shape[1])
		for i := range v {
			v[i] = rng.NormFloat64()
			if rng.IntN(7) == 0 {
				v[i] = 0
			}
		}
		if dt == tensor.Float32 {
			return newDense(Float32, shape, v)
		}
		return newDense(Float64, shape, v)
	}
	g := gorgonia.NewGraph()
	x := gorgonia.NewMatrix(g, dt, gorgonia.WithShape(m, k), gorgonia.WithName("x"), gorgonia.WithValue(val(m, k)))
	w := gorgonia.NewMatrix(g, dt, gorgonia.WithShape(k, n), gorgonia.WithName("w"), gorgonia.WithValue(val(k, n)))
	r := gorgonia.NewMatrix(g, dt, gorgonia.WithShape(m, n), gorgonia.WithName("r"), gorgonia.WithValue(val(m, n)))
	y, err := f(x, w)
	require.NoError(t, err)
	loss, err := gorgonia.Sum(gorgonia.Must(gorgonia.HadamardProd(y, r)))
	require.NoError(t, err)
	grads, err := gorgonia.Grad(loss, x, w)
	require.NoError(t, err)
	var yv gorgonia.Value
	gorgonia.Read(y, &yv)
	vm := gorgonia.NewTapeMachine(g)
	defer vm.Close()
	require.NoError(t, vm.RunAll())
	var out [][]float64
	for _, v := range []gorgonia.Value{yv, grads[0].Value(), grads[1].Value()} {
		f, err := denseFloat64s(v.(*tensor.Dense))
		require.NoError(t, err)
		out = append(out, f)
	}
	return out
}
