package fsdp

import (
	"fmt"
	"hash"

	"github.com/chewxy/hm"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist/internal/shard"
)

// Hook returns the node to use in the forward pass in place of parameter p:
// p's gathered value. Call it right before each op that consumes p, as
// models' ForwardHooked do: the first hook of a unit marks where the unit
// begins, in the forward pass (its parameters are gathered there, and the
// next unit's gather starts) and, through its gradient op, in the backward
// pass (where the unit's gradients are complete and are reduce-scattered,
// and the unit before it must be gathered again).
//
// Hook returns the same node for every use of p. The units must be used one
// after another: a use of a parameter after another unit has begun fails
// with ErrUnitOrder. Like all graph construction it must not run
// concurrently with other Gorgonia graph building.
func (f *FSDP) Hook(p *gorgonia.Node) (*gorgonia.Node, error) {
	i, ok := f.index[p]
	if !ok {
		return nil, fmt.Errorf("fsdp: hook of %v: %w", p, ErrNotParam)
	}
	u := f.units[f.unitOf[i]]
	f.mu.Lock()
	if err := f.closedLocked("hook of " + p.Name()); err != nil {
		f.mu.Unlock()
		return nil, err
	}
	switch {
	case u == f.building:
	case u.pos >= 0:
		f.mu.Unlock()
		return nil, fmt.Errorf("fsdp: %s of unit %d used after unit %d began: %w", p.Name(), u.k, f.building.k, ErrUnitOrder)
	default:
		u.pos, u.first = len(f.order), i
		f.order = append(f.order, u)
		f.building = u
		if f.slot(u.pos) != f.slot(u.k) {
			if err := f.bindUnit(u, f.slot(u.pos)); err != nil {
				f.mu.Unlock()
				return nil, err
			}
		}
	}
	h := f.hooks[i]
	f.mu.Unlock()
	if h != nil {
		return h, nil
	}
	h, err := gorgonia.ApplyOp(&hookOp{f: f, i: i}, p)
	if err != nil {
		return nil, fmt.Errorf("fsdp: hook of %s: %w", p.Name(), err)
	}
	f.mu.Lock()
	f.hooks[i] = h
	f.mu.Unlock()
	return h, nil
}

// hookOp is hook(p): p's value gathered, the identity on values.
type hookOp struct {
	f *FSDP
	i int
}

var _ gorgonia.SDOp = (*hookOp)(nil)

func (op *hookOp) Arity() int { return 1 }

func (op *hookOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	return hm.NewFnType(a, a)
}

func (op *hookOp) InferShape(inputs ...gorgonia.DimSizer) (tensor.Shape, error) {
	return shard.FirstShape(inputs)
}

// Do makes sure the parameter's unit is gathered and returns the
// parameter's tensor over the gather buffer (the node's own value, which
// Wrap bound there).
func (op *hookOp) Do(inputs ...gorgonia.Value) (gorgonia.Value, error) {
	if len(inputs) != 1 {
		return nil, fmt.Errorf("fsdp: %v: want 1 input, got %d: %w", op, len(inputs), ErrInvalidArgument)
	}
	return op.f.forward(op.i)
}

func (op *hookOp) ReturnsPtr() bool     { return false }
func (op *hookOp) CallsExtern() bool    { return false }
func (op *hookOp) OverwritesInput() int { return -1 }

func (op *hookOp) WriteHash(h hash.Hash) { fmt.Fprintf(h, "gdist.fsdp.Hook#%d.%d", op.f.id, op.i) }

func (op *hookOp) Hashcode() uint32 { return shard.HashOf(op) }

func (op *hookOp) String() string { return fmt.Sprintf("FSDPHook(%s)", op.f.params[op.i].Name()) }

func (op *hookOp) DiffWRT(inputs int) []bool { return []bool{true} }

// SymDiff adds the hook's gradient op. It reads the hook's output too, so
// that Gorgonia keeps that register alive (and never writes another op's
// result over the gather buffer in place) until the unit's backward pass
// is over.
func (op *hookOp) SymDiff(inputs gorgonia.Nodes, output, grad *gorgonia.Node) (gorgonia.Nodes, error) {
	f := op.f
	f.mu.Lock()
	exists := f.gradNodes[op.i] != nil
	f.mu.Unlock()
	if exists {
		return nil, fmt.Errorf("fsdp: %v differentiated twice: %w", op, ErrInvalidArgument)
	}
	gn, err := gorgonia.ApplyOp(&hookGradOp{f: f, i: op.i}, grad, output)
	if err != nil {
		return nil, fmt.Errorf("fsdp: gradient of %v: %w", op, err)
	}
	f.mu.Lock()
	f.gradNodes[op.i] = gn
	f.units[f.unitOf[op.i]].nGrad++
	f.mu.Unlock()
	return gorgonia.Nodes{gn}, nil
}

// hookGradOp is the gradient op of hook(p): the identity on the gradient,
// which it also copies into the unit's staging buffer; the gradient op of
// a unit's first hook also ends the unit's backward pass.
type hookGradOp struct {
	f *FSDP
	i int
}

func (op *hookGradOp) Arity() int { return 2 }

func (op *hookGradOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	return hm.NewFnType(a, a, a)
}

func (op *hookGradOp) InferShape(inputs ...gorgonia.DimSizer) (tensor.Shape, error) {
	return shard.FirstShape(inputs)
}

// Do hands the gradient over and returns it. Like DDP's hook, it passes
// the gradient through in place where the compiler allows (UnsafeDo) and
// copies it otherwise.
func (op *hookGradOp) Do(inputs ...gorgonia.Value) (gorgonia.Value, error) {
	if err := op.hand(inputs); err != nil {
		return nil, err
	}
	return shard.Clone(inputs[0])
}

// UnsafeDo is Do when the compiler has given this op its input's register.
func (op *hookGradOp) UnsafeDo(inputs ...gorgonia.Value) (gorgonia.Value, error) {
	if err := op.hand(inputs); err != nil {
		return nil, err
	}
	return inputs[0], nil
}

func (op *hookGradOp) hand(inputs []gorgonia.Value) error {
	if len(inputs) != 2 {
		return fmt.Errorf("fsdp: %v: want 2 inputs, got %d: %w", op, len(inputs), ErrInvalidArgument)
	}
	return op.f.backward(op.i, inputs[0])
}

func (op *hookGradOp) ReturnsPtr() bool     { return true }
func (op *hookGradOp) CallsExtern() bool    { return false }
func (op *hookGradOp) OverwritesInput() int { return 0 }

func (op *hookGradOp) WriteHash(h hash.Hash) {
	fmt.Fprintf(h, "gdist.fsdp.HookGrad#%d.%d", op.f.id, op.i)
}

func (op *hookGradOp) Hashcode() uint32 { return shard.HashOf(op) }

func (op *hookGradOp) String() string {
	return fmt.Sprintf("FSDPHookGrad(%s)", op.f.params[op.i].Name())
}
