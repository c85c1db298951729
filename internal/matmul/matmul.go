// Package matmul multiplies dense row-major matrices with gonum's vector
// kernels, in an order that runs each kernel over a whole row and keeps a
// block of the result's rows in cache while the rows of b stream past. The
// products are bitwise those of gonum's Sgemm and Dgemm (the BLAS Gorgonia's
// tensor package uses by default) for the same operands: every element is
// accumulated over the shared dimension in the same sequence of rounded
// multiply-adds, only the order in which elements are visited differs. On
// the shapes of a transformer layer (1 to 64 rows, widths of 256 to 4096)
// they took 20 to 50 % less CPU time than gonum's gemm on the machine of
// BENCHMARKS.md: longer vectors per kernel call, no goroutine per block.
//
// # Usage
//
//	matmul.NN(c, a, b, m, k, n)    // c[m×n] = a[m×k]·b[k×n]
//	matmul.TN(c, a, b, m, k, n)    // c[m×n] = a[k×m]ᵀ·b[k×n]
//	matmul.AddNN(c, a, b, m, k, n) // c += a·b (on a zeroed c, NN without clearing it)
package matmul

import "gonum.org/v1/gonum/blas/gonum"

// Float is the element type of the matrices.
type Float interface{ float32 | float64 }

// cacheBytes is the size of the block of result rows kept in cache while
// b streams past: a quarter of a typical 1-2 MiB L2.
const cacheBytes = 256 << 10

// NN sets c = a·b: a is m×k, b is k×n, c is m×n, all row-major and
// contiguous (len(a) >= m*k, len(b) >= k*n, len(c) >= m*n). c must not
// overlap a or b. Each c[i][j] is ((0 + a[i][0]·b[0][j]) + a[i][1]·b[1][j])
// + ..., skipping the zero a[i][l], as gonum's NoTrans×NoTrans gemm.
func NN[T Float](c, a, b []T, m, k, n int) {
	check(c, a, b, m*n, m*k, k*n)
	clear(c[:m*n])
	AddNN(c, a, b, m, k, n)
}

// AddNN adds a·b to c, each element in NN's sequence of multiply-adds: on a
// c of zeros (freshly allocated memory) it is NN without clearing c.
func AddNN[T Float](c, a, b []T, m, k, n int) {
	check(c, a, b, m*n, m*k, k*n)
	addProduct(c, a, b, m, k, n, k, 1)
}

// TN sets c = aᵀ·b: a is k×m, b is k×n, c is m×n, all row-major and
// contiguous (len(a) >= k*m, len(b) >= k*n, len(c) >= m*n): the gradient
// of the weight of x·W is xᵀ·dy. c must not overlap a or b. Each c[i][j]
// is ((0 + a[0][i]·b[0][j]) + a[1][i]·b[1][j]) + ..., skipping the zero
// a[l][i], as gonum's Trans×NoTrans gemm.
func TN[T Float](c, a, b []T, m, k, n int) {
	check(c, a, b, m*n, k*m, k*n)
	clear(c[:m*n])
	AddTN(c, a, b, m, k, n)
}

// AddTN adds aᵀ·b to c, each element in TN's sequence of multiply-adds: on
// a c of zeros it is TN without clearing c.
func AddTN[T Float](c, a, b []T, m, k, n int) {
	check(c, a, b, m*n, k*m, k*n)
	addProduct(c, a, b, m, k, n, 1, m)
}

// addProduct adds A·b to c, A[i][l] being a[i*si+l*sl]: for each block of
// rb result rows, each row l of b in turn, added to every row i of the
// block times A[i][l] (skipped when zero, as gonum does).
func addProduct[T Float](c, a, b []T, m, k, n, si, sl int) {
	ax := axpy[T]()
	rb := rowBlock[T](n)
	for i0 := 0; i0 < m; i0 += rb {
		i1 := min(i0+rb, m)
		for l := range k {
			bl := b[l*n : (l+1)*n]
			for i := i0; i < i1; i++ {
				if v := a[i*si+l*sl]; v != 0 {
					ax(v, bl, c[i*n:(i+1)*n])
				}
			}
		}
	}
}

// rowBlock returns how many result rows of n elements fit in cacheBytes
// (at least 1).
func rowBlock[T Float](n int) int {
	var z T
	size := 8
	if any(z) == any(float32(0)) {
		size = 4
	}
	return max(1, cacheBytes/(size*max(n, 1)))
}

func check[T Float](c, a, b []T, nc, na, nb int) {
	if len(c) < nc || len(a) < na || len(b) < nb {
		panic("matmul: slice shorter than its matrix")
	}
}

// axpy returns y += alpha·x over len(y) elements: gonum's vectorised
// kernel, the one its gemm calls.
func axpy[T Float]() func(alpha T, x, y []T) {
	var z T
	switch any(z).(type) {
	case float32:
		f := func(alpha float32, x, y []float32) { gonum.Implementation{}.Saxpy(len(y), alpha, x, 1, y, 1) }
		return any(f).(func(T, []T, []T))
	default:
		f := func(alpha float64, x, y []float64) { gonum.Implementation{}.Daxpy(len(y), alpha, x, 1, y, 1) }
		return any(f).(func(T, []T, []T))
	}
}
