package pipeline

// The executor runs Gorgonia's matrix products itself. Gorgonia's op goes
// through tensor.MatMul, which allocates a transposed access pattern, a
// function-option set and other small values on every call, and through
// gonum's Sgemm/Dgemm, which splits any product of at least four 64x64
// blocks of C into one goroutine per block: with a micro-batch of a few
// rows a stage runs hundreds of such products per micro-batch, each
// spawning and switching to 4 to 16 goroutines. runGemm computes the same
// blocks with the same kernels (gonum's, or for float32 a·b and aᵀ·b the
// same loops over an AVX2 axpy that rounds as gonum's does), one after the
// other on the calling goroutine, so the results are bitwise those of the
// op.

import (
	"reflect"
	"sync"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/internal/vec"
)

// gemmBlock and gemmMinParBlocks are gonum's block size and the number of
// blocks of C from which its Sgemm and Dgemm go parallel (blas/gonum,
// blockSize and minParBlock).
const (
	gemmBlock        = 64
	gemmMinParBlocks = 4
)

// matMul is a node whose op is Gorgonia's matrix product of two matrices,
// with either operand transposed.
type matMul struct {
	transA, transB bool
}

// matMulRef is the type and operator of the op of gorgonia.Mul on two
// matrices, against which compile recognises matrix products.
var matMulRef = sync.OnceValues(func() (reflect.Type, uint64) {
	g := gorgonia.NewGraph()
	a := gorgonia.NewMatrix(g, tensor.Float64, gorgonia.WithShape(2, 2))
	b := gorgonia.NewMatrix(g, tensor.Float64, gorgonia.WithShape(2, 2))
	c, err := gorgonia.Mul(a, b)
	if err != nil {
		return nil, 0
	}
	v := reflect.ValueOf(c.Op())
	f := v.FieldByName("āBinaryOperator")
	if !f.IsValid() || !f.CanUint() {
		return nil, 0
	}
	return v.Type(), f.Uint()
})

// asMatMul reports whether op is Gorgonia's matrix product of two matrices
// and which operands it transposes. Any other op, or a Gorgonia whose op
// has another layout, is run through op.Do.
func asMatMul(op gorgonia.Op) (matMul, bool) {
	typ, kind := matMulRef()
	if op == nil || typ == nil {
		return matMul{}, false
	}
	v := reflect.ValueOf(op)
	if v.Type() != typ {
		return matMul{}, false
	}
	f, ta, tb := v.FieldByName("āBinaryOperator"), v.FieldByName("transA"), v.FieldByName("transB")
	if !f.CanUint() || f.Uint() != kind || ta.Kind() != reflect.Bool || tb.Kind() != reflect.Bool {
		return matMul{}, false
	}
	return matMul{transA: ta.Bool(), transB: tb.Bool()}, true
}

// plainMatrix reports whether v is a dense row-major matrix that is
// neither a view nor transposed, with the standard engine: its data is
// its rows one after the other.
func plainMatrix(v gorgonia.Value) (*tensor.Dense, bool) {
	d, ok := plainDense(v)
	if !ok || d.Dims() != 2 {
		return nil, false
	}
	return d, true
}

// run computes a·b (each transposed as mm says) into dst, which it
// reuses if it has the product's shape and dtype and may be written
// (reuse), or else allocates. ok is false, and nothing is computed, when
// the operands are not plain float32 or float64 matrices of matching
// shapes, or when tensor uses another BLAS than gonum's: then the op runs
// as usual.
func (mm matMul) run(dst gorgonia.Value, reuse bool, a, b gorgonia.Value) (gorgonia.Value, bool) {
	ad, bd, m, n, k, ok := mm.operands(a, b)
	if !ok {
		return nil, false
	}
	ac, bc := ad.Shape()[1], bd.Shape()[1]
	var c *tensor.Dense
	if d, ok := plainMatrix(dst); reuse && ok && d.Dtype() == ad.Dtype() && d.Shape()[0] == m && d.Shape()[1] == n {
		c = d
	} else {
		c = tensor.New(tensor.Of(ad.Dtype()), tensor.WithShape(m, n))
	}
	if ad.Dtype() == tensor.Float32 {
		gemm32(mm.transA, mm.transB, m, n, k, ad.Float32s(), ac, bd.Float32s(), bc, c.Float32s(), n)
	} else {
		gemm64(mm.transA, mm.transB, m, n, k, ad.Float64s(), ac, bd.Float64s(), bc, c.Float64s(), n)
	}
	return c, true
}

// gemmScratch holds a strip of a product that gemmAdd32 or gemmAdd64 adds
// to a gradient; it grows to the largest strip and is then reused.
type gemmScratch struct {
	f32 []float32
	f64 []float64
}

