package tp

import (
	"context"
	"fmt"
	"hash"
	"hash/fnv"
	"math"

	"github.com/chewxy/hm"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
)

// CrossEntropy is the vocabulary-parallel cross-entropy (Megatron's
// vocab_parallel_cross_entropy): logits is this member's part [N, part] of
// the logits, targets the same part of the one-hot targets (zero rows where
// the target lies in another member's part), and the result, the same
// scalar on every member, is the mean over the N rows of
// log Σ exp(logits) − logits[target], the sums running over the whole
// vocabulary. No member ever holds the whole logits: the forward pass
// all-reduces, per row, the maximum and the sum of exponentials (two
// vectors of N) and the picked logit (one more); the gradient of this
// member's logits, softmax − one-hot over N, is computed locally.
func CrossEntropy(g *dist.ProcessGroup, logits, targets *gorgonia.Node) (*gorgonia.Node, error) {
	if g == nil || logits == nil || targets == nil {
		return nil, fmt.Errorf("tp: cross-entropy: nil argument: %w", ErrInvalidArgument)
	}
	if logits.Dims() != 2 || !logits.Shape().Eq(targets.Shape()) {
		return nil, fmt.Errorf("tp: cross-entropy: logits %v, targets %v: %w", logits.Shape(), targets.Shape(), ErrInvalidArgument)
	}
	lse, err := gorgonia.ApplyOp(&logSumExpOp{g: g, id: nextID.Add(1)}, logits)
	if err != nil {
		return nil, fmt.Errorf("tp: cross-entropy: %w", err)
	}
	picked, err := gorgonia.Sum(gorgonia.Must(gorgonia.HadamardProd(targets, logits)), 1)
	if err != nil {
		return nil, fmt.Errorf("tp: cross-entropy: %w", err)
	}
	if picked, err = Reduce(g, picked); err != nil {
		return nil, err
	}
	diff, err := gorgonia.Sub(lse, picked)
	if err != nil {
		return nil, fmt.Errorf("tp: cross-entropy: %w", err)
	}
	loss, err := gorgonia.Mean(diff)
	if err != nil {
		return nil, fmt.Errorf("tp: cross-entropy: %w", err)
	}
	return loss, nil
}

// logSumExpOp maps [N, part] logits to the [N] row-wise log-sum-exp over
// the whole vocabulary: an all-reduce of the row maxima, then of the sums
// of exponentials.
type logSumExpOp struct {
	g  *dist.ProcessGroup
	id uint64
}

func (op *logSumExpOp) Arity() int { return 1 }

func (op *logSumExpOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	return hm.NewFnType(gorgonia.TensorType{Dims: 2, Of: a}, gorgonia.TensorType{Dims: 1, Of: a})
}

func (op *logSumExpOp) InferShape(in ...gorgonia.DimSizer) (tensor.Shape, error) {
	s, ok := in[0].(tensor.Shape)
	if !ok || len(s) != 2 {
		return nil, fmt.Errorf("tp: log-sum-exp of %v: %w", in[0], ErrInvalidArgument)
	}
	return tensor.Shape{s[0]}, nil
}

func (op *logSumExpOp) Do(in ...gorgonia.Value) (gorgonia.Value, error) {
	x, err := dense(in[0])
	if err != nil {
		return nil, err
	}
	rows, cols := x.Shape()[0], x.Shape()[1]
	switch d := x.Data().(type) {
	case []float64:
		return logSumExp(op.g, d, rows, cols)
	case []float32:
		return logSumExp(op.g, d, rows, cols)
	}
	return nil, fmt.Errorf("tp: log-sum-exp of %v: %w", x.Dtype(), dist.ErrUnsupportedDType)
}

func dense(v gorgonia.Value) (*tensor.Dense, error) {
	x, ok := v.(*tensor.Dense)
	if !ok {
		return nil, fmt.Errorf("tp: input of type %T: %w", v, dist.ErrUnsupportedDType)
	}
	if x.RequiresIterator() {
		x = x.Materialize().(*tensor.Dense)
	}
	return x, nil
}

