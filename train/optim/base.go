package optim

import (
	"fmt"
	"math"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// binding is one parameter's weights and gradient, resolved for one Step.
// Exactly one group of fields is set.
type binding struct {
	w32, g32   []float32     // *tensor.Dense float32
	w64, g64   []float64     // *tensor.Dense float64
	sw32, sg32 *gorgonia.F32 // scalar float32
	sw64, sg64 *gorgonia.F64 // scalar float64
}

// base is what the three solvers share: hyper-parameters, the iteration
// count, the per-parameter state and the bindings reused from step to step.
// A solver is not safe for concurrent use; neither are Gorgonia's.
type base struct {
	kind  Kind
	h     Hyper
	iter  int
	state []ParamState // nil until the first Step, Init or SetState
	binds []binding
}

// Kind returns the solver's algorithm.
func (b *base) Kind() Kind { return b.kind }

// Iter returns the number of steps taken.
func (b *base) Iter() int { return b.iter }

// Hyper returns the solver's hyper-parameters.
func (b *base) Hyper() Hyper { return b.h }

// State returns a deep copy of the solver's state: the caller owns it and
// the solver never touches it again.
func (b *base) State() State {
	return State{Kind: b.kind, Hyper: b.h, Iter: b.iter, Params: b.state}.Clone()
}

// SetState replaces the solver's hyper-parameters, iteration count and
// per-parameter state with a copy of st (the solver does not retain st's
// slices). It fails, changing nothing, if st is malformed, is another kind's,
// or — when the solver already holds state for parameters (after a Step or
// Init) — describes other parameters (count, dtype, shape or name). Into a
// fresh solver st is taken as it is, and the next Step checks it against
// the model before changing anything.
func (b *base) SetState(st State) error {
	if err := st.validate(); err != nil {
		return err
	}
	cur := State{Kind: b.kind, Params: b.state}
	if err := checkCompatible(&cur, &st); err != nil {
		return err
	}
	c := st.Clone()
	b.h, b.iter = c.Hyper, c.Iter
	b.state = c.Params
	if len(c.Params) == 0 {
		b.state = nil
	}
	return nil
}

// Init binds the solver to model: it checks the parameters as Step does and
// allocates their zeroed state, without stepping. After Init, State lists
// every parameter. Init on a solver that already holds state checks model
// against it and changes nothing.
func (b *base) Init(model []gorgonia.ValueGrad) error {
	if err := b.bind(model); err != nil {
		return err
	}
	if b.state == nil {
		b.allocState(model)
	}
	return nil
}

// begin binds model for a step and allocates the state on the first one.
func (b *base) begin(model []gorgonia.ValueGrad) error {
	if err := b.bind(model); err != nil {
		return err
	}
	if b.state == nil {
		b.allocState(model)
	}
	b.iter++
	return nil
}

func nameOf(n gorgonia.ValueGrad) string {
	if nm, ok := n.(gorgonia.Namer); ok {
		return nm.Name()
	}
	return ""
}

// bind resolves every parameter's weights and gradient into b.binds and
// checks them against the state, if any. It changes no state.
func (b *base) bind(model []gorgonia.ValueGrad) error {
	if b.state != nil && len(model) != len(b.state) {
		return &ParamError{Index: -1, Want: fmt.Sprintf("%d parameters", len(b.state)), Got: fmt.Sprintf("%d parameters", len(model)), Err: ErrParamCount}
	}
	if cap(b.binds) < len(model) {
		b.binds = make([]binding, len(model))
	}
	b.binds = b.binds[:len(model)]
	for i, n := range model {
		bd, dt, shape, err := resolve(i, n)
		if err != nil {
			return err
		}
		if b.state != nil {
			if err := sameParam(i, &b.state[i], nameOf(n), dt, shape); err != nil {
				return err
			}
		}
		b.binds[i] = bd
	}
	return nil
}

// resolve returns n's weights and gradient as slices or scalar pointers.
func resolve(i int, n gorgonia.ValueGrad) (bd binding, dt tensor.Dtype, shape []int, err error) {
	w := n.Value()
	g, gerr := n.Grad()
	if gerr != nil {
		return bd, dt, nil, fmt.Errorf("%w: parameter %d (%s): %w", ErrNoGrad, i, nameOf(n), gerr)
	}
	unsupported := func(what string, v any) error {
		return &ParamError{Index: i, Name: nameOf(n), Want: "float32 or float64 *tensor.Dense, *gorgonia.F32 or *gorgonia.F64", Got: fmt.Sprintf("%s %T", what, v), Err: ErrUnsupported}
	}
	switch wv := w.(type) {
	case *tensor.Dense:
		gv, ok := g.(*tensor.Dense)
		if !ok {
			return bd, dt, nil, unsupported("gradient", g)
		}
		if wv.RequiresIterator() || gv.RequiresIterator() {
			return bd, dt, nil, unsupported("view or masked tensor", w)
		}
		dt = wv.Dtype()
		if gv.Dtype() != dt {
			return bd, dt, nil, &ParamError{Index: i, Name: nameOf(n), Want: "gradient " + dtypeName(dt), Got: "gradient " + dtypeName(gv.Dtype()), Err: ErrDtype}
		}
		shape = wv.Shape()
		if !gv.Shape().Eq(wv.Shape()) {
			return bd, dt, nil, &ParamError{Index: i, Name: nameOf(n), Want: fmt.Sprintf("gradient shape %v", wv.Shape()), Got: fmt.Sprint(gv.Shape()), Err: ErrShape}
		}
		switch dt {
		case tensor.Float32:
			bd.w32, bd.g32 = wv.Float32s(), gv.Float32s()
		case tensor.Float64:
			bd.w64, bd.g64 = wv.Float64s(), gv.Float64s()
		default:
			return bd, dt, nil, &ParamError{Index: i, Name: nameOf(n), Want: "float32 or float64", Got: dtypeName(dt), Err: ErrDtype}
		}
		if n := shapeNumel(shape); len(bd.w32)+len(bd.w64) != n || len(bd.g32)+len(bd.g64) != n {
			return bd, dt, nil, unsupported("tensor whose backing is not its shape", w)
		}
		return bd, dt, shape, nil
	case *gorgonia.F32:
		gv, ok := g.(*gorgonia.F32)
		if !ok {
			return bd, dt, nil, &ParamError{Index: i, Name: nameOf(n), Want: "gradient *gorgonia.F32", Got: fmt.Sprintf("gradient %T", g), Err: ErrDtype}
		}
		bd.sw32, bd.sg32 = wv, gv
		return bd, tensor.Float32, nil, nil
	case *gorgonia.F64:
		gv, ok := g.(*gorgonia.F64)
		if !ok {
			return bd, dt, nil, &ParamError{Index: i, Name: nameOf(n), Want: "gradient *gorgonia.F64", Got: fmt.Sprintf("gradient %T", g), Err: ErrDtype}
		}
		bd.sw64, bd.sg64 = wv, gv
		return bd, tensor.Float64, nil, nil
	}
	return bd, dt, nil, unsupported("value", w)
}

func shapeNumel(s []int) int {
	n := 1
	for _, d := range s {
		n *= d
	}
	return n
}

// allocState allocates zeroed slots for the bound parameters.
func (b *base) allocState(model []gorgonia.ValueGrad) {
	names := b.kind.Slots()
	b.state = make([]ParamState, len(model))
	for i, bd := range b.binds {
		p := ParamState{Index: i, Name: nameOf(model[i]), Dtype: tensor.Float64}
		switch {
		case bd.w32 != nil || bd.sw32 != nil:
			p.Dtype = tensor.Float32
		}
		if sh := model[i].Value().Shape(); len(sh) > 0 && (bd.w32 != nil || bd.w64 != nil) {
			p.Shape = append([]int(nil), sh...)
		}
		n := p.Numel()
		if len(names) > 0 {
			p.Slots = make([]Slot, len(names))
		}
		for j, nm := range names {
			p.Slots[j].Name = nm
			if p.Dtype == tensor.Float32 {
				p.Slots[j].F32 = make([]float32, n)
			} else {
				p.Slots[j].F64 = make([]float64, n)
			}
		}
		b.state[i] = p
	}
}

// corrections returns Adam's bias corrections for the current iteration.
func (b *base) corrections() (c1, c2 float64) {
	return 1 - math.Pow(b.h.Beta1, float64(b.iter)), 1 - math.Pow(b.h.Beta2, float64(b.iter))
}
