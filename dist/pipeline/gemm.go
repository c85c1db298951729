package pipeline

// The executor runs Gorgonia's matrix products itself. Gorgonia's op goes
// through tensor.MatMul, which allocates a transposed access pattern, a
// function-option set and other small values on every call, and through
// gonum's Sgemm/Dgemm, which splits any product of at least four 64x64
// blocks of C into one goroutine per block: with a micro-batch of a few
// rows a stage runs hundreds of such products per micro-batch, each
// spawning and switching to 4 to 16 goroutines. runGemm computes the same
// blocks with the same gonum kernels, one after the other on the calling
// goroutine, so the results are bitwise those of the op.

import (
	"reflect"
	"sync"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
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
	d, ok := v.(*tensor.Dense)
	if !ok || d.Dims() != 2 || d.IsMaterializable() || !d.DataOrder().IsRowMajor() {
		return nil, false
	}
	if _, ok := d.Engine().(tensor.StdEng); !ok {
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
	if _, ok := tensor.WhichBLAS().(gonum.Implementation); !ok {
		return nil, false
	}
	ad, ok := plainMatrix(a)
	if !ok {
		return nil, false
	}
	bd, ok := plainMatrix(b)
	if !ok || ad.Dtype() != bd.Dtype() {
		return nil, false
	}
	ar, ac := ad.Shape()[0], ad.Shape()[1]
	br, bc := bd.Shape()[0], bd.Shape()[1]
	m, k := ar, ac
	if mm.transA {
		m, k = ac, ar
	}
	kb, n := br, bc
	if mm.transB {
		kb, n = bc, br
	}
	if k != kb {
		return nil, false
	}
	var c *tensor.Dense
	if d, ok := plainMatrix(dst); reuse && ok && d.Dtype() == ad.Dtype() && d.Shape()[0] == m && d.Shape()[1] == n {
		c = d
	} else {
		c = tensor.New(tensor.Of(ad.Dtype()), tensor.WithShape(m, n))
	}
	switch A := ad.Data().(type) {
	case []float32:
		gemm32(mm.transA, mm.transB, m, n, k, A, ac, bd.Data().([]float32), bc, c.Data().([]float32), n)
	case []float64:
		gemm64(mm.transA, mm.transB, m, n, k, A, ac, bd.Data().([]float64), bc, c.Data().([]float64), n)
	default:
		return nil, false
	}
	return c, true
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
	var impl gonum.Implementation
	ta, tb := trans(tA), trans(tB)
	if m == 0 || n == 0 {
		return
	}
	for i := range m {
		clear(c[i*ldc : i*ldc+n])
	}
	if k == 0 {
		return
	}
	if blocks(m)*blocks(n) < gemmMinParBlocks {
		// Sgemm runs the whole product serially; with beta 1 it leaves the
		// zeroed C as it is.
		impl.Sgemm(ta, tb, m, n, k, 1, a, lda, b, ldb, 1, c, ldc)
		return
	}
	for i := 0; i < m; i += gemmBlock {
		li := min(gemmBlock, m-i)
		for j := 0; j < n; j += gemmBlock {
			lj := min(gemmBlock, n-j)
			cs := view32(c, ldc, i, j, li, lj)
			for l := 0; l < k; l += gemmBlock {
				ll := min(gemmBlock, k-l)
				var as, bs []float32
				if tA {
					as = view32(a, lda, l, i, ll, li)
				} else {
					as = view32(a, lda, i, l, li, ll)
				}
				if tB {
					bs = view32(b, ldb, j, l, lj, ll)
				} else {
					bs = view32(b, ldb, l, j, ll, lj)
				}
				// One block: fewer than four blocks, so Sgemm runs it
				// serially, exactly as its goroutine would.
				impl.Sgemm(ta, tb, li, lj, ll, 1, as, lda, bs, ldb, 1, cs, ldc)
			}
		}
	}
}

// gemm64 is gemm32 for float64 (gonum's Dgemm).
func gemm64(tA, tB bool, m, n, k int, a []float64, lda int, b []float64, ldb int, c []float64, ldc int) {
	var impl gonum.Implementation
	ta, tb := trans(tA), trans(tB)
	if m == 0 || n == 0 {
		return
	}
	for i := range m {
		clear(c[i*ldc : i*ldc+n])
	}
	if k == 0 {
		return
	}
	if blocks(m)*blocks(n) < gemmMinParBlocks {
		impl.Dgemm(ta, tb, m, n, k, 1, a, lda, b, ldb, 1, c, ldc)
		return
	}
	for i := 0; i < m; i += gemmBlock {
		li := min(gemmBlock, m-i)
		for j := 0; j < n; j += gemmBlock {
			lj := min(gemmBlock, n-j)
			cs := view64(c, ldc, i, j, li, lj)
			for l := 0; l < k; l += gemmBlock {
				ll := min(gemmBlock, k-l)
				var as, bs []float64
				if tA {
					as = view64(a, lda, l, i, ll, li)
				} else {
					as = view64(a, lda, i, l, li, ll)
				}
				if tB {
					bs = view64(b, ldb, j, l, lj, ll)
				} else {
					bs = view64(b, ldb, l, j, ll, lj)
				}
				impl.Dgemm(ta, tb, li, lj, ll, 1, as, lda, bs, ldb, 1, cs, ldc)
			}
		}
	}
}

// blocks is the number of gemmBlock-long blocks that cover dim.
func blocks(dim int) int { return (dim + gemmBlock - 1) / gemmBlock }

// view32 returns the r x c block of the row-major matrix a (leading
// dimension lda) whose top-left element is (i, j), as gonum slices it.
func view32(a []float32, lda, i, j, r, c int) []float32 {
	return a[i*lda+j : (i+r-1)*lda+j+c]
}

// view64 is view32 for float64.
func view64(a []float64, lda, i, j, r, c int) []float64 {
	return a[i*lda+j : (i+r-1)*lda+j+c]
}