func logSumExp[T float](g *dist.ProcessGroup, x []T, rows, cols int) (*tensor.Dense, error) {
	ctx := context.Background()
	m := make([]float64, rows)
	for i := range rows {
		m[i] = math.Inf(-1)
		for _, v := range x[i*cols : (i+1)*cols] {
			m[i] = max(m[i], float64(v))
		}
	}
	if err := g.AllReduce(ctx, dist.F64(m), dist.Max); err != nil {
		return nil, fmt.Errorf("tp: cross-entropy maximum: %w", err)
	}
	s := make([]float64, rows)
	for i := range rows {
		for _, v := range x[i*cols : (i+1)*cols] {
			s[i] += math.Exp(float64(v) - m[i])
		}
	}
	if err := g.AllReduce(ctx, dist.F64(s), dist.Sum); err != nil {
		return nil, fmt.Errorf("tp: cross-entropy sum: %w", err)
	}
	out := make([]T, rows)
	for i := range rows {
		out[i] = T(m[i] + math.Log(s[i]))
	}
	return tensor.New(tensor.WithShape(rows), tensor.WithBacking(out)), nil
}

func (op *logSumExpOp) ReturnsPtr() bool      { return false }
func (op *logSumExpOp) CallsExtern() bool     { return false }
func (op *logSumExpOp) OverwritesInput() int  { return -1 }
func (op *logSumExpOp) WriteHash(h hash.Hash) { fmt.Fprintf(h, "gdist.tp.logsumexp#%d", op.id) }
func (op *logSumExpOp) Hashcode() uint32 {
	h := fnv.New32a()
	op.WriteHash(h)
	return h.Sum32()
}
func (op *logSumExpOp) String() string     { return fmt.Sprintf("tp.LogSumExp#%d", op.id) }
func (op *logSumExpOp) DiffWRT(int) []bool { return []bool{true} }

// SymDiff: d lse_i / d x_ij = exp(x_ij − lse_i), local to each member.
func (op *logSumExpOp) SymDiff(inputs gorgonia.Nodes, output, grad *gorgonia.Node) (gorgonia.Nodes, error) {
	dx, err := gorgonia.ApplyOp(softmaxGradOp{}, inputs[0], output, grad)
	if err != nil {
		return nil, err
	}
	return gorgonia.Nodes{dx}, nil
}

// softmaxGradOp computes exp(x − lse) ⊙ dlse broadcast over each row.
type softmaxGradOp struct{}

func (softmaxGradOp) Arity() int { return 3 }

func (softmaxGradOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	m, v := gorgonia.TensorType{Dims: 2, Of: a}, gorgonia.TensorType{Dims: 1, Of: a}
	return hm.NewFnType(m, v, v, m)
}

func (softmaxGradOp) InferShape(in ...gorgonia.DimSizer) (tensor.Shape, error) {
	s, ok := in[0].(tensor.Shape)
	if !ok || len(s) != 2 {
		return nil, fmt.Errorf("tp: softmax gradient of %v: %w", in[0], ErrInvalidArgument)
	}
	return s.Clone(), nil
}

func (softmaxGradOp) Do(in ...gorgonia.Value) (gorgonia.Value, error) {
	var ts [3]*tensor.Dense
	for i := range ts {
		d, err := dense(in[i])
		if err != nil {
			return nil, err
		}
		ts[i] = d
	}
	rows, cols := ts[0].Shape()[0], ts[0].Shape()[1]
	switch x := ts[0].Data().(type) {
	case []float64:
		return softmaxGrad(x, ts[1].Data().([]float64), ts[2].Data().([]float64), rows, cols), nil
	case []float32:
		return softmaxGrad(x, ts[1].Data().([]float32), ts[2].Data().([]float32), rows, cols), nil
	}
	return nil, fmt.Errorf("tp: softmax gradient of %v: %w", ts[0].Dtype(), dist.ErrUnsupportedDType)
}

func softmaxGrad[T float](x, lse, dl []T, rows, cols int) *tensor.Dense {
	out := make([]T, rows*cols)
	for i := range rows {
		for j := range cols {
			out[i*cols+j] = T(math.Exp(float64(x[i*cols+j])-float64(lse[i])) * float64(dl[i]))
		}
	}
	return tensor.New(tensor.WithShape(rows, cols), tensor.WithBacking(out))
}

func (softmaxGradOp) ReturnsPtr() bool      { return false }
func (softmaxGradOp) CallsExtern() bool     { return false }
func (softmaxGradOp) OverwritesInput() int  { return -1 }
func (softmaxGradOp) WriteHash(h hash.Hash) { fmt.Fprint(h, "gdist.tp.softmaxgrad") }
func (op softmaxGradOp) Hashcode() uint32 {
	h := fnv.New32a()
	op.WriteHash(h)
	return h.Sum32()
}
func (softmaxGradOp) String() string { return "tp.SoftmaxGrad" }
