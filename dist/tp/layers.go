package tp

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/internal/options"
	"github.com/gdist/gdist/models/transformer"
)

// LayerOption configures NewColumnLinear, NewRowLinear and
// NewVocabEmbedding. Options check their values when applied; the
// constructor fails with the first refusal, an error matching
// ErrInvalidArgument.
type LayerOption func(*layerConfig) error

type layerConfig struct {
	name     string
	dt       tensor.Dtype
	bias     bool
	gather   bool // column: gather the output
	parallel bool // row: the input is already split
	seed     uint64
	std      float64
	w, b     *tensor.Dense // whole values, if given
}

func defaultLayerConfig(name string) layerConfig {
	return layerConfig{name: name, dt: tensor.Float64, bias: true, parallel: true, seed: 1, std: 0.02}
}

// WithName sets the name prefix of the layer's parameters ("<name>.w",
// "<name>.b"); the default is "column", "row" or "embedding".
func WithName(name string) LayerOption {
	return func(c *layerConfig) error {
		if name == "" {
			return fmt.Errorf("tp: WithName(\"\"): %w", ErrInvalidArgument)
		}
		c.name = name
		return nil
	}
}

// WithDtype sets the parameters' dtype, tensor.Float32 or tensor.Float64
// (the default).
func WithDtype(dt tensor.Dtype) LayerOption {
	return func(c *layerConfig) error {
		if dt != tensor.Float32 && dt != tensor.Float64 {
			return fmt.Errorf("tp: WithDtype(%v): %w", dt, ErrInvalidArgument)
		}
		c.dt = dt
		return nil
	}
}

// WithBias adds a bias (the default) or not.
func WithBias(on bool) LayerOption {
	return func(c *layerConfig) error { c.bias = on; return nil }
}

// WithGatherOutput makes a ColumnLinear gather its output, so that every
// member gets the whole [N, out] (Megatron's gather_output); by default
// each member keeps its part [N, out/n].
func WithGatherOutput(on bool) LayerOption {
	return func(c *layerConfig) error { c.gather = on; return nil }
}

// WithParallelInput says whether a RowLinear's input is already split
// (each member passes its part [N, in/n], Megatron's input_is_parallel,
// the default) or whole ([N, in], which the layer splits).
func WithParallelInput(on bool) LayerOption {
	return func(c *layerConfig) error { c.parallel = on; return nil }
}

// WithInit draws the whole weight from N(0, std²) with a PCG generator
// seeded by (seed, FNV-64a of the weight's name); every member draws the
// same matrix and keeps its part, so the layer equals an unsplit one with
// the same seed. The default is seed 1, std 0.02; biases start at zero.
func WithInit(seed uint64, std float64) LayerOption {
	return func(c *layerConfig) error {
		if !(std >= 0) {
			return fmt.Errorf("tp: WithInit(%d, %v): %w", seed, std, ErrInvalidArgument)
		}
		c.seed, c.std = seed, std
		return nil
	}
}

// WithWeights sets the whole weight (and bias; nil for zeros) of the
// unsplit layer; each member keeps its part. The tensors are not retained.
func WithWeights(w, b *tensor.Dense) LayerOption {
	return func(c *layerConfig) error {
		if w == nil {
			return fmt.Errorf("tp: WithWeights(nil, _): %w", ErrInvalidArgument)
		}
		c.w, c.b = w, b
		return nil
	}
}

func layerSetup(name string, opts []LayerOption) (layerConfig, error) {
	c := defaultLayerConfig(name)
	if err := options.Apply(&c, opts, "tp", ErrInvalidArgument); err != nil {
		return c, err
	}
	return c, nil
}

// wholeWeight returns the unsplit [rows, cols] weight of c.
func (c *layerConfig) wholeWeight(rows, cols int) (*tensor.Dense, error) {
	if c.w != nil {
		if !c.w.Shape().Eq(tensor.Shape{rows, cols}) {
			return nil, fmt.Errorf("tp: weight %v, want [%d %d]: %w", c.w.Shape(), rows, cols, ErrInvalidArgument)
		}
		return convert(c.w, c.dt), nil
	}
	h := fnv.New64a()
	h.Write([]byte(c.name + ".w"))
	rng := rand.New(rand.NewPCG(c.seed, h.Sum64()))
	vals := make([]float64, rows*cols)
	for i := range vals {
		vals[i] = rng.NormFloat64() * c.std
	}
	return convert(tensor.New(tensor.WithShape(rows, cols), tensor.WithBacking(vals)), c.dt), nil
}

// wholeBias returns the unsplit bias of n elements.
func (c *layerConfig) wholeBias(n int) (*tensor.Dense, error) {
	if c.b != nil {
		if !c.b.Shape().Eq(tensor.Shape{n}) {
			return nil, fmt.Errorf("tp: bias %v, want [%d]: %w", c.b.Shape(), n, ErrInvalidArgument)
		}
		return convert(c.b, c.dt), nil
	}
	return tensor.New(tensor.Of(c.dt), tensor.WithShape(n)), nil
}

