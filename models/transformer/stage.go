package transformer

import (
	"fmt"
	"math"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/train/checkpoint"
)

// Stage is a contiguous range of layers [From, To] of a model, built in one
// Gorgonia graph: it owns the learnables of those layers and can add their
// forward pass to the graph.
//
// Layers are numbered 0..Layers+1: layer 0 is the embedding (one-hot tokens
// times the token table, plus the position table), layers 1..Layers are
// pre-LN transformer blocks (x + attn(LN(x)), then x + mlp(LN(x)), causal
// multi-head self-attention, GELU MLP) and layer Layers+1 is the final layer
// norm and the output head. A full model is the stage [0, Layers+1].
//
// Activations are 2-D, one row per token: batch*Ctx rows, sequence-major
// (row b*Ctx+t is position t of sequence b). The input of a stage is
// [batch*Ctx, Vocab] one-hot tokens if From == 0, else hidden states
// [batch*Ctx, Dim]; the output is logits [batch*Ctx, Vocab] if To ==
// Layers+1, else hidden states [batch*Ctx, Dim].
//
// A Stage is not safe for concurrent use; building graphs in several
// goroutines at once also needs external serialisation (see the package
// documentation).
type Stage struct {
	cfg      Config
	from, to int
	batch    int
	g        *gorgonia.ExprGraph
	dt       tensor.Dtype

	params []*gorgonia.Node
	byName map[string]*gorgonia.Node

	mask, pos *gorgonia.Node // constants, created on first use

	hook Hook // while ForwardHooked builds: applied to every parameter use

	tp TensorParallel // the zero value: the whole model
	kv *KVCache       // non-nil in a Decoder: attention through the cache
}

// NewStage adds the learnables of layers from..to (inclusive) of cfg to g,
// initialised from cfg.Seed, for a fixed batch size. It does not add any
// computation; call Forward for that.
//
// With WithTensorParallel the stage holds and computes one member's part of
// every layer (see TensorParallel); its parameters have the shapes of
// their parts and are initialised to the parts of the whole model's
// initial values, so a tensor-parallel model starts where the plain one
// does.
func NewStage(g *gorgonia.ExprGraph, cfg Config, from, to, batch int, opts ...StageOption) (*Stage, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	o, err := stageConfig(cfg, opts)
	if err != nil {
		return nil, err
	}
	if from < 0 || to < from || to > cfg.HeadLayer() {
		return nil, fmt.Errorf("%w: [%d, %d] with %d layers", ErrLayerRange, from, to, cfg.NumLayers())
	}
	if batch < 1 {
		return nil, fmt.Errorf("%w: batch %d < 1", ErrShape, batch)
	}
	if cfg.TiedHead && (from > 0 || to < cfg.HeadLayer()) && (from == 0 || to == cfg.HeadLayer()) {
		return nil, fmt.Errorf("%w: stage [%d, %d]", ErrTiedSplit, from, to)
	}
	s := &Stage{cfg: cfg, from: from, to: to, batch: batch, g: g, dt: cfg.Dtype.Tensor(),
		byName: make(map[string]*gorgonia.Node), tp: o.tp}
	for l := from; l <= to; l++ {
		for _, p := range paramSpecs(cfg, l) {
			if o.share != nil {
				shared := o.share.Param(p.name)
				if shared == nil || o.share.tp.Rank != o.tp.Rank || o.share.tp.size() != o.tp.size() {
					return nil, fmt.Errorf("transformer: %w: sharing the parameters of stage [%d, %d]", ErrLayerRange, o.share.from, o.share.to)
				}
				s.addParam(p.name, shared.Value().(*tensor.Dense))
				continue
			}
			t := initTensor(cfg, p)
			if s.tp.enabled() {
				axis, err := ShardAxis(p.name)
				if err != nil {
					return nil, err
				}
				if t, err = sliceAxis(t, axis, s.tp.Rank, s.tp.Size); err != nil {
					return nil, fmt.Errorf("transformer: sharding %q: %w", p.name, err)
				}
			}
			s.addParam(p.name, t)
		}
	}
	return s, nil
}

// addParam adds a parameter node holding t.
func (s *Stage) addParam(name string, t *tensor.Dense) {
	shape := t.Shape().Clone()
	var n *gorgonia.Node
	if len(shape) == 1 {
		n = gorgonia.NewVector(s.g, s.dt, gorgonia.WithShape(shape...), gorgonia.WithName(name), gorgonia.WithValue(t))
	} else {
		n = gorgonia.NewMatrix(s.g, s.dt, gorgonia.WithShape(shape...), gorgonia.WithName(name), gorgonia.WithValue(t))
	}
	s.params = append(s.params, n)
	s.byName[name] = n
}

