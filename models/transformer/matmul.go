package transformer

import (
	"fmt"
	"hash"

	"github.com/chewxy/hm"
	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/internal/matmul"
)

// mulMode is which product a matMul computes.
type mulMode uint8

const (
	mulNN mulMode = iota // a·b: the forward pass of x·W
	mulNT                // a·bᵀ: d loss/d x = dy·Wᵀ
	mulTN                // aᵀ·b: d loss/d W = xᵀ·dy
)

func (m mulMode) String() string { return [...]string{"NN", "NT", "TN"}[m] }

// matMul is the product of two matrices that gorgonia.Mul computes for x·W,
// and the two products of its gradient, with bitwise Gorgonia's results:
// NN and TN run internal/matmul (gonum's kernels over whole rows, 20 to 50
// % less CPU time than gonum's gemm on a layer's shapes), NT calls the
// tensor package's BLAS as Gorgonia does. If another BLAS was chosen with
// tensor.Use, every mode calls it.
type matMul struct{ mode mulMode }

// mul returns a·b (2-D) as a matMul node.
func mul(a, b *gorgonia.Node) (*gorgonia.Node, error) {
	return gorgonia.ApplyOp(matMul{mulNN}, a, b)
}

func (op matMul) Arity() int { return 2 }

func (op matMul) Type() hm.Type {
	a := hm.TypeVariable('a')
	return hm.NewFnType(a, a, a)
}

// dims returns m, k, n of the product of operands of shapes a and b.
func (op matMul) dims(a, b tensor.Shape) (m, k, n int, err error) {
	if len(a) != 2 || len(b) != 2 {
		return 0, 0, 0, fmt.Errorf("%w: %v product of %v and %v", ErrShape, op.mode, a, b)
	}
	var kb int
	switch op.mode {
	case mulNN:
		m, k, kb, n = a[0], a[1], b[0], b[1]
	case mulNT:
		m, k, n, kb = a[0], a[1], b[0], b[1]
	case mulTN:
		k, m, kb, n = a[0], a[1], b[0], b[1]
	}
	if k != kb {
		return 0, 0, 0, fmt.Errorf("%w: %v product of %v and %v", ErrShape, op.mode, a, b)
	}
	return m, k, n, nil
}

func (op matMul) InferShape(in ...gorgonia.DimSizer) (tensor.Shape, error) {
	if len(in) != 2 {
		return nil, fmt.Errorf("%w: %v product of %d inputs", ErrShape, op.mode, len(in))
	}
	a, ok1 := in[0].(tensor.Shape)
	b, ok2 := in[1].(tensor.Shape)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("%w: %v product of %v and %v", ErrShape, op.mode, in[0], in[1])
	}
	m, _, n, err := op.dims(a, b)
	if err != nil {
		return nil, err
	}
	return tensor.Shape{m, n}, nil
}

func (op matMul) Do(in ...gorgonia.Value) (gorgonia.Value, error) {
	return op.UsePreallocDo(nil, in...)
}

// UsePreallocDo writes the product into prealloc when it is a dense tensor
// of the product's shape and dtype (an executor that keeps each op's output
// from run to run), and into a new tensor otherwise; the result is bitwise
// Do's.
func (op matMul) UsePreallocDo(prealloc gorgonia.Value, in ...gorgonia.Value) (gorgonia.Value, error) {
	a, err := denseArg(in, 0)
	if err != nil {
		return nil, err
	}
	b, err := denseArg(in, 1)
	if err != nil {
		return nil, err
	}
	m, k, n, err := op.dims(a.Shape(), b.Shape())
	if err != nil {
		return nil, err
	}
	if a.Dtype() != b.Dtype() {
		return nil, fmt.Errorf("%w: %v product of %v and %v", ErrShape, op.mode, a.Dtype(), b.Dtype())
	}
	out, ok := prealloc.(*tensor.Dense)
	if !ok || out.Dtype() != a.Dtype() || !out.Shape().Eq(tensor.Shape{m, n}) || out.IsView() {
		out = tensor.New(tensor.Of(a.Dtype()), tensor.WithShape(m, n))
	} else {
		out.Zero()
	}
	return op.into(out, a, b, m, k, n)
}

// into sets out, zeroed, to the product of a and b.
func (op matMul) into(out *tensor.Dense, a, b *tensor.Dense, m, k, n int) (gorgonia.Value, error) {
	switch c := out.Data().(type) {
	case []float32:
		product(op.mode, c, a.Data().([]float32), b.Data().([]float32), m, k, n)
	case []float64:
		product(op.mode, c, a.Data().([]float64), b.Data().([]float64), m, k, n)
	default:
		return nil, fmt.Errorf("%w: %v product of %v", ErrShape, op.mode, a.Dtype())
	}
	return out, nil
}

// product sets c, a new (zeroed) slice, to the product of a and b in mode.
func product[T float32 | float64](mode mulMode, c, a, b []T, m, k, n int) {
	impl := tensor.WhichBLAS()
	if _, ok := impl.(gonum.Implementation); ok && mode != mulNT {
		if mode == mulNN {
			matmul.AddNN(c, a, b, m, k, n)
		} else {
			matmul.AddTN(c, a, b, m, k, n)
		}
		return
	}
	// As tensor.MatMul calls it for row-major operands.
	tA, tB, lda, ldb := blas.NoTrans, blas.NoTrans, k, n
	switch mode {
	case mulNT:
		tB, ldb = blas.Trans, k
	case mulTN:
		tA, lda = blas.Trans, m
	}
	switch c := any(c).(type) {
	case []float32:
		impl.Sgemm(tA, tB, m, n, k, 1, any(a).([]float32), lda, any(b).([]float32), ldb, 0, c, n)
	case []float64:
		impl.Dgemm(tA, tB, m, n, k, 1, any(a).([]float64), lda, any(b).([]float64), ldb, 0, c, n)
	}
}

func (op matMul) ReturnsPtr() bool      { return false }
func (op matMul) CallsExtern() bool     { return false }
func (op matMul) OverwritesInput() int  { return -1 }
func (op matMul) WriteHash(h hash.Hash) { fmt.Fprintf(h, "gdist.transformer.matMul{%v}", op.mode) }
func (op matMul) Hashcode() uint32      { return opHash(op) }
func (op matMul) String() string        { return "MatMul" + op.mode.String() }

func (op matMul) DiffWRT(int) []bool { return []bool{op.mode == mulNN, op.mode == mulNN} }

// SymDiff gives, for c = a·b, d a = dc·bᵀ and d b = aᵀ·dc: the products
// Gorgonia's own matrix product differentiates into. The gradient products
// are not differentiable themselves.
func (op matMul) SymDiff(inputs gorgonia.Nodes, output, grad *gorgonia.Node) (gorgonia.Nodes, error) {
	if op.mode != mulNN || len(inputs) != 2 {
		return nil, fmt.Errorf("%w: differentiating a %v product", ErrShape, op.mode)
	}
	da, err := gorgonia.ApplyOp(matMul{mulNT}, grad, inputs[1])
	if err != nil {
		return nil, err
	}
	db, err := gorgonia.ApplyOp(matMul{mulTN}, inputs[0], grad)
	if err != nil {
		return nil, err
	}
	return gorgonia.Nodes{da, db}, nil
}

var _ gorgonia.SDOp = matMul{}
