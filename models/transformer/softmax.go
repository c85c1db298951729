package transformer

import (
	"fmt"
	"hash"
	"hash/fnv"
	"math"

	"github.com/chewxy/hm"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// Gorgonia v0.9.18's SoftMax/LogSoftMax (tensor v0.9.24) shift every row by
// a maximum that includes the tensor's first element rather than the row's
// own maximum, so a row's output depends (in its last bits) on other rows,
// and therefore on the other sequences of a batch. These ops compute the
// softmax of each row of the last axis on its own, which keeps sequences
// independent and a pipeline's micro-batches bitwise equal to a full batch.

// rowSoftmax returns softmax (or log-softmax) over the last axis of x.
func rowSoftmax(x *gorgonia.Node, log bool) (*gorgonia.Node, error) {
	return gorgonia.ApplyOp(softmaxOp{log: log}, x)
}

// softmaxOp is softmax (log == false) or log-softmax over the last axis.
type softmaxOp struct{ log bool }

func (op softmaxOp) Arity() int { return 1 }

func (op softmaxOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	return hm.NewFnType(a, a)
}

func (op softmaxOp) InferShape(in ...gorgonia.DimSizer) (tensor.Shape, error) {
	s, ok := in[0].(tensor.Shape)
	if !ok || len(s) == 0 {
		return nil, fmt.Errorf("%w: softmax of %v", ErrShape, in[0])
	}
	return s.Clone(), nil
}

func (op softmaxOp) Do(in ...gorgonia.Value) (gorgonia.Value, error) {
	x, err := denseArg(in, 0)
	if err != nil {
		return nil, err
	}
	shape := x.Shape()
	n := shape[len(shape)-1]
	out := tensor.New(tensor.Of(x.Dtype()), tensor.WithShape(shape.Clone()...))
	switch xs := x.Data().(type) {
	case []float32:
		softmaxRows(out.Data().([]float32), xs, n, op.log)
	case []float64:
		softmaxRows(out.Data().([]float64), xs, n, op.log)
	default:
		return nil, fmt.Errorf("%w: softmax of %T", ErrShape, xs)
	}
	return out, nil
}

func (op softmaxOp) ReturnsPtr() bool     { return false }
func (op softmaxOp) CallsExtern() bool    { return false }
func (op softmaxOp) OverwritesInput() int { return -1 }
func (op softmaxOp) WriteHash(h hash.Hash) {
	fmt.Fprintf(h, "gdist.transformer.softmax{log=%t}", op.log)
}
func (op softmaxOp) Hashcode() uint32 { return opHash(op) }
func (op softmaxOp) String() string {
	if op.log {
		return "RowLogSoftmax"
	}
	return "RowSoftmax"
}

func (op softmaxOp) DiffWRT(inputs int) []bool { return []bool{true} }

func (op softmaxOp) SymDiff(inputs gorgonia.Nodes, output, grad *gorgonia.Node) (gorgonia.Nodes, error) {
	dx, err := gorgonia.ApplyOp(softmaxGradOp{log: op.log}, output, grad)
	if err != nil {
		return nil, err
	}
	return gorgonia.Nodes{dx}, nil
}

// softmaxGradOp computes the input gradient from the output y and its
// gradient dy, row by row over the last axis:
//
//	softmax:     dx = y ⊙ (dy − Σ dy⊙y)
//	log-softmax: dx = dy − exp(y) Σ dy
type softmaxGradOp struct{ log bool }

func (op softmaxGradOp) Arity() int { return 2 }

func (op softmaxGradOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	return hm.NewFnType(a, a, a)
}

func (op softmaxGradOp) InferShape(in ...gorgonia.DimSizer) (tensor.Shape, error) {
	s, ok := in[0].(tensor.Shape)
	if !ok || len(s) == 0 {
		return nil, fmt.Errorf("%w: softmax gradient of %v", ErrShape, in[0])
	}
	return s.Clone(), nil
}

func (op softmaxGradOp) Do(in ...gorgonia.Value) (gorgonia.Value, error) {
	y, err := denseArg(in, 0)
	if err != nil {
		return nil, err
	}
	dy, err := denseArg(in, 1)
	if err != nil {
		return nil, err
	}
	if !y.Shape().Eq(dy.Shape()) {
		return nil, fmt.Errorf("%w: softmax gradient %v vs %v", ErrShape, y.Shape(), dy.Shape())
	}
	shape := y.Shape()
	n := shape[len(shape)-1]
	out := tensor.New(tensor.Of(y.Dtype()), tensor.WithShape(shape.Clone()...))
	switch ys := y.Data().(type) {
	case []float32:
		dys, ok := dy.Data().([]float32)
		if !ok {
			return nil, fmt.Errorf("%w: mixed dtypes in softmax gradient", ErrShape)
		}
		softmaxGradRows(out.Data().([]float32), ys, dys, n, op.log)
	case []float64:
		dys, ok := dy.Data().([]float64)
		if !ok {
			return nil, fmt.Errorf("%w: mixed dtypes in softmax gradient", ErrShape)
		}
		softmaxGradRows(out.Data().([]float64), ys, dys, n, op.log)
	default:
		return nil, fmt.Errorf("%w: softmax gradient of %T", ErrShape, ys)
	}
	return out, nil
}

func (op softmaxGradOp) ReturnsPtr() bool     { return false }
func (op softmaxGradOp) CallsExtern() bool    { return false }
func (op softmaxGradOp) OverwritesInput() int { return -1 }
func (op softmaxGradOp) WriteHash(h hash.Hash) {
	fmt.Fprintf(h, "gdist.transformer.softmaxgrad{log=%t}", op.log)
}
func (op softmaxGradOp) Hashcode() uint32 { return opHash(op) }
func (op softmaxGradOp) String() string {
	if op.log {
		return "RowLogSoftmaxGrad"
	}
	return "RowSoftmaxGrad"
}

type hashWriter interface{ WriteHash(hash.Hash) }

func opHash(op hashWriter) uint32 {
	h := fnv.New32a()
	op.WriteHash(h)
	return h.Sum32()
}

// denseArg returns input i as a row-major dense tensor (materialising views).
func denseArg(in []gorgonia.Value, i int) (*tensor.Dense, error) {
	if i >= len(in) {
		return nil, fmt.Errorf("%w: missing input %d", ErrShape, i)
	}
	d, ok := in[i].(*tensor.Dense)
	if !ok {
		return nil, fmt.Errorf("%w: input %d is %T, want *tensor.Dense", ErrShape, i, in[i])
	}
	if d.IsView() || !d.DataOrder().IsRowMajor() {
		d = d.Materialize().(*tensor.Dense)
	}
	return d, nil
}

type float interface{ ~float32 | ~float64 }

// softmaxRows writes softmax (or log-softmax) of each n-long row of x to dst.
func softmaxRows[T float](dst, x []T, n int, log bool) {
	for r := 0; r+n <= len(x); r += n {
		row, out := x[r:r+n], dst[r:r+n]
		m := row[0]
		for _, v := range row[1:] {
			if v > m {
				m = v
			}
		}
		var sum float64
		for j, v := range row {
			e := math.Exp(float64(v - m))
			out[j] = T(e)
			sum += e
		}
		if log {
			ls := math.Log(sum)
			for j, v := range row {
				out[j] = T(float64(v-m) - ls)
			}
			continue
		}
		inv := 1 / sum
		for j := range out {
			out[j] = T(float64(out[j]) * inv)
		}
	}
}

// softmaxGradRows writes the input gradient of each n-long row to dst.
func softmaxGradRows[T float](dst, y, dy []T, n int, log bool) {
	for r := 0; r+n <= len(y); r += n {
		yr, dyr, out := y[r:r+n], dy[r:r+n], dst[r:r+n]
		var s float64
		if log {
			for _, g := range dyr {
				s += float64(g)
			}
			for j := range out {
				out[j] = T(float64(dyr[j]) - math.Exp(float64(yr[j]))*s)
			}
			continue
		}
		for j := range yr {
			s += float64(dyr[j]) * float64(yr[j])
		}
		for j := range out {
			out[j] = T(float64(yr[j]) * (float64(dyr[j]) - s))
		}
	}
}