// Config returns the model configuration.
func (s *Stage) Config() Config { return s.cfg }

// From returns the first layer of the stage.
func (s *Stage) From() int { return s.from }

// To returns the last layer of the stage (inclusive).
func (s *Stage) To() int { return s.to }

// Batch returns the number of sequences per forward pass.
func (s *Stage) Batch() int { return s.batch }

// Rows returns batch*Ctx, the number of rows of the stage's input and
// output (in a Decoder, where a row is one position: batch).
func (s *Stage) Rows() int {
	if s.kv != nil {
		return s.batch
	}
	return s.batch * s.cfg.Ctx
}

// Graph returns the graph the stage was built in.
func (s *Stage) Graph() *gorgonia.ExprGraph { return s.g }

// IsFirst reports whether the stage contains the embedding (From == 0) and
// so takes one-hot tokens as input.
func (s *Stage) IsFirst() bool { return s.from == 0 }

// IsLast reports whether the stage contains the output head (To ==
// Layers+1) and so produces logits.
func (s *Stage) IsLast() bool { return s.to == s.cfg.HeadLayer() }

// InputShape returns the shape Forward expects: [Rows, Vocab] for the first
// stage, [Rows, Dim] otherwise.
//
// On a tensor-parallel member the vocabulary dimension is that member's
// part (VocabPart): the first stage takes that part of the one-hot tokens
// (FillOneHotPart) and the last returns that part of the logits.
func (s *Stage) InputShape() tensor.Shape {
	if s.IsFirst() {
		return tensor.Shape{s.Rows(), s.vocabWidth()}
	}
	return tensor.Shape{s.Rows(), s.cfg.Dim}
}

// TensorParallel returns the stage's tensor-parallel placement (the zero
// value for the whole model).
func (s *Stage) TensorParallel() TensorParallel { return s.tp }

// VocabPart returns the token ids [lo, hi) of the stage's part of the
// vocabulary: [0, Vocab) unless the stage is tensor-parallel.
func (s *Stage) VocabPart() (lo, hi int) { return VocabPart(s.cfg, s.tp.Rank, s.tp.size()) }

// vocabWidth returns the width of the stage's part of the vocabulary.
func (s *Stage) vocabWidth() int {
	lo, hi := s.VocabPart()
	return hi - lo
}

// heads returns the number of attention heads the stage computes.
func (s *Stage) heads() int { return s.cfg.Heads / s.tp.size() }

// OutputShape returns the shape Forward returns: [Rows, Vocab] for the last
// stage, [Rows, Dim] otherwise.
func (s *Stage) OutputShape() tensor.Shape {
	if s.IsLast() {
		return tensor.Shape{s.Rows(), s.vocabWidth()}
	}
	return tensor.Shape{s.Rows(), s.cfg.Dim}
}

// NewInput adds a zero-valued input node of InputShape and the model dtype,
// with the given (graph-unique) name, to the stage's graph. Fill it before
// each run with FillOneHot (first stage) or by copying hidden states into
// its value, or bind a new value with gorgonia.Let.
func (s *Stage) NewInput(name string) *gorgonia.Node {
	return s.newMatrix(name, s.InputShape())
}

// NewTargets adds a zero-valued [Rows, Vocab] input node for one-hot targets
// (see CrossEntropy and FillOneHot); [Rows, part] on a tensor-parallel
// member (FillOneHotPart).
func (s *Stage) NewTargets(name string) *gorgonia.Node {
	return s.newMatrix(name, tensor.Shape{s.Rows(), s.vocabWidth()})
}

func (s *Stage) newMatrix(name string, shape tensor.Shape) *gorgonia.Node {
	v := tensor.New(tensor.Of(s.dt), tensor.WithShape(shape...))
	return gorgonia.NewMatrix(s.g, s.dt, gorgonia.WithShape(shape...), gorgonia.WithName(name), gorgonia.WithValue(v))
}

// Learnables returns the stage's parameter nodes in canonical order (see
// ParamNames). The caller owns the returned slice, not the nodes.
func (s *Stage) Learnables() gorgonia.Nodes { return append(gorgonia.Nodes(nil), s.params...) }