// add adds a·b (each transposed as mm says) to dst, a []float32 or
// []float64 of the product's size, through scratch. ok is false, and dst
// is left as it is, when run would refuse the operands or dst does not
// fit the product: then the op runs as usual.
func (mm matMul) add(dst any, scratch *gemmScratch, a, b gorgonia.Value) bool {
	ad, bd, m, n, k, ok := mm.operands(a, b)
	if !ok {
		return false
	}
	rows := min(m, gemmBlock) * n
	// Float32s and Float64s, not Data, which allocates.
	if ad.Dtype() == tensor.Float32 {
		d, ok := dst.([]float32)
		if !ok || len(d) != m*n {
			return false
		}
		if len(scratch.f32) < rows {
			scratch.f32 = make([]float32, rows)
		}
		gemmAdd32(mm.transA, mm.transB, m, n, k, ad.Float32s(), ad.Shape()[1], bd.Float32s(), bd.Shape()[1], d, scratch.f32)
		return true
	}
	d, ok := dst.([]float64)
	if !ok || len(d) != m*n {
		return false
	}
	if len(scratch.f64) < rows {
		scratch.f64 = make([]float64, rows)
	}
	gemmAdd64(mm.transA, mm.transB, m, n, k, ad.Float64s(), ad.Shape()[1], bd.Float64s(), bd.Shape()[1], d, scratch.f64)
	return true
}

// operands checks that a and b are plain matrices of one float dtype
// whose product (transposed as mm says) is m x n with inner dimension k,
// and that tensor uses gonum's BLAS.
func (mm matMul) operands(a, b gorgonia.Value) (ad, bd *tensor.Dense, m, n, k int, ok bool) {
	if _, ok := tensor.WhichBLAS().(gonum.Implementation); !ok {
		return nil, nil, 0, 0, 0, false
	}
	if ad, ok = plainMatrix(a); !ok {
		return nil, nil, 0, 0, 0, false
	}
	if bd, ok = plainMatrix(b); !ok || ad.Dtype() != bd.Dtype() {
		return nil, nil, 0, 0, 0, false
	}
	if dt := ad.Dtype(); dt != tensor.Float32 && dt != tensor.Float64 {
		return nil, nil, 0, 0, 0, false
	}
	ar, ac := ad.Shape()[0], ad.Shape()[1]
	br, bc := bd.Shape()[0], bd.Shape()[1]
	m, k = ar, ac
	if mm.transA {
		m, k = ac, ar
	}
	kb := br
	n = bc
	if mm.transB {
		kb, n = bc, br
	}
	if k != kb {
		return nil, nil, 0, 0, 0, false
	}
	return ad, bd, m, n, k, true
}

// trans returns the BLAS flag of a transposed or plain operand.
func trans(t bool) blas.Transpose {
	if t {
		return blas.Trans
	}
	return blas.NoTrans
}

// gemm32 sets c = a·b (operands transposed as tA, tB say), as gonum's
// Sgemm with alpha 1 and beta 0 does and with the same bits, but on the
// calling goroutine: C is zeroed, and then each 64x64 block of C that
// Sgemm would hand to a goroutine gets the same serial kernel calls, in
// the same order along k.
func gemm32(tA, tB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
	gemm(sgemm, tA, tB, m, n, k, a, lda, b, ldb, c, ldc)
}

// gemm64 is gemm32 for float64 (gonum's Dgemm).
func gemm64(tA, tB bool, m, n, k int, a []float64, lda int, b []float64, ldb int, c []float64, ldc int) {
	gemm(dgemm, tA, tB, m, n, k, a, lda, b, ldb, c, ldc)
}

// gemmAdd32 adds a·b to dst (m x n, row-major) as gemm32 into a matrix
// and then addInto would, with the same bits, one strip of 64 rows of the
// product at a time through scratch (at least min(m, 64) x n): the
// product is never written out whole, and each strip is added while it is
// still in the cache.
func gemmAdd32(tA, tB bool, m, n, k int, a []float32, lda int, b []float32, ldb int, dst, scratch []float32) {
	gemmAdd(sgemm, vec.AddF32, tA, tB, m, n, k, a, lda, b, ldb, dst, scratch)
}

// gemmAdd64 is gemmAdd32 for float64.
func gemmAdd64(tA, tB bool, m, n, k int, a []float64, lda int, b []float64, ldb int, dst, scratch []float64) {
	gemmAdd(dgemm, vec.AddF64, tA, tB, m, n, k, a, lda, b, ldb, dst, scratch)
}

// serialGemm is gonum's serial product c += a·b (alpha and beta 1) for
// one element type: sgemm or dgemm.
type serialGemm[T float32 | float64] func(ta, tb blas.Transpose, m, n, k int, a []T, lda int, b []T, ldb int, c []T, ldc int)

func sgemm(ta, tb blas.Transpose, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
	switch {
	case ta == blas.NoTrans && tb == blas.NoTrans:
		sgemmNotNot(m, n, k, a, lda, b, ldb, c, ldc)
	case ta == blas.Trans && tb == blas.NoTrans:
		sgemmTransNot(m, n, k, a, lda, b, ldb, c, ldc)
	default:
		gonum.Implementation{}.Sgemm(ta, tb, m, n, k, 1, a, lda, b, ldb, 1, c, ldc)
	}
}

