package optim

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"gorgonia.org/tensor"
)

// Flat is a State as named scalars and named tensors: the form a checkpoint
// writer stores. Names follow this scheme (a writer may prefix them all,
// e.g. with "optim."):
//
//	Strings  "kind"                 "sgd", "momentum" or "adam"
//	         "param.<i>.name"       parameter i's name ("" if none)
//	         "param.<i>.dtype"      "float32" or "float64"
//	         "param.<i>.shape"      dimensions joined by "x" ("" for a scalar)
//	Ints     "iter"                 steps taken
//	         "params"               number of parameters
//	         "use_l1", "use_l2"     1 if the penalty is applied, else 0
//	Floats   "lr", "momentum", "beta1", "beta2", "eps", "batch", "clip",
//	         "l1", "l2"             the hyper-parameters (Hyper's fields)
//	Tensors  "param.<i>.<slot>"     slot <slot> of parameter i, with the
//	                                parameter's shape, e.g. "param.0.m"
//
// <i> is the parameter's decimal index in the model slice.
type Flat struct {
	Strings map[string]string
	Ints    map[string]int64
	Floats  map[string]float64
	Tensors []FlatTensor
}

// FlatTensor is one named slot. Exactly one of F32 and F64 is set.
type FlatTensor struct {
	Name  string
	Shape []int
	F32   []float32
	F64   []float64
}

// Flatten returns st in flat form. The tensors' slices are st's (not
// copies): clone st first if it is still being changed.
func (st State) Flatten() Flat {
	h := st.Hyper
	f := Flat{
		Strings: map[string]string{"kind": string(st.Kind)},
		Ints: map[string]int64{
			"iter":   int64(st.Iter),
			"params": int64(len(st.Params)),
			"use_l1": b2i(h.UseL1Reg),
			"use_l2": b2i(h.UseL2Reg),
		},
		Floats: map[string]float64{
			"lr": h.LearnRate, "momentum": h.Momentum, "beta1": h.Beta1, "beta2": h.Beta2,
			"eps": h.Eps, "batch": h.Batch, "clip": h.Clip, "l1": h.L1Reg, "l2": h.L2Reg,
		},
	}
	for i, p := range st.Params {
		key := "param." + strconv.Itoa(i) + "."
		f.Strings[key+"name"] = p.Name
		f.Strings[key+"dtype"] = dtypeName(p.Dtype)
		f.Strings[key+"shape"] = joinShape(p.Shape)
		for _, s := range p.Slots {
			f.Tensors = append(f.Tensors, FlatTensor{Name: key + s.Name, Shape: slices.Clone(p.Shape), F32: s.F32, F64: s.F64})
		}
	}
	return f
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func joinShape(s []int) string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = strconv.Itoa(d)
	}
	return strings.Join(parts, "x")
}

// Unflatten rebuilds a State from its flat form, checking that every name the
// scheme requires is present, that no tensor is left over and that the state
// is valid. The State shares f's tensor slices.
func Unflatten(f Flat) (State, error) {
	bad := func(format string, args ...any) (State, error) {
		return State{}, fmt.Errorf("%w: flat state: %s", ErrInvalidState, fmt.Sprintf(format, args...))
	}
	str := func(k string) (string, bool) { v, ok := f.Strings[k]; return v, ok }
	var st State
	kind, ok := str("kind")
	if !ok {
		return bad("no %q", "kind")
	}
	st.Kind = Kind(kind)
	ints := map[string]int64{}
	for _, k := range []string{"iter", "params", "use_l1", "use_l2"} {
		v, ok := f.Ints[k]
		if !ok {
			return bad("no %q", k)
		}
		ints[k] = v
	}
	floats := map[string]float64{}
	for _, k := range []string{"lr", "momentum", "beta1", "beta2", "eps", "batch", "clip", "l1", "l2"} {
		v, ok := f.Floats[k]
		if !ok {
			return bad("no %q", k)
		}
		floats[k] = v
	}
	for _, k := range []string{"use_l1", "use_l2"} {
		if ints[k] != 0 && ints[k] != 1 {
			return bad("%q is %d, want 0 or 1", k, ints[k])
		}
	}
	st.Hyper = Hyper{
		LearnRate: floats["lr"], Momentum: floats["momentum"], Beta1: floats["beta1"], Beta2: floats["beta2"],
		Eps: floats["eps"], Batch: floats["batch"], Clip: floats["clip"], L1Reg: floats["l1"], L2Reg: floats["l2"],
		UseL1Reg: ints["use_l1"] == 1, UseL2Reg: ints["use_l2"] == 1,
	}
	st.Iter = int(ints["iter"])
	n := ints["params"]
	if n < 0 || n > int64(len(f.Strings)) {
		return bad("%q is %d", "params", n)
	}
	tensors := make(map[string]FlatTensor, len(f.Tensors))
	for _, t := range f.Tensors {
		if _, dup := tensors[t.Name]; dup {
			return bad("tensor %q twice", t.Name)
		}
		tensors[t.Name] = t
	}
	slots := st.Kind.Slots()
	if n > 0 {
		st.Params = make([]ParamState, n)
	}
	used := 0
	for i := range st.Params {
		key := "param." + strconv.Itoa(i) + "."
		name, ok1 := str(key + "name")
		dt, ok2 := str(key + "dtype")
		shape, ok3 := str(key + "shape")
		if !ok1 || !ok2 || !ok3 {
			return bad("parameter %d: no name, dtype or shape", i)
		}
		p := ParamState{Index: i, Name: name}
		switch dt {
		case "float32":
			p.Dtype = tensor.Float32
		case "float64":
			p.Dtype = tensor.Float64
		default:
			return bad("parameter %d: dtype %q", i, dt)
		}
		if shape != "" {
			for _, d := range strings.Split(shape, "x") {
				v, err := strconv.Atoi(d)
				if err != nil || v <= 0 {
					return bad("parameter %d: shape %q", i, shape)
				}
				p.Shape = append(p.Shape, v)
			}
		}
		for _, sn := range slots {
			t, ok := tensors[key+sn]
			if !ok {
				return bad("no tensor %q", key+sn)
			}
			if !slices.Equal(t.Shape, p.Shape) {
				return bad("tensor %q has shape %v, parameter shape is %v", t.Name, t.Shape, p.Shape)
			}
			p.Slots = append(p.Slots, Slot{Name: sn, F32: t.F32, F64: t.F64})
			used++
		}
		st.Params[i] = p
	}
	if used != len(f.Tensors) {
		return bad("%d tensors do not belong to the state", len(f.Tensors)-used)
	}
	if err := st.validate(); err != nil {
		return State{}, err
	}
	return st, nil
}