// Names returns the stage's parameter names in canonical order. The caller
// owns the returned slice.
func (s *Stage) Names() []string {
	names := make([]string, len(s.params))
	for i, n := range s.params {
		names[i] = n.Name()
	}
	return names
}

// Param returns the parameter node with the given name, or nil.
func (s *Stage) Param(name string) *gorgonia.Node { return s.byName[name] }

// Weights returns a copy of the current parameter values, in canonical
// order, ready for checkpoint.Write. The caller owns the returned tensors.
func (s *Stage) Weights() []checkpoint.Named {
	out := make([]checkpoint.Named, len(s.params))
	for i, n := range s.params {
		out[i] = checkpoint.Named{Name: n.Name(), Tensor: n.Value().(*tensor.Dense).Clone().(*tensor.Dense)}
	}
	return out
}

// SetWeights copies values into the stage's parameters. Every parameter of
// the stage must be present in ts (else an error matching
// checkpoint.ErrMissingTensor) with its exact shape (else ErrShape); tensors
// for other layers are ignored, and float32/float64 values are converted to
// the model dtype. The values are copied into the existing parameter
// tensors, so machines and solvers built on the graph stay valid. ts is not
// retained.
func (s *Stage) SetWeights(ts []checkpoint.Named) error {
	byName := make(map[string]tensor.Tensor, len(ts))
	for _, t := range ts {
		byName[t.Name] = t.Tensor
	}
	// Check everything before changing anything.
	for _, n := range s.params {
		t, ok := byName[n.Name()]
		if !ok {
			return fmt.Errorf("%w: %q", checkpoint.ErrMissingTensor, n.Name())
		}
		if !t.Shape().Eq(n.Shape()) {
			return fmt.Errorf("%w: %q is %v, want %v", ErrShape, n.Name(), t.Shape(), n.Shape())
		}
		if dt := t.Dtype(); dt != tensor.Float32 && dt != tensor.Float64 {
			return fmt.Errorf("%w: %q has dtype %v", ErrShape, n.Name(), dt)
		}
	}
	for _, n := range s.params {
		if err := copyInto(n.Value().(*tensor.Dense), byName[n.Name()]); err != nil {
			return fmt.Errorf("transformer: setting %q: %w", n.Name(), err)
		}
	}
	return nil
}

// copyInto copies src into dst element-wise, converting between float32 and
// float64.
func copyInto(dst *tensor.Dense, src tensor.Tensor) error {
	if d, ok := src.(*tensor.Dense); ok && d.IsView() {
		src = d.Materialize()
	}
	switch dv := dst.Data().(type) {
	case []float32:
		switch sv := src.Data().(type) {
		case []float32:
			copy(dv, sv)
		case []float64:
			for i := range dv {
				dv[i] = float32(sv[i])
			}
		default:
			return fmt.Errorf("%w: source data %T", ErrShape, sv)
		}
	case []float64:
		switch sv := src.Data().(type) {
		case []float32:
			for i := range dv {
				dv[i] = float64(sv[i])
			}
		case []float64:
			copy(dv, sv)
		default:
			return fmt.Errorf("%w: source data %T", ErrShape, sv)
		}
	default:
		return fmt.Errorf("%w: parameter data %T", ErrShape, dv)
	}
	return nil
}

// Forward adds the forward pass of the stage's layers to the graph and
// returns its output node (see OutputShape). in must have InputShape and the
// model dtype. Forward may be called more than once (for instance on
// different inputs); the calls share the learnables.
func (s *Stage) Forward(in *gorgonia.Node) (*gorgonia.Node, error) {
	return s.ForwardHooked(in, nil)
}

// Hook maps a parameter node to the node a forward pass uses in its place,
// for instance dist/ddp's DDP.Hook, which is the identity on values and
// whose gradient op hands the parameter's gradient to the data-parallel
// wrapper. The returned node must be in the stage's graph with the
// parameter's shape and dtype.
type Hook func(param *gorgonia.Node) (*gorgonia.Node, error)

