package mlp

import (
	"errors"
	"fmt"
	"hash"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/internal/errs"
)

var (
	// ErrInvalidArgument is matched by the errors of an invalid Config. It
	// is the value every gdist package exports under this name
	// (errs.ErrInvalidArgument).
	ErrInvalidArgument = errs.ErrInvalidArgument
	// ErrShape reports a node whose shape or dtype does not fit the model.
	ErrShape = errors.New("mlp: shape mismatch")
)

// Config describes a multi-layer perceptron.
type Config struct {
	// Sizes lists the layer widths, input first and output (classes) last,
	// e.g. {784, 256, 128, 10}. It needs at least two entries, all positive.
	Sizes []int
	// Batch is the number of rows of the inputs NewInputs creates.
	// Forward accepts any batch size.
	Batch int
	// Dtype is tensor.Float32 or tensor.Float64; the zero value means Float32.
	Dtype tensor.Dtype
	// Seed determines the initial weights: equal seeds give bit-identical
	// parameters in every process.
	Seed int64
}

// Model is an MLP's learnable parameters in one graph: for each layer i a
// weight matrix w_i of shape (Sizes[i], Sizes[i+1]) and a bias vector b_i
// of length Sizes[i+1]. Hidden layers use ReLU; the output layer is linear
// (logits).
type Model struct {
	cfg Config
	g   *gorgonia.ExprGraph
	ws  gorgonia.Nodes
	bs  gorgonia.Nodes
}

// New validates cfg and adds the model's learnables to g, initialised from
// cfg.Seed: weights feeding a ReLU are He-uniform, U(±sqrt(6/fan_in)); the
// output weights are Glorot-uniform, U(±sqrt(6/(fan_in+fan_out))); biases
// are zero. Layer i draws from rand.NewPCG(uint64(Seed), uint64(i)) in
// float64 and rounds to Dtype, so a Float32 and a Float64 model with one
// seed start from the same values (up to rounding). New builds graph nodes,
// so like all Gorgonia graph construction it must not run concurrently with
// other graph construction in the process.
func New(g *gorgonia.ExprGraph, cfg Config) (*Model, error) {
	if g == nil {
		return nil, fmt.Errorf("mlp: %w: nil graph", ErrInvalidArgument)
	}
	if len(cfg.Sizes) < 2 {
		return nil, fmt.Errorf("mlp: %w: Sizes %v needs at least an input and an output width", ErrInvalidArgument, cfg.Sizes)
	}
	for i, s := range cfg.Sizes {
		if s < 1 {
			return nil, fmt.Errorf("mlp: %w: Sizes[%d] = %d", ErrInvalidArgument, i, s)
		}
	}
	if cfg.Batch < 0 {
		return nil, fmt.Errorf("mlp: %w: Batch = %d", ErrInvalidArgument, cfg.Batch)
	}
	switch cfg.Dtype {
	case tensor.Dtype{}:
		cfg.Dtype = tensor.Float32
	case tensor.Float32, tensor.Float64:
	default:
		return nil, fmt.Errorf("mlp: %w: Dtype %v is not Float32 or Float64", ErrInvalidArgument, cfg.Dtype)
	}
	cfg.Sizes = slices.Clone(cfg.Sizes)

	m := &Model{cfg: cfg, g: g}
	layers := len(cfg.Sizes) - 1
	for i := range layers {
		in, out := cfg.Sizes[i], cfg.Sizes[i+1]
		limit := math.Sqrt(6 / float64(in)) // He uniform, for ReLU layers
		if i == layers-1 {
			limit = math.Sqrt(6 / float64(in+out)) // Glorot uniform for the logits
		}
		rng := rand.New(rand.NewPCG(uint64(cfg.Seed), uint64(i)))
		w := make([]float64, in*out)
		for k := range w {
			w[k] = (2*rng.Float64() - 1) * limit
		}
		m.ws = append(m.ws, gorgonia.NewMatrix(g, cfg.Dtype, gorgonia.WithShape(in, out),
			gorgonia.WithName(fmt.Sprintf("w%d", i)), gorgonia.WithValue(denseOf(cfg.Dtype, []int{in, out}, w))))
		m.bs = append(m.bs, gorgonia.NewVector(g, cfg.Dtype, gorgonia.WithShape(out),
			gorgonia.WithName(fmt.Sprintf("b%d", i)), gorgonia.WithValue(denseOf(cfg.Dtype, []int{out}, make([]float64, out)))))
	}
	return m, nil
}

