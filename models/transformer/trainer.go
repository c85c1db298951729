package transformer

import (
	"context"
	"fmt"
	"math"
	"sync"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/internal/options"
	"github.com/gdist/gdist/train/checkpoint"
	"github.com/gdist/gdist/train/optim"
)

// buildMu serialises graph construction inside this package's constructors:
// Gorgonia's graph building and Grad touch package-level state.
var buildMu sync.Mutex

// TrainerOption configures NewTrainer and NewTrainerFor. Each option checks
// its value when the constructor applies it, and the constructor fails
// with the first refusal: an error matching ErrInvalidArgument that names
// the option. A nil TrainerOption is refused the same way.
type TrainerOption func(*trainerOptions) error

type trainerOptions struct {
	lr      float64
	clip    float64
	solver  gorgonia.Solver
	weights []checkpoint.Named
	hook    Hook
	noDual  bool
}

// invalidOption is the error of an option that refuses its value.
func invalidOption(format string, args ...any) error {
	return fmt.Errorf("transformer: %w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}

// nonNegativeOption is an option that sets *field(o) to v, which must be
// finite and >= 0.
func nonNegativeOption(name string, v float64, field func(*trainerOptions) *float64) TrainerOption {
	return func(o *trainerOptions) error {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return invalidOption("%s(%v): must be finite and >= 0", name, v)
		}
		*field(o) = v
		return nil
	}
}

// WithLearnRate sets the Adam learning rate (default 3e-3); lr must be
// finite and >= 0. Ignored with WithSolver.
func WithLearnRate(lr float64) TrainerOption {
	return nonNegativeOption("WithLearnRate", lr, func(o *trainerOptions) *float64 { return &o.lr })
}

// WithClip sets Adam's element-wise gradient clipping bound (default 1; 0
// disables clipping); c must be finite and >= 0. Ignored with WithSolver.
func WithClip(c float64) TrainerOption {
	return nonNegativeOption("WithClip", c, func(o *trainerOptions) *float64 { return &o.clip })
}

// WithSolver replaces the default Adam solver. s must not be nil.
func WithSolver(s gorgonia.Solver) TrainerOption {
	return func(o *trainerOptions) error {
		if s == nil {
			return invalidOption("WithSolver(nil)")
		}
		o.solver = s
		return nil
	}
}

// WithWeights sets the initial parameters (see Stage.SetWeights) instead of
// the seeded initialisation. The tensors are copied. ts must not be empty.
func WithWeights(ts []checkpoint.Named) TrainerOption {
	return func(o *trainerOptions) error {
		if len(ts) == 0 {
			return invalidOption("WithWeights: no tensors")
		}
		o.weights = ts
		return nil
	}
}

// WithHook builds the trainer's forward pass with Stage.ForwardHooked(input,
// h): h is called immediately before every use of a parameter. For
// data-parallel training pass dist/ddp's DDP.Hook (and the DDP's Solver
// through WithSolver); since the DDP has to wrap the parameters before the
// forward pass is built, create the stage first and use NewTrainerFor. h
// must not be nil.
func WithHook(h Hook) TrainerOption {
	return func(o *trainerOptions) error {
		if h == nil {
			return invalidOption("WithHook(nil)")
		}
		o.hook = h
		return nil
	}
}

// WithDualValues chooses whether the trainer's machine binds the
// parameters' dual values (gorgonia.BindDualValues), where Gorgonia's
// solvers read the gradients: on by default. A sharded data-parallel
// wrapper that hands its solver gradient pieces of its own (dist/ddp under
// ZeRO, dist/fsdp) needs none, and a dual value would hold a whole gradient
// per parameter.
func WithDualValues(on bool) TrainerOption {
	return func(o *trainerOptions) error {
		o.noDual = !on
		return nil
	}
}

// Trainer trains a full model in one process: a graph with the whole model
// (a Stage over all layers) for a fixed batch size, the cross-entropy loss,
// its gradients, a TapeMachine and a solver. It is not safe for concurrent
// use.
//
// The exported nodes belong to the trainer's graph; read them, do not
// rebind them.
type Trainer struct {
	// Stage holds the model's learnables.
	Stage *Stage
	// Input is the [batch*Ctx, Vocab] one-hot input node.
	Input *gorgonia.Node
	// Targets is the [batch*Ctx, Vocab] one-hot target node.
	Targets *gorgonia.Node
	// Logits is the [batch*Ctx, Vocab] output node.
	Logits *gorgonia.Node
	// Loss is the scalar mean cross-entropy node.
	Loss *gorgonia.Node

	vm     gorgonia.VM
	solver gorgonia.Solver
	steps  int
}

// NewTrainer builds a trainer for cfg with batch sequences per step, in a
// new graph.
func NewTrainer(cfg Config, batch int, opts ...TrainerOption) (*Trainer, error) {
	o, err := trainerConfig(opts)
	if err != nil {
		return nil, err
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	st, err := NewStage(gorgonia.NewGraph(), cfg, 0, cfg.HeadLayer(), batch)
	if err != nil {
		return nil, err
	}
	return newTrainer(st, o)
}

// NewTrainerFor builds a trainer on st, a stage over all the layers of its
// model (else an error matching ErrLayerRange) on which Forward has not been
// called. It adds the input, targets, forward pass, loss and gradients to
// st's graph and runs the whole graph at every Step. Use it when something
// must see the parameters before the forward pass is built, as DDP does:
//
//	g := gorgonia.NewGraph()
//	st, _ := transformer.NewStage(g, cfg, 0, cfg.HeadLayer(), batch)
//	d, _ := ddp.Wrap(ctx, pg, st.Learnables()) // broadcasts rank 0's parameters
//	tr, _ := transformer.NewTrainerFor(st,
//		transformer.WithHook(d.Hook),
//		transformer.WithSolver(d.Solver(gorgonia.NewAdamSolver())))
//
// Like NewTrainer it serialises with this package's other constructors; a
// caller that builds graphs concurrently elsewhere must serialise with those
// itself.
func NewTrainerFor(st *Stage, opts ...TrainerOption) (*Trainer, error) {
	if st == nil {
		return nil, fmt.Errorf("%w: nil stage", ErrLayerRange)
	}
	if !st.IsFirst() || !st.IsLast() {
		return nil, fmt.Errorf("%w: a trainer needs the whole model, not stage [%d, %d]", ErrLayerRange, st.From(), st.To())
	}
	o, err := trainerConfig(opts)
	if err != nil {
		return nil, err
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	return newTrainer(st, o)
}

// trainerConfig applies opts, in order, to the defaults.
func trainerConfig(opts []TrainerOption) (trainerOptions, error) {
	o := trainerOptions{lr: 3e-3, clip: 1}
	if err := options.Apply(&o, opts, "transformer", ErrInvalidArgument); err != nil {
		return trainerOptions{}, err
	}
	return o, nil
}

// newTrainer builds a trainer on the full-model stage st; buildMu is held.
func newTrainer(st *Stage, o trainerOptions) (*Trainer, error) {
	if o.weights != nil {
		if err := st.SetWeights(o.weights); err != nil {
			return nil, err
		}
	}
	t := &Trainer{Stage: st, Input: st.NewInput("input"), Targets: st.NewTargets("targets")}
	var err error
	if t.Logits, err = st.ForwardHooked(t.Input, o.hook); err != nil {
		return nil, err
	}
	if t.Loss, err = CrossEntropy(t.Logits, t.Targets); err != nil {
		return nil, err
	}
	if _, err = gorgonia.Grad(t.Loss, st.Learnables()...); err != nil {
		return nil, fmt.Errorf("transformer: gradients: %w", err)
	}
	var vmOpts []gorgonia.VMOpt
	if !o.noDual {
		vmOpts = append(vmOpts, gorgonia.BindDualValues(st.Learnables()...))
	}
	t.vm = gorgonia.NewTapeMachine(st.Graph(), vmOpts...)
	t.solver = o.solver
	if t.solver == nil {
		if t.solver, err = NewAdam(o.lr, o.clip); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// Step runs one training step on a batch: inputs and targets are
// batch*Ctx token ids each, sequence-major (see SampleBatch). It returns the
// loss before the update. The slices are not retained.
func (t *Trainer) Step(ctx context.Context, inputs, targets []int) (float64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("transformer: step: %w", err)
	}
	if err := FillOneHot(t.Input.Value().(*tensor.Dense), inputs); err != nil {
		return 0, err
	}
	if err := FillOneHot(t.Targets.Value().(*tensor.Dense), targets); err != nil {
		return 0, err
	}
	defer t.vm.Reset()
	if err := t.vm.RunAll(); err != nil {
		return 0, fmt.Errorf("transformer: step: %w", err)
	}
	loss, err := ScalarValue(t.Loss)
	if err != nil {
		return 0, err
	}
	if err := t.solver.Step(gorgonia.NodesToValueGrads(t.Stage.Learnables())); err != nil {
		return loss, fmt.Errorf("transformer: solver: %w", err)
	}
	t.steps++
	return loss, nil
}

// Steps returns the number of successful Step calls.
func (t *Trainer) Steps() int { return t.steps }

// Weights returns a copy of the current parameters (see Stage.Weights).
func (t *Trainer) Weights() []checkpoint.Named { return t.Stage.Weights() }

// Close releases the trainer's machine.
func (t *Trainer) Close() error {
	return t.vm.Close()
}

// NewAdam returns the default solver of a Trainer: Adam with learning rate
// lr and element-wise gradient clipping at ±clip (0: none), train/optim's,
// which steps bit for bit as gorgonia.NewAdamSolver with the same settings
// but in one pass over each parameter, allocating nothing.
func NewAdam(lr, clip float64) (gorgonia.Solver, error) {
	opts := []optim.Option{optim.WithLearnRate(lr)}
	if clip > 0 {
		opts = append(opts, optim.WithClip(clip))
	}
	a, err := optim.NewAdam(opts...)
	if err != nil {
		return nil, fmt.Errorf("transformer: %w", err)
	}
	return a, nil
}

// ScalarValue returns the value of a scalar node after a run as float64.
func ScalarValue(n *gorgonia.Node) (float64, error) {
	v := n.Value()
	if v == nil {
		return 0, fmt.Errorf("%w: node %s has no value", ErrShape, n.Name())
	}
	switch x := v.Data().(type) {
	case float32:
		return float64(x), nil
	case float64:
		return x, nil
	case []float32:
		if len(x) == 1 {
			return float64(x[0]), nil
		}
	case []float64:
		if len(x) == 1 {
			return x[0], nil
		}
	}
	return 0, fmt.Errorf("%w: node %s is not a float scalar (%v)", ErrShape, n.Name(), v.Shape())
}

// Float64s returns a copy of the value of n (a float32 or float64 tensor or
// scalar) after a run, converted to float64, in row-major order. The caller owns the returned slice.
func Float64s(n *gorgonia.Node) ([]float64, error) {
	v := n.Value()
	if v == nil {
		return nil, fmt.Errorf("%w: node %s has no value", ErrShape, n.Name())
	}
	if d, ok := v.(*tensor.Dense); ok {
		out, err := denseFloat64s(d)
		if err != nil {
			return nil, fmt.Errorf("%w: node %s holds %T", ErrShape, n.Name(), v.Data())
		}
		return out, nil
	}
	switch x := v.Data().(type) {
	case float32:
		return []float64{float64(x)}, nil
	case float64:
		return []float64{x}, nil
	}
	return nil, fmt.Errorf("%w: node %s holds %T", ErrShape, n.Name(), v.Data())
}
