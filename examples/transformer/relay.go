package main

import (
	"context"
	"errors"
	"fmt"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/ddp"
)

// ddpRelay averages a model's gradients over the ranks with package ddp
// for a model whose forward pass cannot take DDP hooks.
//
// ddp learns a gradient through the gradient op of the hook it puts in the
// forward pass in place of each parameter (DDP.Hook). transformer.Trainer
// builds its forward pass itself, from the parameters, so the relay builds a
// second, tiny graph for the DDP instead: for every model parameter q a
// parameter node p that shares q's value tensor, an input c, and the loss
// Σ sum(hook(p) ⊙ c). After the trainer's backward pass the relay copies
// q's gradient into c and runs that graph: the gradient arriving at hook(p)
// is c (exactly: d sum(h ⊙ c)/dh = 1 ⊙ c), so DDP buckets and all-reduces
// it, and DDP's Solver writes the average into p's gradient and steps the
// inner solver, which updates the shared tensor — q's value — in place.
//
// Training is exactly DDP training; what the relay loses is the overlap of
// the all-reduces with the trainer's backward pass (they start after it, as
// with ddp.WithOverlap(false)), which for this model's ~0.5 MB of gradients
// is a fraction of a millisecond per step.
//
// ddpRelay implements gorgonia.Solver; pass it to transformer.NewTrainer
// through a lateSolver (the trainer's parameters exist only after
// NewTrainer).
type ddpRelay struct {
	d      *ddp.DDP
	q      gorgonia.Nodes // the trainer's parameters
	p      gorgonia.Nodes // the relay's parameters: values shared with q
	c      []*tensor.Dense
	vm     gorgonia.VM
	solver gorgonia.Solver
}

var _ gorgonia.Solver = (*ddpRelay)(nil)

// newDDPRelay wraps params (a trainer's learnables, with values) in a DDP
// on pg, which broadcasts rank 0's values into them, and returns the relay
// that averages their gradients before inner steps. Every rank must call it
// with the same parameters. It builds its graph under graphMu.
func newDDPRelay(ctx context.Context, pg *dist.ProcessGroup, params gorgonia.Nodes, inner gorgonia.Solver, opts ...ddp.Option) (*ddpRelay, error) {
	r := &ddpRelay{q: append(gorgonia.Nodes(nil), params...)}
	graphMu.Lock()
	g := gorgonia.NewGraph()
	for _, q := range r.q {
		v, ok := q.Value().(*tensor.Dense)
		if !ok {
			graphMu.Unlock()
			return nil, fmt.Errorf("transformer: parameter %s holds %T, want *tensor.Dense", q.Name(), q.Value())
		}
		p := gorgonia.NewTensor(g, q.Dtype(), q.Dims(), gorgonia.WithShape(q.Shape().Clone()...),
			gorgonia.WithName(q.Name()), gorgonia.WithValue(v))
		r.p = append(r.p, p)
	}
	graphMu.Unlock()

	// Wrap is a collective (it broadcasts rank 0's parameters): not under
	// graphMu, which another in-process rank may need to reach it.
	d, err := ddp.Wrap(ctx, pg, r.p, opts...)
	if err != nil {
		return nil, err
	}
	r.d = d

	graphMu.Lock()
	defer graphMu.Unlock()
	var loss *gorgonia.Node
	for i, p := range r.p {
		c := tensor.New(tensor.Of(p.Dtype()), tensor.WithShape(p.Shape().Clone()...))
		r.c = append(r.c, c)
		cn := gorgonia.NewTensor(g, p.Dtype(), p.Dims(), gorgonia.WithShape(p.Shape().Clone()...),
			gorgonia.WithName(fmt.Sprintf("grad%d", i)), gorgonia.WithValue(c))
		h, err := d.Hook(p)
		if err != nil {
			return nil, err
		}
		prod, err := gorgonia.HadamardProd(h, cn)
		if err != nil {
			return nil, fmt.Errorf("transformer: relay: %w", err)
		}
		s, err := gorgonia.Sum(prod)
		if err != nil {
			return nil, fmt.Errorf("transformer: relay: %w", err)
		}
		if loss == nil {
			loss = s
		} else if loss, err = gorgonia.Add(loss, s); err != nil {
			return nil, fmt.Errorf("transformer: relay: %w", err)
		}
	}
	if _, err := gorgonia.Grad(loss, r.p...); err != nil {
		return nil, fmt.Errorf("transformer: relay gradients: %w", err)
	}
	r.vm = gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(r.p...))
	r.solver = d.Solver(inner)
	return r, nil
}

// DDP returns the relay's DDP.
func (r *ddpRelay) DDP() *ddp.DDP { return r.d }

// Step implements gorgonia.Solver for the trainer's parameters: it relays
// their gradients to the DDP, which averages them over the ranks, and steps
// the inner solver on the average. It zeroes the trainer's gradients, as
// solvers do. model must be the trainer's parameters.
func (r *ddpRelay) Step(model []gorgonia.ValueGrad) error {
	if len(model) != len(r.q) {
		return fmt.Errorf("transformer: relay step on %d values, want %d", len(model), len(r.q))
	}
	for i, vg := range model {
		grad, err := vg.Grad()
		if err != nil {
			return fmt.Errorf("transformer: relay: gradient of %s: %w", r.q[i].Name(), err)
		}
		gd, ok := grad.(*tensor.Dense)
		if !ok || gd.Size() != r.c[i].Size() || gd.Dtype() != r.c[i].Dtype() {
			return fmt.Errorf("transformer: relay: gradient of %s is %T %v", r.q[i].Name(), grad, grad.Shape())
		}
		if err := copyDense(r.c[i], gd); err != nil {
			return err
		}
		gd.Zero()
	}
	defer r.vm.Reset()
	if err := r.vm.RunAll(); err != nil {
		if derr := r.d.Err(); derr != nil {
			return derr // matchable; Gorgonia's wrapping is not
		}
		return fmt.Errorf("transformer: relay: %w", err)
	}
	return r.solver.Step(gorgonia.NodesToValueGrads(r.p))
}

// Close releases the relay's machine.
func (r *ddpRelay) Close() error { return r.vm.Close() }

// copyDense copies src's elements into dst (same dtype and size).
func copyDense(dst, src *tensor.Dense) error {
	switch d := dst.Data().(type) {
	case []float32:
		copy(d, src.Data().([]float32))
	case []float64:
		copy(d, src.Data().([]float64))
	default:
		return fmt.Errorf("transformer: relay: unsupported data %T", d)
	}
	return nil
}

// errNoSolver means a lateSolver stepped before it was set.
var errNoSolver = errors.New("transformer: solver not set")

// lateSolver is a gorgonia.Solver whose implementation is set after the
// trainer that holds it is built.
type lateSolver struct{ s gorgonia.Solver }

func (l *lateSolver) Step(model []gorgonia.ValueGrad) error {
	if l.s == nil {
		return errNoSolver
	}
	return l.s.Step(model)
}
