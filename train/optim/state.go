package optim

import (
	"fmt"
	"math"
	"slices"

	"gorgonia.org/tensor"
)

// Hyper holds a solver's hyper-parameters. Fields that a kind does not use
// are zero: Momentum only for KindMomentum; Beta1, Beta2 and Eps only for
// KindAdam.
type Hyper struct {
	LearnRate float64 // step size, >= 0
	Momentum  float64 // Momentum's velocity decay, >= 0
	Beta1     float64 // Adam's first-moment decay, in [0, 1)
	Beta2     float64 // Adam's second-moment decay, in [0, 1)
	Eps       float64 // Adam's denominator smoothing, >= 0
	Batch     float64 // gradients are divided by Batch when it is > 1; > 0
	Clip      float64 // gradients are clamped to [-Clip, Clip] when it is > 0
	L1Reg     float64 // L1 penalty, applied when UseL1Reg; >= 0
	L2Reg     float64 // L2 penalty, applied when UseL2Reg; >= 0
	UseL1Reg  bool
	UseL2Reg  bool
}

// State is a solver's complete state, as plain data: enough to continue a run
// bitwise identically in a fresh solver.
//
// Params[i] is the state of parameter i of the model slice passed to Step
// (Params[i].Index == i). It is empty until the first Step or Init.
type State struct {
	Kind   Kind
	Hyper  Hyper
	Iter   int // steps taken; Adam's bias correction uses it
	Params []ParamState
}

// ParamState is the state one solver keeps for one parameter.
type ParamState struct {
	Index int          // position in the model slice
	Name  string       // the parameter's name (gorgonia.Namer), "" if none
	Dtype tensor.Dtype // tensor.Float32 or tensor.Float64
	Shape []int        // the parameter's shape; empty for a scalar
	// Slots are the kind's slots (Kind.Slots()), in that order, each of
	// Numel() elements of Dtype.
	Slots []Slot
}

// Slot is one named per-parameter buffer. Exactly one of F32 and F64 is set,
// according to the parameter's dtype.
type Slot struct {
	Name string
	F32  []float32
	F64  []float64
}

// Numel returns the number of elements of the parameter (1 for a scalar).
func (p ParamState) Numel() int {
	n := 1
	for _, d := range p.Shape {
		n *= d
	}
	return n
}

// Slot returns the slot with the given name. The slot's slices are p's.
func (p ParamState) Slot(name string) (Slot, bool) {
	for _, s := range p.Slots {
		if s.Name == name {
			return s, true
		}
	}
	return Slot{}, false
}

// Len returns the slot's number of elements.
func (s Slot) Len() int {
	if s.F32 != nil {
		return len(s.F32)
	}
	return len(s.F64)
}

// Clone returns a deep copy of st.
func (st State) Clone() State {
	out := st
	out.Params = nil
	if st.Params != nil {
		out.Params = make([]ParamState, len(st.Params))
		for i, p := range st.Params {
			out.Params[i] = p.clone()
		}
	}
	return out
}

func (p ParamState) clone() ParamState {
	out := p
	out.Shape, out.Slots = nil, nil
	if len(p.Shape) > 0 {
		out.Shape = slices.Clone(p.Shape)
	}
	if len(p.Slots) > 0 {
		out.Slots = make([]Slot, len(p.Slots))
	}
	for j, s := range p.Slots {
		out.Slots[j] = Slot{Name: s.Name, F32: slices.Clone(s.F32), F64: slices.Clone(s.F64)}
	}
	return out
}

// validate checks st in itself: kind, hyper-parameters, indices, slots.
func (st State) validate() error {
	if !st.Kind.valid() {
		return &ParamError{Index: -1, Want: "sgd, momentum or adam", Got: fmt.Sprintf("%q", st.Kind), Err: ErrKind}
	}
	if err := st.Hyper.validate(st.Kind); err != nil {
		return err
	}
	if st.Iter < 0 {
		return &ParamError{Index: -1, Want: "iteration count >= 0", Got: fmt.Sprint(st.Iter), Err: ErrInvalidState}
	}
	names := st.Kind.Slots()
	for i, p := range st.Params {
		bad := func(slot, want, got string) error {
			return &ParamError{Index: i, Name: p.Name, Slot: slot, Want: want, Got: got, Err: ErrInvalidState}
		}
		if p.Index != i {
			return bad("", fmt.Sprintf("index %d", i), fmt.Sprintf("index %d", p.Index))
		}
		if p.Dtype != tensor.Float32 && p.Dtype != tensor.Float64 {
			return &ParamError{Index: i, Name: p.Name, Want: "float32 or float64", Got: dtypeName(p.Dtype), Err: ErrDtype}
		}
		for _, d := range p.Shape {
			if d <= 0 {
				return &ParamError{Index: i, Name: p.Name, Want: "positive dimensions", Got: fmt.Sprint(p.Shape), Err: ErrShape}
			}
		}
		if len(p.Slots) != len(names) {
			return bad("", fmt.Sprintf("slots %v", names), fmt.Sprintf("%d slots", len(p.Slots)))
		}
		n := p.Numel()
		for j, s := range p.Slots {
			if s.Name != names[j] {
				return bad(s.Name, fmt.Sprintf("slot %q", names[j]), fmt.Sprintf("slot %q", s.Name))
			}
			if (s.F32 != nil) == (s.F64 != nil) || (s.F32 != nil) != (p.Dtype == tensor.Float32) {
				return &ParamError{Index: i, Name: p.Name, Slot: s.Name, Want: dtypeName(p.Dtype) + " data", Got: slotKind(s), Err: ErrDtype}
			}
			if s.Len() != n {
				return &ParamError{Index: i, Name: p.Name, Slot: s.Name, Want: fmt.Sprintf("%d elements", n), Got: fmt.Sprintf("%d elements", s.Len()), Err: ErrShape}
			}
		}
	}
	return nil
}

