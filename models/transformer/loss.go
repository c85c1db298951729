package transformer

import (
	"fmt"
	"math"
	"math/rand/v2"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// CrossEntropy returns the mean next-token cross-entropy (in nats) of logits
// [N, Vocab] against one-hot targets [N, Vocab]: -1/N Σ targets ⊙
// log_softmax(logits). The result is a scalar node.
func CrossEntropy(logits, targets *gorgonia.Node) (*gorgonia.Node, error) {
	if !logits.Shape().Eq(targets.Shape()) || logits.Dims() != 2 {
		return nil, fmt.Errorf("%w: logits %v, targets %v", ErrShape, logits.Shape(), targets.Shape())
	}
	logp, err := rowSoftmax(logits, true)
	if err != nil {
		return nil, fmt.Errorf("transformer: cross-entropy: %w", err)
	}
	picked, err := gorgonia.HadamardProd(targets, logp)
	if err != nil {
		return nil, fmt.Errorf("transformer: cross-entropy: %w", err)
	}
	sum, err := gorgonia.Sum(picked)
	if err != nil {
		return nil, fmt.Errorf("transformer: cross-entropy: %w", err)
	}
	scale := -1 / float64(logits.Shape()[0])
	var c *gorgonia.Node
	if logits.Dtype() == tensor.Float32 {
		c = gorgonia.NewConstant(float32(scale))
	} else {
		c = gorgonia.NewConstant(scale)
	}
	loss, err := gorgonia.HadamardProd(sum, c)
	if err != nil {
		return nil, fmt.Errorf("transformer: cross-entropy: %w", err)
	}
	return loss, nil
}

// Surrogate returns the scalar Σ out ⊙ grad. Its gradient with respect to
// anything upstream of out is the vector-Jacobian product of out with grad,
// so a pipeline stage that receives dLoss/d(out) from the next stage (as the
// value of the input node grad, same shape as out) can call
// gorgonia.Grad(Surrogate(out, grad), params...) to backpropagate it.
func Surrogate(out, grad *gorgonia.Node) (*gorgonia.Node, error) {
	if !out.Shape().Eq(grad.Shape()) {
		return nil, fmt.Errorf("%w: out %v, grad %v", ErrShape, out.Shape(), grad.Shape())
	}
	prod, err := gorgonia.HadamardProd(out, grad)
	if err != nil {
		return nil, fmt.Errorf("transformer: surrogate: %w", err)
	}
	sum, err := gorgonia.Sum(prod)
	if err != nil {
		return nil, fmt.Errorf("transformer: surrogate: %w", err)
	}
	return sum, nil
}

// FillOneHot overwrites dst, a float32 or float64 [len(ids), V] matrix, with
// the one-hot encoding of ids. An id outside [0, V) is an error matching
// ErrToken (dst is then left zeroed up to that row). ids is not retained.
func FillOneHot(dst *tensor.Dense, ids []int) error {
	shape := dst.Shape()
	if len(shape) != 2 || shape[0] != len(ids) {
		return fmt.Errorf("%w: one-hot target %v for %d ids", ErrShape, shape, len(ids))
	}
	v := shape[1]
	switch d := dst.Data().(type) {
	case []float32:
		clear(d)
		for i, id := range ids {
			if id < 0 || id >= v {
				return fmt.Errorf("%w: id %d at %d (vocab %d)", ErrToken, id, i, v)
			}
			d[i*v+id] = 1
		}
	case []float64:
		clear(d)
		for i, id := range ids {
			if id < 0 || id >= v {
				return fmt.Errorf("%w: id %d at %d (vocab %d)", ErrToken, id, i, v)
			}
			d[i*v+id] = 1
		}
	default:
		return fmt.Errorf("%w: one-hot target of type %T", ErrShape, d)
	}
	return nil
}

// OneHot returns a new [len(ids), vocab] one-hot matrix of dtype dt.
func OneHot(ids []int, vocab int, dt Dtype) (*tensor.Dense, error) {
	t := tensor.New(tensor.Of(dt.Tensor()), tensor.WithShape(len(ids), vocab))
	if err := FillOneHot(t, ids); err != nil {
		return nil, err
	}
	return t, nil
}

// SampleBatch draws batch windows of ctx+1 consecutive tokens from data at
// uniformly random offsets (using rng) and returns the first ctx tokens of
// each as inputs and the last ctx as targets, each batch*ctx long and
// sequence-major. data must hold more than ctx tokens. The caller owns the
// returned slices; data is not retained.
func SampleBatch(rng *rand.Rand, data []int, batch, ctx int) (inputs, targets []int, err error) {
	if len(data) <= ctx {
		return nil, nil, fmt.Errorf("%w: %d tokens of data for windows of %d", ErrShape, len(data), ctx+1)
	}
	inputs = make([]int, 0, batch*ctx)
	targets = make([]int, 0, batch*ctx)
	for range batch {
		off := rng.IntN(len(data) - ctx)
		inputs = append(inputs, data[off:off+ctx]...)
		targets = append(targets, data[off+1:off+ctx+1]...)
	}
	return inputs, targets, nil
}

// MeanCrossEntropy returns the mean cross-entropy (in nats) of logits, rows
// of vocab values, against targets (one id per row), computed in float64
// outside the graph, for instance on Predictor.Forward output for a
// validation loss. Neither slice is retained.
func MeanCrossEntropy(logits []float64, vocab int, targets []int) (float64, error) {
	if vocab < 1 || len(logits) != vocab*len(targets) || len(targets) == 0 {
		return 0, fmt.Errorf("%w: %d logits, vocab %d, %d targets", ErrShape, len(logits), vocab, len(targets))
	}
	var total float64
	for i, tgt := range targets {
		if tgt < 0 || tgt >= vocab {
			return 0, fmt.Errorf("%w: target %d at %d (vocab %d)", ErrToken, tgt, i, vocab)
		}
		row := logits[i*vocab : (i+1)*vocab]
		m := row[0]
		for _, x := range row[1:] {
			m = max(m, x)
		}
		var s float64
		for _, x := range row {
			s += math.Exp(x - m)
		}
		total += m + math.Log(s) - row[tgt]
	}
	return total / float64(len(targets)), nil
}