// denseOf returns a new dense tensor of dt holding vals.
func denseOf(dt tensor.Dtype, shape []int, vals []float64) *tensor.Dense {
	if dt == tensor.Float64 {
		return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(vals))
	}
	f := make([]float32, len(vals))
	for i, v := range vals {
		f[i] = float32(v)
	}
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(f))
}

// Config returns the model's configuration, with Dtype filled in. The
// caller owns the returned Sizes.
func (m *Model) Config() Config {
	c := m.cfg
	c.Sizes = slices.Clone(c.Sizes)
	return c
}

// Graph returns the graph holding the model.
func (m *Model) Graph() *gorgonia.ExprGraph { return m.g }

// Learnables returns the parameters in forward order: w0, b0, w1, b1, ...
// The slice is new (the caller owns it); the nodes are the model's.
func (m *Model) Learnables() gorgonia.Nodes {
	out := make(gorgonia.Nodes, 0, 2*len(m.ws))
	for i := range m.ws {
		out = append(out, m.ws[i], m.bs[i])
	}
	return out
}

// NewInputs adds input placeholders for one batch to the model's graph: x
// of shape (Batch, Sizes[0]) named "x" and one-hot targets y of shape
// (Batch, Sizes[len-1]) named "y". Bind values with gorgonia.Let before
// running a machine.
func (m *Model) NewInputs() (x, y *gorgonia.Node) {
	c := m.cfg
	x = gorgonia.NewMatrix(m.g, c.Dtype, gorgonia.WithShape(c.Batch, c.Sizes[0]), gorgonia.WithName("x"))
	y = gorgonia.NewMatrix(m.g, c.Dtype, gorgonia.WithShape(c.Batch, c.Sizes[len(c.Sizes)-1]), gorgonia.WithName("y"))
	return x, y
}

// Forward adds the forward pass for x (batch, Sizes[0]) to the graph and
// returns the logits (batch, Sizes[len-1]). It equals
// ForwardWith(x, m.Learnables()).
func (m *Model) Forward(x *gorgonia.Node) (*gorgonia.Node, error) {
	return m.ForwardWith(x, m.Learnables())
}

// ForwardWith is Forward computed from params in place of the learnables:
// params[k] stands for m.Learnables()[k] and must have its shape and dtype.
// It lets a wrapper substitute hook(w) for each parameter w (as DDP does to
// act when w's gradient is ready) while gradients still flow to the
// learnables.
func (m *Model) ForwardWith(x *gorgonia.Node, params gorgonia.Nodes) (*gorgonia.Node, error) {
	c := m.cfg
	if err := m.checkInput(x); err != nil {
		return nil, err
	}
	learn := m.Learnables()
	if len(params) != len(learn) {
		return nil, fmt.Errorf("%w: %d params, want %d", ErrShape, len(params), len(learn))
	}
	for k, p := range params {
		if p == nil || !p.Shape().Eq(learn[k].Shape()) || p.Dtype() != c.Dtype {
			return nil, fmt.Errorf("%w: param %d (%v) has shape %v, want %v %v", ErrShape, k, learn[k].Name(), shapeOf(p), learn[k].Shape(), c.Dtype)
		}
	}

	return m.forward(x, func(k int) (*gorgonia.Node, error) { return params[k], nil })
}