// ForwardHooked is Forward with every use of a parameter p replaced by
// hook(p). hook is called immediately before each operation that consumes a
// parameter, in the order of the forward pass, so that the node it returns
// is created right before its consumer. gorgonia.Backpropagate visits the
// graph in reverse creation order and creates the gradient op of hook(p)
// once it has reached the hook node, right after the gradient of its
// consumer: a hook whose gradient op does something with p's gradient (such
// as DDP starting an all-reduce) therefore acts as soon as that gradient is
// ready, during the backward pass rather than after it. Untied parameters
// are each used once, in canonical order (ParamNames), so their gradients
// reach the hooks in exactly the reverse order.
//
// A parameter used twice — the token embedding of a TiedHead model, in the
// embedding and (transposed) in the output head — is passed to hook once per
// use. A hook may return a new node per call (the parameter's gradient is
// then the sum over its uses, as without hooks) or memoise and return the
// same node for the same parameter, as DDP.Hook does (the node then
// receives the summed gradient of both uses, and its gradient op is created
// after the gradient of its first use, at the end of the backward pass).
//
// With a nil hook, or one that returns its argument, ForwardHooked is
// Forward; with a hook that is the identity on values and gradients it
// computes bitwise the same outputs and parameter gradients. An error from
// hook is returned wrapped; a hook result of the wrong shape, dtype or graph
// is an error matching ErrHook.
func (s *Stage) ForwardHooked(in *gorgonia.Node, hook Hook) (out *gorgonia.Node, err error) {
	if in == nil {
		return nil, fmt.Errorf("%w: nil input", ErrShape)
	}
	if !in.Shape().Eq(s.InputShape()) {
		return nil, fmt.Errorf("%w: stage [%d, %d] input is %v, want %v", ErrShape, s.from, s.to, in.Shape(), s.InputShape())
	}
	if in.Dtype() != s.dt {
		return nil, fmt.Errorf("%w: input dtype %v, want %v", ErrShape, in.Dtype(), s.dt)
	}
	s.hook = hook
	defer func() {
		s.hook = nil
		if r := recover(); r != nil {
			be, ok := r.(buildError)
			if !ok {
				panic(r)
			}
			out, err = nil, fmt.Errorf("transformer: building stage [%d, %d]: %w", s.from, s.to, be.err)
		}
	}()
	h := in
	for l := s.from; l <= s.to; l++ {
		switch {
		case l == 0:
			h = s.embed(h)
		case l <= s.cfg.Layers:
			h = s.block(l, h)
		default:
			h = s.head(h)
		}
	}
	return h, nil
}

// buildError carries a graph-construction error out of the layer builders.
type buildError struct{ err error }

func must(n *gorgonia.Node, err error) *gorgonia.Node {
	if err != nil {
		panic(buildError{err})
	}
	return n
}

// use returns the node that stands for parameter LayerName(l)+"."+suffix at
// this point of the forward pass: the parameter, or hook(parameter). Call it
// immediately before the op that consumes the result.
func (s *Stage) use(l int, suffix string) *gorgonia.Node {
	name := LayerName(l) + "." + suffix
	p := s.byName[name]
	if p == nil {
		panic(buildError{fmt.Errorf("%w: no parameter %s", ErrLayerRange, name)})
	}
	if s.hook == nil {
		return p
	}
	h, err := s.hook(p)
	switch {
	case err != nil:
		panic(buildError{fmt.Errorf("hook of %s: %w", name, err)})
	case h == nil:
		panic(buildError{fmt.Errorf("%w: hook of %s returned nil", ErrHook, name)})
	case h.Graph() != s.g:
		panic(buildError{fmt.Errorf("%w: hook of %s returned a node of another graph", ErrHook, name)})
	case !h.Shape().Eq(p.Shape()) || h.Dtype() != p.Dtype():
		panic(buildError{fmt.Errorf("%w: hook of %s returned %v %v, want %v %v", ErrHook, name, h.Shape(), h.Dtype(), p.Shape(), p.Dtype())})
	}
	return h
}

func (s *Stage) scalar(v float64) *gorgonia.Node {
	if s.dt == tensor.Float32 {
		return gorgonia.NewConstant(float32(v))
	}
	return gorgonia.NewConstant(v)
}

// constant adds a non-learnable input node holding vals (float64, converted
// to the model dtype). Input nodes are used instead of gorgonia.NewConstant
// because constants hash (and are named) by formatting their whole value.
func (s *Stage) constant(name string, shape tensor.Shape, vals []float64) *gorgonia.Node {
	var back any = vals
	if s.dt == tensor.Float32 {
		f := make([]float32, len(vals))
		for i, x := range vals {
			f[i] = float32(x)
		}
		back = f
	}
	t := tensor.New(tensor.WithShape(shape...), tensor.WithBacking(back))
	return gorgonia.NewTensor(s.g, s.dt, len(shape), gorgonia.WithShape(shape...), gorgonia.WithName(name), gorgonia.WithValue(t))
}