// convert returns a dense copy of t in dt.
func convert(t *tensor.Dense, dt tensor.Dtype) *tensor.Dense {
	if t.IsView() {
		t = t.Materialize().(*tensor.Dense)
	}
	out := tensor.New(tensor.Of(dt), tensor.WithShape(t.Shape().Clone()...))
	switch dst := out.Data().(type) {
	case []float64:
		switch src := t.Data().(type) {
		case []float64:
			copy(dst, src)
		case []float32:
			for i, v := range src {
				dst[i] = float64(v)
			}
		}
	case []float32:
		switch src := t.Data().(type) {
		case []float32:
			copy(dst, src)
		case []float64:
			for i, v := range src {
				dst[i] = float32(v)
			}
		}
	}
	return out
}

// part returns member rank's part of t along axis (transformer.Partition).
func part(t *tensor.Dense, axis, rank, size int) (*tensor.Dense, error) {
	return transformer.SplitTensor(t, axis, rank, size)
}

// parameters adds this member's part of the layer's weight — the whole
// [in, out] weight split along wAxis — and, if the layer has one, of its
// bias — the whole [out] bias split along bAxis (transformer.Replicated:
// kept whole) — to g.
func (c *layerConfig) parameters(g *gorgonia.ExprGraph, group *dist.ProcessGroup, in, out, wAxis, bAxis int) (w, b *gorgonia.Node, err error) {
	n, r := group.WorldSize(), group.Rank()
	wt, err := c.wholeWeight(in, out)
	if err != nil {
		return nil, nil, err
	}
	if wt, err = part(wt, wAxis, r, n); err != nil {
		return nil, nil, err
	}
	w = param(g, c.name+".w", wt)
	if !c.bias {
		return w, nil, nil
	}
	bt, err := c.wholeBias(out)
	if err != nil {
		return nil, nil, err
	}
	if bt, err = part(bt, bAxis, r, n); err != nil {
		return nil, nil, err
	}
	return w, param(g, c.name+".b", bt), nil
}

// affine returns x·w plus b broadcast over the rows (none if b is nil).
func affine(x, w, b *gorgonia.Node, layer string) (*gorgonia.Node, error) {
	y, err := gorgonia.Mul(x, w)
	if err != nil {
		return nil, fmt.Errorf("tp: %s: %w", layer, err)
	}
	return addBias(y, b, layer)
}

// addBias returns y plus b broadcast over the rows (y if b is nil).
func addBias(y, b *gorgonia.Node, layer string) (*gorgonia.Node, error) {
	if b == nil {
		return y, nil
	}
	y, err := gorgonia.BroadcastAdd(y, b, nil, []byte{0})
	if err != nil {
		return nil, fmt.Errorf("tp: %s: %w", layer, err)
	}
	return y, nil
}

func param(g *gorgonia.ExprGraph, name string, t *tensor.Dense) *gorgonia.Node {
	if len(t.Shape()) == 1 {
		return gorgonia.NewVector(g, t.Dtype(), gorgonia.WithShape(t.Shape()...), gorgonia.WithName(name), gorgonia.WithValue(t))
	}
	return gorgonia.NewMatrix(g, t.Dtype(), gorgonia.WithShape(t.Shape()...), gorgonia.WithName(name), gorgonia.WithValue(t))
}

// ColumnLinear is a column-parallel linear layer y = x·W + b (Megatron's
// ColumnParallelLinear, weights multiplying from the right): W [in, out] is
// split by columns, member r holding W's columns Partition(out, n, r) and
// the same part of b. Its input is whole on every member (Copy before it);
// its output is this member's columns, or the whole output with
// WithGatherOutput.
type ColumnLinear struct {
	// W is this member's columns of the weight, [in, out/n]; B its part of
	// the bias, or nil.
	W, B   *gorgonia.Node
	group  *dist.ProcessGroup
	gather bool
}

// NewColumnLinear adds a column-parallel layer from in to out features to
// g, for group (every member calls it with the same arguments); out must
// split evenly over the group.
func NewColumnLinear(g *gorgonia.ExprGraph, group *dist.ProcessGroup, in, out int, opts ...LayerOption) (*ColumnLinear, error) {
	c, err := layerSetup("column", opts)
	if err != nil {
		return nil, err
	}
	if group == nil || g == nil || in < 1 || out < 1 || out%group.WorldSize() != 0 {
		return nil, fmt.Errorf("tp: column-parallel layer %d -> %d over %v: %w", in, out, groupSize(group), ErrInvalidArgument)
	}
	l := &ColumnLinear{group: group, gather: c.gather}
	if l.W, l.B, err = c.parameters(g, group, in, out, 1, 0); err != nil {
		return nil, err
	}
	return l, nil
}

func groupSize(g *dist.ProcessGroup) any {
	if g == nil {
		return "a nil group"
	}
	return fmt.Sprintf("%d members", g.WorldSize())
}

// Learnables returns W and, if present, B.
func (l *ColumnLinear) Learnables() gorgonia.Nodes { return learnables(l.W, l.B) }

