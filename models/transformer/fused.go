package transformer

import (
	"fmt"
	"hash"
	"math"

	"github.com/chewxy/hm"
	"github.com/chewxy/math32"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// A Decoder pass handles a few rows, so Gorgonia's fixed cost per operation
// (a node, an allocated result, a broadcast that copies its operand) weighs
// as much as the arithmetic. Its passes therefore compute a layer norm, a
// GELU and a bias added to every row each as one operation that does, row
// by row and element by element, the rounded floating-point operations the
// training graph's Gorgonia operations do, in the same order: the results
// are bitwise those of the unfused graph (fused_test.go checks it), so
// generation with a Decoder still gives Predictor's logits. They have no
// gradient; training uses the unfused graph.

// fusedKind is which sequence of Gorgonia operations a fusedOp computes.
type fusedKind uint8

const (
	fusedLayerNorm fusedKind = iota // inputs x [rows, n], gain [n], bias [n]: Stage.layerNorm
	fusedGELU                       // input x: Stage.gelu
	fusedAddRow                     // inputs x [rows, n], b [n]: x + b broadcast over rows
)

func (k fusedKind) String() string { return [...]string{"LayerNorm", "GELU", "AddRow"}[k] }

func (k fusedKind) arity() int { return [...]int{3, 1, 2}[k] }

// fusedOp is a forward-only operation of a Decoder pass; see above.
type fusedOp struct {
	kind fusedKind
	dt   tensor.Dtype
}

func fused(kind fusedKind, in ...*gorgonia.Node) (*gorgonia.Node, error) {
	return gorgonia.ApplyOp(fusedOp{kind, in[0].Dtype()}, in...)
}

func (op fusedOp) Arity() int { return op.kind.arity() }

// Type is matrix -> matrix for GELU, (matrix, vector, ...) -> matrix
// otherwise.
func (op fusedOp) Type() hm.Type {
	m := gorgonia.TensorType{Dims: 2, Of: op.dt}
	v := gorgonia.TensorType{Dims: 1, Of: op.dt}
	ts := []hm.Type{m}
	for range op.kind.arity() - 1 {
		ts = append(ts, v)
	}
	return hm.NewFnType(append(ts, m)...)
}

func (op fusedOp) InferShape(in ...gorgonia.DimSizer) (tensor.Shape, error) {
	s, ok := in[0].(tensor.Shape)
	if !ok || len(s) != 2 {
		return nil, fmt.Errorf("%w: %v of %v", ErrShape, op.kind, in[0])
	}
	for _, v := range in[1:] {
		if vs, ok := v.(tensor.Shape); !ok || vs.TotalSize() != s[1] {
			return nil, fmt.Errorf("%w: %v of %v with %v", ErrShape, op.kind, s, v)
		}
	}
	return s.Clone(), nil
}

func (op fusedOp) Do(in ...gorgonia.Value) (gorgonia.Value, error) {
	if len(in) != op.kind.arity() {
		return nil, fmt.Errorf("%w: %v of %d inputs", ErrShape, op.kind, len(in))
	}
	args := make([]*tensor.Dense, len(in))
	for i := range in {
		d, err := denseArg(in, i)
		if err != nil {
			return nil, err
		}
		args[i] = d
	}
	x := args[0]
	out := tensor.New(tensor.Of(x.Dtype()), tensor.WithShape(x.Shape().Clone()...))
	n := x.Shape()[1]
	for _, a := range args[1:] {
		if a.Shape().TotalSize() != n || a.Dtype() != x.Dtype() {
			return nil, fmt.Errorf("%w: %v of %v %v with %v %v", ErrShape, op.kind, x.Shape(), x.Dtype(), a.Shape(), a.Dtype())
		}
	}
	switch o := out.Data().(type) {
	case []float32:
		fusedRows(op.kind, o, floats32(args), n, math32.Sqrt, math32.Tanh)
	case []float64:
		fusedRows(op.kind, o, floats64(args), n, math.Sqrt, math.Tanh)
	default:
		return nil, fmt.Errorf("%w: %v of %v", ErrShape, op.kind, x.Dtype())
	}
	return out, nil
}

func floats32(ds []*tensor.Dense) [][]float32 {
	out := make([][]float32, len(ds))
	for i, d := range ds {
		out[i] = d.Data().([]float32)
	}
	return out
}

func floats64(ds []*tensor.Dense) [][]float64 {
	out := make([][]float64, len(ds))
	for i, d := range ds {
		out[i] = d.Data().([]float64)
	}
	return out
}

// fusedRows computes kind over every row of n elements of in[0] into out.
// Every intermediate result is rounded to T, as the graph stores it: the
// explicit conversions keep a multiply and an add from being fused into
// one instruction.
func fusedRows[T float](kind fusedKind, out []T, in [][]T, n int, sqrt, tanh func(T) T) {
	x := in[0]
	switch kind {
	case fusedAddRow:
		b := in[1]
		for r := 0; r < len(x); r += n {
			for j, v := range x[r : r+n] {
				out[r+j] = v + b[j]
			}
		}
	case fusedGELU:
		// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), as Stage.gelu.
		c1, c2, one, half := T(0.044715), T(math.Sqrt(2/math.Pi)), T(1), T(0.5)
		for i, v := range x {
			x3 := T(T(v*v) * v)
			inner := v + T(x3*c1)
			t := tanh(T(inner * c2))
			out[i] = T(T(v*(t+one)) * half)
		}
	case fusedLayerNorm:
		// As Stage.layerNorm: the mean (a sum in order, divided by n), the
		// centred row, the mean of its squares, sqrt(variance + 1e-5), the
		// quotient, times the gain, plus the bias.
		g, b := in[1], in[2]
		size, eps := T(n), T(1e-5)
		for r := 0; r < len(x); r += n {
			row, o := x[r:r+n], out[r:r+n]
			var sum T
			for _, v := range row {
				sum += v
			}
			mean := sum / size
			var sq T
			for j, v := range row {
				c := v - mean
				o[j] = c
				sq += T(c * c)
			}
			std := sqrt(sq/size + eps)
			for j, c := range o {
				o[j] = T(T(c/std)*g[j]) + b[j]
			}
		}
	}
}

func (op fusedOp) ReturnsPtr() bool     { return false }
func (op fusedOp) CallsExtern() bool    { return false }
func (op fusedOp) OverwritesInput() int { return -1 }
func (op fusedOp) WriteHash(h hash.Hash) {
	fmt.Fprintf(h, "gdist.transformer.fused{%v,%v}", op.kind, op.dt)
}
func (op fusedOp) Hashcode() uint32 { return opHash(op) }
func (op fusedOp) String() string   { return "Fused" + op.kind.String() }