// positions returns the [Rows, Ctx] one-hot matrix of token positions.
func (s *Stage) positions() *gorgonia.Node {
	if s.pos == nil {
		T := s.cfg.Ctx
		vals := make([]float64, s.Rows()*T)
		for r := range s.Rows() {
			vals[r*T+r%T] = 1
		}
		s.pos = s.constant(fmt.Sprintf("%s.positions.b%d", LayerName(0), s.batch), tensor.Shape{s.Rows(), T}, vals)
	}
	return s.pos
}

// causalMask returns the additive [batch*Heads, Ctx, Ctx] mask: 0 where key
// position <= query position, -1e9 elsewhere.
func (s *Stage) causalMask() *gorgonia.Node {
	if s.mask == nil {
		T := s.cfg.Ctx
		bh := s.batch * s.heads()
		vals := make([]float64, bh*T*T)
		for b := range bh {
			for i := range T {
				for j := i + 1; j < T; j++ {
					vals[(b*T+i)*T+j] = -1e9
				}
			}
		}
		s.mask = s.constant(fmt.Sprintf("causal_mask.b%d.h%d", s.batch, s.heads()), tensor.Shape{bh, T, T}, vals)
	}
	return s.mask
}

// embed: one-hot [Rows, Vocab] -> [Rows, Dim].
func (s *Stage) embed(x *gorgonia.Node) *gorgonia.Node {
	tok := s.reduceOut(must(mul(x, s.use(0, "tok_emb"))))
	pos := s.positions()
	pos = must(mul(pos, s.use(0, "pos_emb")))
	return must(gorgonia.Add(tok, pos))
}

// layerNorm normalises each row of x [Rows, Dim] and applies the gain and
// bias ([Dim]) of layer l named prefix+".g" and prefix+".b". In a Decoder
// it is one fused operation with bitwise the same result (fused.go), as are
// gelu and the biases of addBias.
func (s *Stage) layerNorm(x *gorgonia.Node, l int, prefix string) *gorgonia.Node {
	if s.kv != nil {
		return must(fused(fusedLayerNorm, x, s.use(l, prefix+".g"), s.use(l, prefix+".b")))
	}
	mean := must(gorgonia.Mean(x, 1))
	xc := must(gorgonia.BroadcastSub(x, mean, nil, []byte{1}))
	variance := must(gorgonia.Mean(must(gorgonia.Square(xc)), 1))
	std := must(gorgonia.Sqrt(must(gorgonia.Add(variance, s.scalar(1e-5)))))
	xn := must(gorgonia.BroadcastHadamardDiv(xc, std, nil, []byte{1}))
	y := must(gorgonia.BroadcastHadamardProd(xn, s.use(l, prefix+".g"), nil, []byte{0}))
	return must(gorgonia.BroadcastAdd(y, s.use(l, prefix+".b"), nil, []byte{0}))
}

// linear returns x·w, w being parameter w of layer l, plus bias b broadcast
// over rows unless b is "".
func (s *Stage) linear(x *gorgonia.Node, l int, w, b string) *gorgonia.Node {
	return s.addBias(must(mul(x, s.use(l, w))), l, b)
}

// addBias returns y plus parameter b of layer l broadcast over rows, or y if
// b is "".
func (s *Stage) addBias(y *gorgonia.Node, l int, b string) *gorgonia.Node {
	if b == "" {
		return y
	}
	if s.kv != nil {
		return must(fused(fusedAddRow, y, s.use(l, b)))
	}
	return must(gorgonia.BroadcastAdd(y, s.use(l, b), nil, []byte{0}))
}

// copyIn is Megatron's f before a column-parallel layer: the identity
// unless the stage is tensor-parallel.
func (s *Stage) copyIn(x *gorgonia.Node) *gorgonia.Node {
	if !s.tp.enabled() {
		return x
	}
	return must(s.tp.Comm.Copy(x))
}

// reduceOut is Megatron's g after a row-parallel layer: the identity unless
// the stage is tensor-parallel.
func (s *Stage) reduceOut(x *gorgonia.Node) *gorgonia.Node {
	if !s.tp.enabled() {
		return x
	}
	return must(s.tp.Comm.Reduce(x))
}

// rowLinear returns x·w summed over the tensor-parallel group (x and w
// being this member's parts), plus the replicated bias b.
func (s *Stage) rowLinear(x *gorgonia.Node, l int, w, b string) *gorgonia.Node {
	return s.addBias(s.reduceOut(must(mul(x, s.use(l, w)))), l, b)
}