func learnables(w, b *gorgonia.Node) gorgonia.Nodes {
	if b == nil {
		return gorgonia.Nodes{w}
	}
	return gorgonia.Nodes{w, b}
}

// Forward returns Copy(x)·W + B for x [N, in], then gathered if the layer
// gathers its output.
func (l *ColumnLinear) Forward(x *gorgonia.Node) (*gorgonia.Node, error) {
	xin, err := Copy(l.group, x)
	if err != nil {
		return nil, err
	}
	y, err := affine(xin, l.W, l.B, "column-parallel layer")
	if err != nil {
		return nil, err
	}
	if l.gather {
		return Gather(l.group, y)
	}
	return y, nil
}

// RowLinear is a row-parallel linear layer y = x·W + b (Megatron's
// RowParallelLinear): W [in, out] is split by rows, member r holding W's
// rows Partition(in, n, r); b is replicated and added after the sum. Its
// input is this member's part of x (a ColumnLinear's output), or whole x
// with WithParallelInput(false); its output, Reduce of the partial
// products, is whole on every member.
type RowLinear struct {
	// W is this member's rows of the weight, [in/n, out]; B the whole
	// bias, or nil.
	W, B     *gorgonia.Node
	group    *dist.ProcessGroup
	parallel bool
}

// NewRowLinear adds a row-parallel layer from in to out features to g, for
// group; in must split evenly over the group.
func NewRowLinear(g *gorgonia.ExprGraph, group *dist.ProcessGroup, in, out int, opts ...LayerOption) (*RowLinear, error) {
	c, err := layerSetup("row", opts)
	if err != nil {
		return nil, err
	}
	if group == nil || g == nil || in < 1 || out < 1 || in%group.WorldSize() != 0 {
		return nil, fmt.Errorf("tp: row-parallel layer %d -> %d over %v: %w", in, out, groupSize(group), ErrInvalidArgument)
	}
	l := &RowLinear{group: group, parallel: c.parallel}
	if l.W, l.B, err = c.parameters(g, group, in, out, 0, transformer.Replicated); err != nil {
		return nil, err
	}
	return l, nil
}

// Learnables returns W and, if present, B.
func (l *RowLinear) Learnables() gorgonia.Nodes { return learnables(l.W, l.B) }

// Forward returns Reduce(x·W) + B.
func (l *RowLinear) Forward(x *gorgonia.Node) (*gorgonia.Node, error) {
	var err error
	if !l.parallel {
		if x, err = Scatter(l.group, x); err != nil {
			return nil, err
		}
	}
	y, err := affine(x, l.W, nil, "row-parallel layer")
	if err != nil {
		return nil, err
	}
	if y, err = Reduce(l.group, y); err != nil {
		return nil, err
	}
	return addBias(y, l.B, "row-parallel layer")
}

// VocabEmbedding is a vocabulary-parallel embedding (Megatron's
// VocabParallelEmbedding): the table [vocab, dim] is split by rows, member
// r holding the token ids Partition(vocab, n, r) (the split may be uneven).
// Its input is this member's part of the one-hot tokens [N, part]
// (transformer.FillOneHotPart); Forward multiplies it by the table's part
// and sums over the group, so each token's row comes from the member that
// holds it.
type VocabEmbedding struct {
	// W is this member's rows of the table.
	W      *gorgonia.Node
	group  *dist.ProcessGroup
	lo, hi int
}

// NewVocabEmbedding adds a vocabulary-parallel embedding of vocab tokens
// into dim features to g, for group; vocab must be at least the group's
// size. WithWeights sets the whole table (its bias is ignored).
func NewVocabEmbedding(g *gorgonia.ExprGraph, group *dist.ProcessGroup, vocab, dim int, opts ...LayerOption) (*VocabEmbedding, error) {
	c, err := layerSetup("embedding", opts)
	if err != nil {
		return nil, err
	}
	if group == nil || g == nil || dim < 1 || vocab < group.WorldSize() {
		return nil, fmt.Errorf("tp: embedding of %d tokens into %d over %v: %w", vocab, dim, groupSize(group), ErrInvalidArgument)
	}
	c.bias = false
	e := &VocabEmbedding{group: group}
	if e.W, _, err = c.parameters(g, group, vocab, dim, 0, 0); err != nil {
		return nil, err
	}
	e.lo, e.hi = transformer.Partition(vocab, group.WorldSize(), group.Rank())
	return e, nil
}

// Part returns the token ids [lo, hi) this member holds.
func (e *VocabEmbedding) Part() (lo, hi int) { return e.lo, e.hi }

// Learnables returns W.
func (e *VocabEmbedding) Learnables() gorgonia.Nodes { return gorgonia.Nodes{e.W} }

// Forward returns Reduce(onehot·W) for onehot [N, hi-lo], this member's
// part of the one-hot tokens.
func (e *VocabEmbedding) Forward(onehot *gorgonia.Node) (*gorgonia.Node, error) {
	y, err := affine(onehot, e.W, nil, "embedding")
	if err != nil {
		return nil, err
	}
	return Reduce(e.group, y)
}
