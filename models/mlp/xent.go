package mlp

import (
	"errors"
	"fmt"
	"hash"
	"math"

	"github.com/chewxy/hm"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// Loss returns the mean softmax cross-entropy of logits (batch, classes)
// against targets y of the same shape (one-hot rows, or any rows of
// probabilities): -1/batch * sum_ij y_ij * logsoftmax(logits)_ij. It is one
// fused, numerically stable op (log-sum-exp with the row maximum
// subtracted, accumulated in float64) whose gradient with respect to logits
// is (softmax(logits) * rowsum(y) - y) / batch; y gets no gradient.
//
// Loss differentiates symbolically (gorgonia.Grad, TapeMachine) only.
func Loss(logits, y *gorgonia.Node) (*gorgonia.Node, error) {
	if logits.Dims() != 2 || !logits.Shape().Eq(y.Shape()) {
		return nil, fmt.Errorf("%w: loss of logits %v against targets %v: want equal (batch, classes) shapes",
			ErrShape, logits.Shape(), y.Shape())
	}
	if logits.Dtype() != y.Dtype() {
		return nil, fmt.Errorf("%w: loss of %v logits against %v targets", ErrShape, logits.Dtype(), y.Dtype())
	}
	return gorgonia.ApplyOp(xentOp{}, logits, y)
}

// xentOp is the fused mean softmax cross-entropy: (logits, y) -> scalar.
type xentOp struct{}

func (xentOp) Arity() int { return 2 }

func (xentOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	t := gorgonia.TensorType{Dims: 2, Of: a}
	return hm.NewFnType(t, t, a)
}

func (xentOp) InferShape(in ...gorgonia.DimSizer) (tensor.Shape, error) {
	return tensor.ScalarShape(), nil
}

func (xentOp) Do(in ...gorgonia.Value) (gorgonia.Value, error) {
	x, y, err := xentInputs(in[0], in[1])
	if err != nil {
		return nil, err
	}
	switch xd := x.Data().(type) {
	case []float32:
		return gorgonia.NewF32(float32(xentForward(xd, y.Data().([]float32), x.Shape()[1]))), nil
	case []float64:
		return gorgonia.NewF64(xentForward(xd, y.Data().([]float64), x.Shape()[1])), nil
	default:
		return nil, fmt.Errorf("mlp: loss: unsupported dtype %v", x.Dtype())
	}
}

func (xentOp) ReturnsPtr() bool      { return false }
func (xentOp) CallsExtern() bool     { return false }
func (xentOp) OverwritesInput() int  { return -1 }
func (xentOp) WriteHash(h hash.Hash) { fmt.Fprint(h, "mlp.SoftmaxXentMean") }
func (op xentOp) Hashcode() uint32   { return hashOf(op) }
func (xentOp) String() string        { return "SoftmaxXentMean" }

func (xentOp) DiffWRT(inputs int) []bool { return []bool{true, false} }

func (xentOp) SymDiff(inputs gorgonia.Nodes, output, grad *gorgonia.Node) (gorgonia.Nodes, error) {
	if len(inputs) != 2 {
		return nil, fmt.Errorf("mlp: loss gradient: %d inputs, want 2", len(inputs))
	}
	dx, err := gorgonia.ApplyOp(xentGradOp{}, inputs[0], inputs[1], grad)
	if err != nil {
		return nil, err
	}
	return gorgonia.Nodes{dx, nil}, nil
}

// xentGradOp computes d loss / d logits: (logits, y, upstream scalar) -> (batch, classes).
type xentGradOp struct{}

func (xentGradOp) Arity() int { return 3 }

func (xentGradOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	t := gorgonia.TensorType{Dims: 2, Of: a}
	return hm.NewFnType(t, t, a, t)
}

func (xentGradOp) InferShape(in ...gorgonia.DimSizer) (tensor.Shape, error) {
	s, ok := in[0].(tensor.Shape)
	if !ok {
		return nil, errors.New("mlp: loss gradient: input shape unknown")
	}
	return s.Clone(), nil
}

func (op xentGradOp) Do(in ...gorgonia.Value) (gorgonia.Value, error) {
	x, ok := in[0].(tensor.Tensor)
	if !ok {
		return nil, fmt.Errorf("mlp: loss gradient: logits are %T, want a tensor", in[0])
	}
	out := tensor.New(tensor.Of(x.Dtype()), tensor.WithShape(x.Shape().Clone()...))
	return op.UsePreallocDo(out, in...)
}

func (xentGradOp) UsePreallocDo(prealloc gorgonia.Value, in ...gorgonia.Value) (gorgonia.Value, error) {
	if len(in) != 3 {
		return nil, fmt.Errorf("mlp: loss gradient: %d inputs, want 3", len(in))
	}
	x, y, err := xentInputs(in[0], in[1])
	if err != nil {
		return nil, err
	}
	g, err := scalarOf(in[2])
	if err != nil {
		return nil, err
	}
	dst, ok := prealloc.(tensor.Tensor)
	if !ok || !dst.Shape().Eq(x.Shape()) || dst.Dtype() != x.Dtype() {
		return nil, fmt.Errorf("mlp: loss gradient: bad destination %v", prealloc)
	}
	classes := x.Shape()[1]
	switch xd := x.Data().(type) {
	case []float32:
		xentBackward(dst.Data().([]float32), xd, y.Data().([]float32), classes, g)
	case []float64:
		xentBackward(dst.Data().([]float64), xd, y.Data().([]float64), classes, g)
	default:
		return nil, fmt.Errorf("mlp: loss gradient: unsupported dtype %v", x.Dtype())
	}
	return dst, nil
}

func (xentGradOp) ReturnsPtr() bool      { return false }
func (xentGradOp) CallsExtern() bool     { return false }
func (xentGradOp) OverwritesInput() int  { return -1 }
func (xentGradOp) WriteHash(h hash.Hash) { fmt.Fprint(h, "mlp.SoftmaxXentMeanGrad") }
func (op xentGradOp) Hashcode() uint32   { return hashOf(op) }
func (xentGradOp) String() string        { return "SoftmaxXentMeanGrad" }

// xentInputs checks that logits and targets are dense (batch, classes)
// tensors of one shape and dtype.
func xentInputs(a, b gorgonia.Value) (x, y tensor.Tensor, err error) {
	x, okx := a.(tensor.Tensor)
	y, oky := b.(tensor.Tensor)
	if !okx || !oky {
		return nil, nil, fmt.Errorf("mlp: loss: inputs are %T and %T, want tensors", a, b)
	}
	if x.Dims() != 2 || !x.Shape().Eq(y.Shape()) || x.Dtype() != y.Dtype() {
		return nil, nil, fmt.Errorf("%w: loss of %v %v against %v %v", ErrShape, x.Shape(), x.Dtype(), y.Shape(), y.Dtype())
	}
	if !x.IsNativelyAccessible() || x.RequiresIterator() || y.RequiresIterator() {
		return nil, nil, errors.New("mlp: loss: inputs must be contiguous dense tensors")
	}
	return x, y, nil
}

// scalarOf returns the value of a scalar or one-element tensor.
func scalarOf(v gorgonia.Value) (float64, error) {
	switch s := v.(type) {
	case *gorgonia.F32:
		return float64(*s), nil
	case *gorgonia.F64:
		return float64(*s), nil
	case tensor.Tensor:
		if s.Size() == 1 {
			switch d := s.Data().(type) {
			case float32:
				return float64(d), nil
			case float64:
				return d, nil
			case []float32:
				return float64(d[0]), nil
			case []float64:
				return d[0], nil
			}
		}
	}
	return 0, fmt.Errorf("mlp: loss gradient: upstream gradient %T is not a float scalar", v)
}

// xentForward returns the mean over rows of -sum_j y_j * logsoftmax(x)_j.
func xentForward[T float32 | float64](x, y []T, classes int) float64 {
	rows := len(x) / classes
	if rows == 0 {
		return 0
	}
	var total float64
	for r := range rows {
		xr, yr := x[r*classes:(r+1)*classes], y[r*classes:(r+1)*classes]
		lse := logSumExp(xr)
		for j, v := range xr {
			if yr[j] != 0 {
				total += float64(yr[j]) * (lse - float64(v))
			}
		}
	}
	return total / float64(rows)
}

// xentBackward writes g/rows * (softmax(x)*sum(y) - y) into dst.
func xentBackward[T float32 | float64](dst, x, y []T, classes int, g float64) {
	rows := len(x) / classes
	if rows == 0 {
		return
	}
	scale := g / float64(rows)
	for r := range rows {
		xr, yr, dr := x[r*classes:(r+1)*classes], y[r*classes:(r+1)*classes], dst[r*classes:(r+1)*classes]
		lse := logSumExp(xr)
		var ysum float64
		for _, v := range yr {
			ysum += float64(v)
		}
		for j, v := range xr {
			dr[j] = T(scale * (math.Exp(float64(v)-lse)*ysum - float64(yr[j])))
		}
	}
}

// logSumExp returns log(sum(exp(x))) computed stably.
func logSumExp[T float32 | float64](x []T) float64 {
	m := math.Inf(-1)
	for _, v := range x {
		m = max(m, float64(v))
	}
	if math.IsInf(m, 0) {
		return m
	}
	var s float64
	for _, v := range x {
		s += math.Exp(float64(v) - m)
	}
	return m + math.Log(s)
}
