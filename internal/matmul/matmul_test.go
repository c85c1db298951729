package matmul

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// shapes cover gonum's serial path (fewer than 4 blocks of 64), its
// parallel path with partial blocks, a single row or column, and the widths
// of a transformer layer.
var shapes = [][3]int{
	{1, 1, 1}, {1, 7, 3}, {3, 1, 5}, {2, 3, 1}, {5, 130, 9}, {64, 64, 64}, {65, 129, 130},
	{1, 1024, 512}, {4, 256, 1024}, {8, 1024, 256}, {130, 70, 200}, {64, 300, 1100},
}

func fill[T Float](rng *rand.Rand, n int, zeros bool) []T {
	x := make([]T, n)
	for i := range x {
		x[i] = T(rng.NormFloat64())
		if zeros && rng.IntN(5) == 0 {
			x[i] = 0 // gonum skips these: so must NN and TN
		}
	}
	return x
}

func same[T Float](t *testing.T, what string, want, got []T) {
	t.Helper()
	for i := range want {
		w, g := float64(want[i]), float64(got[i])
		if math.Float64bits(w) != math.Float64bits(g) && !(math.IsNaN(w) && math.IsNaN(g)) {
			t.Fatalf("%s: element %d is %v, gonum gives %v", what, i, g, w)
		}
	}
}

// gemm sets c = op(a)·b with gonum.
func gemm[T Float](tA blas.Transpose, m, n, k int, a []T, lda int, b []T, c []T) {
	gemmBeta(tA, m, n, k, a, lda, b, 0, c)
}

// gemmAdd sets c += op(a)·b with gonum.
func gemmAdd[T Float](tA blas.Transpose, m, n, k int, a []T, lda int, b []T, c []T) {
	gemmBeta(tA, m, n, k, a, lda, b, 1, c)
}

func gemmBeta[T Float](tA blas.Transpose, m, n, k int, a []T, lda int, b []T, beta float64, c []T) {
	switch a := any(a).(type) {
	case []float32:
		gonum.Implementation{}.Sgemm(tA, blas.NoTrans, m, n, k, 1, a, lda, any(b).([]float32), n, float32(beta), any(c).([]float32), n)
	case []float64:
		gonum.Implementation{}.Dgemm(tA, blas.NoTrans, m, n, k, 1, a, lda, any(b).([]float64), n, beta, any(c).([]float64), n)
	}
}

func testBitwise[T Float](t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, s := range shapes {
		m, k, n := s[0], s[1], s[2]
		for _, zeros := range []bool{false, true} {
			name := fmt.Sprintf("%T %dx%dx%d zeros=%v", T(0), m, k, n, zeros)
			a, b := fill[T](rng, m*k, zeros), fill[T](rng, k*n, false)
			if zeros && len(b) > 2 {
				b[1] = T(math.Inf(1)) // 0·Inf would be NaN: skipped, as gonum does
			}
			want, got := make([]T, m*n), fill[T](rng, m*n, false) // got starts dirty
			gemm(blas.NoTrans, m, n, k, a, k, b, want)
			NN(got, a, b, m, k, n)
			same(t, "NN "+name, want, got)
			// TN: a is k×m.
			at := fill[T](rng, k*m, zeros)
			gemm(blas.Trans, m, n, k, at, m, b, want)
			TN(got, at, b, m, k, n)
			same(t, "TN "+name, want, got)
			// AddNN and AddTN accumulate onto what c holds, as gonum's gemm
			// with beta = 1.
			c0 := fill[T](rng, m*n, false)
			copy(want, c0)
			copy(got, c0)
			gemmAdd(blas.NoTrans, m, n, k, a, k, b, want)
			AddNN(got, a, b, m, k, n)
			same(t, "AddNN "+name, want, got)
			copy(want, c0)
			copy(got, c0)
			gemmAdd(blas.Trans, m, n, k, at, m, b, want)
			AddTN(got, at, b, m, k, n)
			same(t, "AddTN "+name, want, got)
		}
	}
}

// TestBitwiseGonum: NN, TN, AddNN and AddTN give gonum's bits, zeros and
// infinities included, in both precisions.
func TestBitwiseGonum(t *testing.T) {
	testBitwise[float32](t)
	testBitwise[float64](t)
}

// TestShortSlice: a slice shorter than its matrix panics before anything
// is written.
func TestShortSlice(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	NN(make([]float32, 3), make([]float32, 4), make([]float32, 4), 2, 2, 2)
}

// BenchmarkProducts compares NN and TN with gonum's gemm on the shapes of
// a transformer layer: x·W for one row, 4 rows and 64 rows, and the weight
// gradient xᵀ·dy of 64 rows.
func BenchmarkProducts(b *testing.B) {
	for _, c := range []struct {
		tA      blas.Transpose
		m, k, n int
	}{{blas.NoTrans, 1, 1024, 512}, {blas.NoTrans, 4, 256, 1024}, {blas.NoTrans, 64, 1024, 2048},
		{blas.Trans, 1024, 64, 2048}, {blas.Trans, 2048, 64, 1024}} {
		rng := rand.New(rand.NewPCG(1, 2))
		a, w, out := fill[float32](rng, c.m*c.k, false), fill[float32](rng, c.k*c.n, false), make([]float32, c.m*c.n)
		lda, ours, name := c.k, NN[float32], "NN"
		if c.tA == blas.Trans {
			lda, ours, name = c.m, TN[float32], "TN"
		}
		shape := fmt.Sprintf("%dx%dx%d", c.m, c.k, c.n)
		b.Run("gonum-"+name+"/"+shape, func(b *testing.B) {
			for range b.N {
				gemm(c.tA, c.m, c.n, c.k, a, lda, w, out)
			}
		})
		b.Run(name+"/"+shape, func(b *testing.B) {
			for range b.N {
				ours(out, a, w, c.m, c.k, c.n)
			}
		})
	}
}