// ForwardHooked is Forward with hook(p) in place of every learnable p,
// where hook is called immediately before p's use: before layer i's matrix
// product for w_i and before its bias addition for b_i, so each hook node is
// created right before the node that consumes it. A data-parallel wrapper
// needs that order to overlap communication with the backward pass (the
// TapeMachine runs nodes in creation order, and Backpropagate creates a
// hook's gradient op when it reaches the hook). hook receives each learnable
// once, in forward order (w0, b0, w1, b1, ...), and must return a node of
// the learnable's shape and dtype; an error from hook is returned wrapped.
// With the identity hook, ForwardHooked computes exactly what Forward does.
func (m *Model) ForwardHooked(x *gorgonia.Node, hook func(*gorgonia.Node) (*gorgonia.Node, error)) (*gorgonia.Node, error) {
	if hook == nil {
		return nil, fmt.Errorf("mlp: %w: nil hook", ErrInvalidArgument)
	}
	if err := m.checkInput(x); err != nil {
		return nil, err
	}
	learn := m.Learnables()
	return m.forward(x, func(k int) (*gorgonia.Node, error) {
		p, err := hook(learn[k])
		if err != nil {
			return nil, fmt.Errorf("mlp: hook of %s: %w", learn[k].Name(), err)
		}
		if p == nil || !p.Shape().Eq(learn[k].Shape()) || p.Dtype() != m.cfg.Dtype {
			return nil, fmt.Errorf("%w: hook of %s returned shape %v, want %v %v", ErrShape, learn[k].Name(), shapeOf(p), learn[k].Shape(), m.cfg.Dtype)
		}
		return p, nil
	})
}

// checkInput checks x is a (batch, Sizes[0]) matrix of the model's dtype.
func (m *Model) checkInput(x *gorgonia.Node) error {
	c := m.cfg
	if x == nil || x.Dims() != 2 || x.Shape()[1] != c.Sizes[0] || x.Dtype() != c.Dtype {
		return fmt.Errorf("%w: input %v, want (batch, %d) %v", ErrShape, shapeOf(x), c.Sizes[0], c.Dtype)
	}
	return nil
}

// forward adds the layers to the graph, asking param(k) for learnable k
// (w_i is 2i, b_i is 2i+1) right before the op that uses it.
func (m *Model) forward(x *gorgonia.Node, param func(k int) (*gorgonia.Node, error)) (*gorgonia.Node, error) {
	h := x
	layers := len(m.ws)
	for i := range layers {
		w, err := param(2 * i)
		if err != nil {
			return nil, err
		}
		z, err := gorgonia.Mul(h, w)
		if err != nil {
			return nil, fmt.Errorf("mlp: layer %d matmul: %w", i, err)
		}
		b, err := param(2*i + 1)
		if err != nil {
			return nil, err
		}
		if z, err = gorgonia.BroadcastAdd(z, b, nil, []byte{0}); err != nil {
			return nil, fmt.Errorf("mlp: layer %d bias: %w", i, err)
		}
		if i < layers-1 {
			if z, err = gorgonia.Rectify(z); err != nil {
				return nil, fmt.Errorf("mlp: layer %d relu: %w", i, err)
			}
		}
		h = z
	}
	return h, nil
}

func shapeOf(n *gorgonia.Node) tensor.Shape {
	if n == nil {
		return nil
	}
	return n.Shape()
}

// Correct returns how many rows of logits (row-major, len(labels) rows of
// classes values) have their largest value (the first, on ties) at the
// row's label. It panics if len(logits) != len(labels)*classes.
func Correct[T float32 | float64](logits []T, classes int, labels []uint8) int {
	if classes < 1 || len(logits) != len(labels)*classes {
		panic(fmt.Sprintf("mlp: Correct: %d logits for %d labels of %d classes", len(logits), len(labels), classes))
	}
	n := 0
	for r, l := range labels {
		row := logits[r*classes : (r+1)*classes]
		best := 0
		for j, v := range row {
			if v > row[best] {
				best = j
			}
		}
		if best == int(l) {
			n++
		}
	}
	return n
}

// Accuracy returns Correct(logits, classes, labels) / len(labels), or 0
// for no labels.
func Accuracy[T float32 | float64](logits []T, classes int, labels []uint8) float64 {
	if len(labels) == 0 {
		return 0
	}
	return float64(Correct(logits, classes, labels)) / float64(len(labels))
}

// hashOf is the hash gorgonia expects from Op.Hashcode: FNV-1a of WriteHash.
func hashOf(op interface{ WriteHash(hash.Hash) }) uint32 {
	h := fnv.New32a()
	op.WriteHash(h)
	return h.Sum32()
}
