package optim

import (
	"fmt"
	"math"
	"strings"

	"gorgonia.org/tensor"

	"github.com/gdist/gdist/train/checkpoint"
)

// intPrefix marks the Flat integers (other than "iter") among a
// checkpoint.Optimizer's scalars.
const intPrefix = "int."

// Checkpoint returns st as a checkpoint.Optimizer, the form train/checkpoint
// stores: Kind and Iter as they are, Flat's floats as Scalars under their own
// names and its other integers as Scalars named "int.<name>", its strings
// (but "kind") as Strings, and its tensors as Slots named as in Flat
// ("param.<i>.<slot>") with the parameter's shape. The slots share st's
// slices: clone st first if it is still being changed (State already returns
// a copy).
func (st State) Checkpoint() *checkpoint.Optimizer {
	f := st.Flatten()
	o := &checkpoint.Optimizer{Kind: f.Strings["kind"], Iter: f.Ints["iter"],
		Scalars: make(map[string]float64, len(f.Floats)+len(f.Ints)),
		Strings: make(map[string]string, len(f.Strings))}
	for k, v := range f.Floats {
		o.Scalars[k] = v
	}
	for k, v := range f.Ints {
		if k != "iter" {
			o.Scalars[intPrefix+k] = float64(v)
		}
	}
	for k, v := range f.Strings {
		if k != "kind" {
			o.Strings[k] = v
		}
	}
	for _, t := range f.Tensors {
		var back any = t.F64
		if t.F32 != nil {
			back = t.F32
		}
		var d *tensor.Dense
		if len(t.Shape) == 0 {
			d = tensor.New(tensor.WithShape(), tensor.WithBacking(back))
		} else {
			d = tensor.New(tensor.WithShape(t.Shape...), tensor.WithBacking(back))
		}
		o.Slots = append(o.Slots, checkpoint.Named{Name: t.Name, Tensor: d})
	}
	return o
}

// FromCheckpoint rebuilds a State from a checkpoint.Optimizer written by
// State.Checkpoint, checking it as Unflatten does (errors match
// ErrInvalidState, or the sentinel of the field that is wrong). The State
// shares the slots' backing slices.
func FromCheckpoint(o *checkpoint.Optimizer) (State, error) {
	if o == nil {
		return State{}, fmt.Errorf("%w: no optimizer state in the checkpoint", ErrInvalidState)
	}
	f := Flat{Strings: map[string]string{"kind": o.Kind}, Ints: map[string]int64{"iter": o.Iter},
		Floats: map[string]float64{}}
	for k, v := range o.Strings {
		f.Strings[k] = v
	}
	for k, v := range o.Scalars {
		name, isInt := strings.CutPrefix(k, intPrefix)
		if !isInt {
			f.Floats[k] = v
			continue
		}
		if v != math.Trunc(v) || math.Abs(v) > 1<<53 {
			return State{}, fmt.Errorf("%w: checkpoint scalar %q is %v, not an integer", ErrInvalidState, k, v)
		}
		f.Ints[name] = int64(v)
	}
	for _, s := range o.Slots {
		d, ok := s.Tensor.(*tensor.Dense)
		if !ok {
			return State{}, fmt.Errorf("%w: checkpoint slot %q is a %T, not a *tensor.Dense", ErrInvalidState, s.Name, s.Tensor)
		}
		ft := FlatTensor{Name: s.Name}
		if shape := d.Shape(); !shape.IsScalar() {
			ft.Shape = append([]int(nil), shape...)
		}
		switch v := d.Data().(type) {
		case []float32:
			ft.F32 = v
		case []float64:
			ft.F64 = v
		case float32:
			ft.F32 = []float32{v}
		case float64:
			ft.F64 = []float64{v}
		default:
			return State{}, fmt.Errorf("%w: checkpoint slot %q holds %T", ErrDtype, s.Name, v)
		}
		f.Tensors = append(f.Tensors, ft)
	}
	return Unflatten(f)
}
