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

// TestMatMulUsePrealloc: written into a used tensor of the right shape, each
// mode's product is bitwise Do's; a tensor of another shape or dtype is left
// alone and a new one returned.
func TestMatMulUsePrealloc(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	val := func(r, c int) *tensor.Dense {
		v := make([]float64, r*c)
		for i := range v {
			v[i] = rng.NormFloat64()
		}
		return newDense(Float64, []int{r, c}, v)
	}
	for _, c := range []struct {
		mode mulMode
		a, b *tensor.Dense
	}{
		{mulNN, val(3, 5), val(5, 4)},
		{mulNT, val(3, 5), val(4, 5)},
		{mulTN, val(5, 3), val(5, 4)},
	} {
		op := matMul{c.mode}
		want, err := op.Do(c.a, c.b)
		require.NoError(t, err)
		used := val(3, 4) // the last run's values, to be overwritten
		got, err := op.UsePreallocDo(used, c.a, c.b)
		require.NoError(t, err)
		require.Same(t, used, got, "%v: written into the tensor given", c.mode)
		require.Equal(t, want.(*tensor.Dense).Data(), got.(*tensor.Dense).Data(), "%v", c.mode)

		other := val(4, 3)
		before := append([]float64(nil), other.Data().([]float64)...)
		got, err = op.UsePreallocDo(other, c.a, c.b)
		require.NoError(t, err)
		require.NotSame(t, other, got, "%v: a tensor of another shape is not used", c.mode)
		require.Equal(t, before, other.Data(), "%v: and is left alone", c.mode)
		require.Equal(t, want.(*tensor.Dense).Data(), got.(*tensor.Dense).Data(), "%v", c.mode)
	}
}