// gelu is the tanh approximation 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
func (s *Stage) gelu(x *gorgonia.Node) *gorgonia.Node {
	if s.kv != nil {
		return must(fused(fusedGELU, x))
	}
	x3 := must(gorgonia.Cube(x))
	inner := must(gorgonia.Add(x, must(gorgonia.HadamardProd(x3, s.scalar(0.044715)))))
	t := must(gorgonia.Tanh(must(gorgonia.HadamardProd(inner, s.scalar(math.Sqrt(2/math.Pi))))))
	onePlus := must(gorgonia.Add(t, s.scalar(1)))
	return must(gorgonia.HadamardProd(must(gorgonia.HadamardProd(x, onePlus)), s.scalar(0.5)))
}

// splitHeads: [B*T, H*hd] -> [B*H, T, hd], H the stage's heads.
func (s *Stage) splitHeads(x *gorgonia.Node) *gorgonia.Node {
	B, T, H, hd := s.batch, s.cfg.Ctx, s.heads(), s.cfg.HeadDim()
	x = must(gorgonia.Reshape(x, tensor.Shape{B, T, H, hd}))
	if H > 1 {
		x = must(gorgonia.Transpose(x, 0, 2, 1, 3))
	}
	return must(gorgonia.Reshape(x, tensor.Shape{B * H, T, hd}))
}

// mergeHeads: [B*H, T, hd] -> [B*T, H*hd], H the stage's heads.
func (s *Stage) mergeHeads(x *gorgonia.Node) *gorgonia.Node {
	B, T, H, hd := s.batch, s.cfg.Ctx, s.heads(), s.cfg.HeadDim()
	if H > 1 {
		x = must(gorgonia.Reshape(x, tensor.Shape{B, H, T, hd}))
		x = must(gorgonia.Transpose(x, 0, 2, 1, 3))
	}
	return must(gorgonia.Reshape(x, tensor.Shape{B * T, H * hd}))
}

// attention is causal multi-head self-attention of x [Rows, Dim]: over
// the stage's heads and through Comm on a tensor-parallel member, through
// the KV cache in a Decoder.
func (s *Stage) attention(l int, x *gorgonia.Node) *gorgonia.Node {
	scale := 1 / math.Sqrt(float64(s.cfg.HeadDim()))
	x = s.copyIn(x)
	q := must(gorgonia.HadamardProd(s.linear(x, l, "attn.wq", ""), s.scalar(scale)))
	k := s.linear(x, l, "attn.wk", "")
	v := s.linear(x, l, "attn.wv", "")
	if s.kv != nil {
		o := must(gorgonia.ApplyOp(&cachedAttention{kv: s.kv, layer: l - max(s.from, 1)}, q, k, v))
		return s.rowLinear(o, l, "attn.wo", "attn.bo")
	}
	qh, kh, vh := s.splitHeads(q), s.splitHeads(k), s.splitHeads(v)
	scores := must(gorgonia.BatchedMatMul(qh, kh, false, true)) // [B*H, T, T]
	scores = must(gorgonia.Add(scores, s.causalMask()))
	probs := must(rowSoftmax(scores, false))
	o := must(gorgonia.BatchedMatMul(probs, vh)) // [B*H, T, hd]
	return s.rowLinear(s.mergeHeads(o), l, "attn.wo", "attn.bo")
}

// block is one pre-LN transformer block.
func (s *Stage) block(l int, h *gorgonia.Node) *gorgonia.Node {
	a := s.attention(l, s.layerNorm(h, l, "ln1"))
	h = must(gorgonia.Add(h, a))
	m := s.copyIn(s.layerNorm(h, l, "ln2"))
	m = s.gelu(s.linear(m, l, "mlp.w1", "mlp.b1"))
	m = s.rowLinear(m, l, "mlp.w2", "mlp.b2")
	return must(gorgonia.Add(h, m))
}

// head: final layer norm and projection to logits [Rows, Vocab].
func (s *Stage) head(h *gorgonia.Node) *gorgonia.Node {
	l := s.cfg.HeadLayer()
	x := s.copyIn(s.layerNorm(h, l, "ln"))
	if !s.cfg.TiedHead {
		return s.linear(x, l, "head.w", "head.b")
	}
	w := must(gorgonia.Transpose(s.use(0, "tok_emb")))
	return s.addBias(must(gorgonia.Mul(x, w)), l, "head.b")
}
