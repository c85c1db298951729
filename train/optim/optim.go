package optim

import (
	"errors"
	"fmt"

	"gorgonia.org/gorgonia"

	"github.com/gdist/gdist/internal/errs"
)

// Kind names a solver's algorithm. It is stored in State and in checkpoints.
type Kind string

// The solver kinds.
const (
	KindSGD      Kind = "sgd"
	KindMomentum Kind = "momentum"
	KindAdam     Kind = "adam"
)

// Slot names: the per-parameter buffers a solver keeps. SGD keeps none.
const (
	SlotVelocity = "velocity" // Momentum: the velocity
	SlotM        = "m"        // Adam: the running mean of gradients
	SlotV        = "v"        // Adam: the running mean of squared gradients
)

// Slots returns the names of the per-parameter slots of a solver kind, in the
// order State lists them, or nil for an unknown kind. The caller owns the
// returned slice.
func (k Kind) Slots() []string {
	switch k {
	case KindSGD:
		return []string{}
	case KindMomentum:
		return []string{SlotVelocity}
	case KindAdam:
		return []string{SlotM, SlotV}
	}
	return nil
}

func (k Kind) valid() bool { return k.Slots() != nil }

// Solver is a gorgonia.Solver whose complete state can be exported and
// restored. *SGD, *Momentum and *Adam implement it.
type Solver interface {
	gorgonia.Solver
	// Kind returns the solver's algorithm.
	Kind() Kind
	// State returns a deep copy of the solver's state.
	State() State
	// SetState replaces the solver's state with a copy of st, or returns an
	// error and changes nothing.
	SetState(st State) error
	// Init allocates zeroed state for model, as the first Step would, so
	// that State describes every parameter before any step.
	Init(model []gorgonia.ValueGrad) error
}

// Errors. Every error of this package matches one of them with errors.Is.
var (
	// ErrInvalidArgument is matched by the error of a constructor option
	// with an invalid value, of one that does not apply to the solver, and
	// of a nil one. It is the value every gdist package exports under this
	// name (errs.ErrInvalidArgument).
	ErrInvalidArgument = errs.ErrInvalidArgument
	// ErrKind means a state belongs to another kind of solver.
	ErrKind = errors.New("optim: solver kind mismatch")
	// ErrParamCount means a state or a model has another number of
	// parameters than the solver's state.
	ErrParamCount = errors.New("optim: parameter count mismatch")
	// ErrShape means a parameter, its gradient or a slot has another shape
	// (or length) than expected.
	ErrShape = errors.New("optim: shape mismatch")
	// ErrDtype means a parameter, its gradient or a slot has another element
	// type than expected.
	ErrDtype = errors.New("optim: dtype mismatch")
	// ErrName means a parameter has another name than the state recorded
	// for its index.
	ErrName = errors.New("optim: parameter name mismatch")
	// ErrInvalidState means a state is malformed in itself (a missing or
	// duplicate slot, an index out of order, a negative iteration count).
	ErrInvalidState = errors.New("optim: invalid state")
	// ErrUnsupported means a parameter's value is not a float32 or float64
	// *tensor.Dense, *gorgonia.F32 or *gorgonia.F64, or a tensor that needs
	// an iterator (a view, transposed or masked).
	ErrUnsupported = errors.New("optim: unsupported value")
	// ErrNoGrad means a parameter has no gradient (ValueGrad.Grad failed).
	ErrNoGrad = errors.New("optim: no gradient")
)

// OptionError reports an option with an invalid value, or one given to a
// solver it does not apply to. It unwraps to ErrInvalidArgument.
type OptionError struct {
	Option string  // e.g. "WithBeta1"
	Value  float64 // the value given
	Reason string  // what the value must be, or which solver the option is for
}

func (e *OptionError) Error() string {
	return fmt.Sprintf("optim: invalid option %s(%v): %s", e.Option, e.Value, e.Reason)
}

// Unwrap returns ErrInvalidArgument.
func (e *OptionError) Unwrap() error { return ErrInvalidArgument }

// ParamError reports a problem with one parameter (Index >= 0) or with the
// solver as a whole (Index < 0). Err is one of the package's sentinels
// (ErrShape, ErrDtype, ErrKind, ...), which Unwrap returns.
type ParamError struct {
	Index int    // the parameter's index in the model, or -1
	Name  string // the parameter's name, if known
	Slot  string // the slot concerned, if any
	Want  string // what was expected
	Got   string // what was found
	Err   error  // the sentinel
}

func (e *ParamError) Error() string {
	s := e.Err.Error()
	if e.Index >= 0 {
		s += fmt.Sprintf(": parameter %d", e.Index)
		if e.Name != "" {
			s += fmt.Sprintf(" (%s)", e.Name)
		}
	}
	if e.Slot != "" {
		s += fmt.Sprintf(" slot %q", e.Slot)
	}
	if e.Want != "" || e.Got != "" {
		s += fmt.Sprintf(": want %s, got %s", e.Want, e.Got)
	}
	return s
}

// Unwrap returns the sentinel.
func (e *ParamError) Unwrap() error { return e.Err }

// New returns a solver of the given kind configured from st and holding a
// copy of its state: the way to resume a run from a checkpoint without
// repeating the solver's options.
func New(st State) (Solver, error) {
	var s Solver
	switch st.Kind {
	case KindSGD:
		s = &SGD{base: base{kind: KindSGD}}
	case KindMomentum:
		s = &Momentum{base: base{kind: KindMomentum}}
	case KindAdam:
		s = &Adam{base: base{kind: KindAdam}}
	default:
		return nil, &ParamError{Index: -1, Want: "sgd, momentum or adam", Got: fmt.Sprintf("%q", st.Kind), Err: ErrKind}
	}
	if err := s.SetState(st); err != nil {
		return nil, err
	}
	return s, nil
}