// sgemmNotNot and sgemmTransNot are gonum's serial Sgemm kernels for
// c += a·b and c += aᵀ·b (alpha and beta 1), loop for loop, with its
// float32 axpy replaced by vec.AxpyF32, which rounds the same way: the
// same bits, 2-3x faster with AVX2. (c += a·bᵀ goes through dot products,
// whose order of additions only gonum's kernel has; it and aᵀ·bᵀ stay
// gonum's.)
func sgemmNotNot(m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
	for i := range m {
		ci := c[i*ldc : i*ldc+n]
		for l, v := range a[i*lda : i*lda+k] {
			if v != 0 {
				vec.AxpyF32(v, b[l*ldb:l*ldb+n], ci)
			}
		}
	}
}

func sgemmTransNot(m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
	for l := range k {
		bl := b[l*ldb : l*ldb+n]
		for i, v := range a[l*lda : l*lda+m] {
			if v != 0 {
				vec.AxpyF32(v, bl, c[i*ldc:i*ldc+n])
			}
		}
	}
}

func dgemm(ta, tb blas.Transpose, m, n, k int, a []float64, lda int, b []float64, ldb int, c []float64, ldc int) {
	gonum.Implementation{}.Dgemm(ta, tb, m, n, k, 1, a, lda, b, ldb, 1, c, ldc)
}

// gemm is gemm32 and gemm64 with the kernel mul.
func gemm[T float32 | float64](mul serialGemm[T], tA, tB bool, m, n, k int, a []T, lda int, b []T, ldb int, c []T, ldc int) {
	for i := 0; i < m; i += gemmBlock {
		strip(mul, tA, tB, m, n, k, i, a, lda, b, ldb, c[i*ldc:], ldc)
	}
}

// gemmAdd is gemmAdd32 and gemmAdd64 with the kernel mul and the vector
// sum add.
func gemmAdd[T float32 | float64](mul serialGemm[T], add func(dst, src []T), tA, tB bool, m, n, k int, a []T, lda int, b []T, ldb int, dst, scratch []T) {
	for i := 0; i < m; i += gemmBlock {
		li := min(gemmBlock, m-i)
		strip(mul, tA, tB, m, n, k, i, a, lda, b, ldb, scratch, n)
		add(dst[i*n:(i+li)*n], scratch[:li*n])
	}
}

// strip computes rows [i, i+64) (or to m) of gemm's C into cs, which
// starts at row i, with leading dimension ldc.
func strip[T float32 | float64](mul serialGemm[T], tA, tB bool, m, n, k, i int, a []T, lda int, b []T, ldb int, cs []T, ldc int) {
	ta, tb := trans(tA), trans(tB)
	li := min(gemmBlock, m-i)
	if n == 0 {
		return
	}
	for r := range li {
		clear(cs[r*ldc : r*ldc+n])
	}
	if k == 0 {
		return
	}
	if blocks(m)*blocks(n) < gemmMinParBlocks {
		// Sgemm and Dgemm run the whole product serially, each row of C
		// on its own and along the whole of k; with beta 1 it adds to
		// the zeroed strip.
		mul(ta, tb, li, n, k, offset(a, tA, i, lda), lda, b, ldb, cs, ldc)
		return
	}
	for j := 0; j < n; j += gemmBlock {
		lj := min(gemmBlock, n-j)
		c := view(cs, ldc, 0, j, li, lj)
		for l := 0; l < k; l += gemmBlock {
			ll := min(gemmBlock, k-l)
			var as, bs []T
			if tA {
				as = view(a, lda, l, i, ll, li)
			} else {
				as = view(a, lda, i, l, li, ll)
			}
			if tB {
				bs = view(b, ldb, j, l, lj, ll)
			} else {
				bs = view(b, ldb, l, j, ll, lj)
			}
			// One block: fewer than four blocks, so the kernel runs it
			// serially, exactly as gonum's goroutine would.
			mul(ta, tb, li, lj, ll, as, lda, bs, ldb, c, ldc)
		}
	}
}

// offset returns a from row i of the product on: a's row i, or, if a is
// transposed, its column i.
func offset[T any](a []T, t bool, i, lda int) []T {
	if t {
		return a[i:]
	}
	return a[i*lda:]
}

// blocks is the number of gemmBlock-long blocks that cover dim.
func blocks(dim int) int { return (dim + gemmBlock - 1) / gemmBlock }

// view returns the r x c block of the row-major matrix a (leading
// dimension lda) whose top-left element is (i, j), as gonum slices it.
func view[T any](a []T, lda, i, j, r, c int) []T {
	return a[i*lda+j : (i+r-1)*lda+j+c]
}