func slotKind(s Slot) string {
	switch {
	case s.F32 != nil && s.F64 != nil:
		return "float32 and float64 data"
	case s.F32 != nil:
		return "float32 data"
	case s.F64 != nil:
		return "float64 data"
	}
	return "no data"
}

func dtypeName(dt tensor.Dtype) string {
	if dt.Type == nil {
		return "none"
	}
	return dt.String()
}

// checkCompatible checks that st can replace cur: same kind, and if cur
// describes parameters, the same parameters (count, dtype, shape, name).
func checkCompatible(cur, st *State) error {
	if st.Kind != cur.Kind {
		return &ParamError{Index: -1, Want: fmt.Sprintf("%q", cur.Kind), Got: fmt.Sprintf("%q", st.Kind), Err: ErrKind}
	}
	if cur.Params == nil || st.Params == nil {
		return nil
	}
	if len(st.Params) != len(cur.Params) {
		return &ParamError{Index: -1, Want: fmt.Sprint(len(cur.Params)), Got: fmt.Sprint(len(st.Params)), Err: ErrParamCount}
	}
	for i := range st.Params {
		if err := sameParam(i, &cur.Params[i], st.Params[i].Name, st.Params[i].Dtype, st.Params[i].Shape); err != nil {
			return err
		}
	}
	return nil
}

// sameParam checks that a parameter with name, dtype and shape matches want.
// Names are compared only when both are known.
func sameParam(i int, want *ParamState, name string, dt tensor.Dtype, shape []int) error {
	if dt != want.Dtype {
		return &ParamError{Index: i, Name: name, Want: dtypeName(want.Dtype), Got: dtypeName(dt), Err: ErrDtype}
	}
	if !slices.Equal(shape, want.Shape) {
		return &ParamError{Index: i, Name: name, Want: fmt.Sprint(want.Shape), Got: fmt.Sprint(shape), Err: ErrShape}
	}
	if name != "" && want.Name != "" && name != want.Name {
		return &ParamError{Index: i, Name: name, Want: fmt.Sprintf("%q", want.Name), Got: fmt.Sprintf("%q", name), Err: ErrName}
	}
	return nil
}

// validate checks h for kind: ranges, and zero in the fields kind ignores.
func (h Hyper) validate(kind Kind) error {
	type field struct {
		name       string
		v          float64
		used, ok   bool
		constraint string
	}
	finite := func(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }
	nonNeg := func(x float64) bool { return finite(x) && x >= 0 }
	beta := func(x float64) bool { return finite(x) && x >= 0 && x < 1 }
	fields := []field{
		{"LearnRate", h.LearnRate, true, nonNeg(h.LearnRate), "finite and >= 0"},
		{"Momentum", h.Momentum, kind == KindMomentum, nonNeg(h.Momentum), "finite and >= 0"},
		{"Beta1", h.Beta1, kind == KindAdam, beta(h.Beta1), "in [0, 1)"},
		{"Beta2", h.Beta2, kind == KindAdam, beta(h.Beta2), "in [0, 1)"},
		{"Eps", h.Eps, kind == KindAdam, nonNeg(h.Eps), "finite and >= 0"},
		{"Batch", h.Batch, true, finite(h.Batch) && h.Batch > 0, "finite and > 0"},
		{"Clip", h.Clip, true, nonNeg(h.Clip), "finite and >= 0 (0: no clipping)"},
		{"L1Reg", h.L1Reg, true, nonNeg(h.L1Reg) && (h.UseL1Reg || h.L1Reg == 0), "finite and >= 0, and 0 unless UseL1Reg"},
		{"L2Reg", h.L2Reg, true, nonNeg(h.L2Reg) && (h.UseL2Reg || h.L2Reg == 0), "finite and >= 0, and 0 unless UseL2Reg"},
	}
	for _, f := range fields {
		switch {
		case !f.used && f.v != 0:
			return &ParamError{Index: -1, Slot: "", Want: fmt.Sprintf("Hyper.%s 0 for %s", f.name, kind), Got: fmt.Sprint(f.v), Err: ErrInvalidState}
		case f.used && !f.ok:
			return &ParamError{Index: -1, Want: fmt.Sprintf("Hyper.%s %s", f.name, f.constraint), Got: fmt.Sprint(f.v), Err: ErrInvalidState}
		}
	}
	return nil
}
