package optim_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/train/optim"
)

func TestOptionsValidated(t *testing.T) {
	cases := []struct {
		name string
		new  func() error
	}{
		{"lr NaN", func() error { _, err := optim.NewSGD(optim.WithLearnRate(nanf())); return err }},
		{"lr negative", func() error { _, err := optim.NewAdam(optim.WithLearnRate(-1)); return err }},
		{"clip 0", func() error { _, err := optim.NewSGD(optim.WithClip(0)); return err }},
		{"batch 0", func() error { _, err := optim.NewMomentum(optim.WithBatchSize(0)); return err }},
		{"l2 negative", func() error { _, err := optim.NewMomentum(optim.WithL2Reg(-0.1)); return err }},
		{"momentum negative", func() error { _, err := optim.NewMomentum(optim.WithMomentum(-0.5)); return err }},
		{"beta1 1", func() error { _, err := optim.NewAdam(optim.WithBeta1(1)); return err }},
		{"beta2 negative", func() error { _, err := optim.NewAdam(optim.WithBeta2(-0.1)); return err }},
		{"eps inf", func() error { _, err := optim.NewAdam(optim.WithEps(inff())); return err }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.new()
			require.ErrorIs(t, err, optim.ErrInvalidArgument)
			var oe *optim.OptionError
			require.ErrorAs(t, err, &oe)
			assert.NotEmpty(t, oe.Option)
		})
	}
	_, err := optim.NewSGD(optim.WithLearnRate(0.1), nil)
	require.ErrorIs(t, err, optim.ErrInvalidArgument)
	assert.EqualError(t, err, "optim: NewSGD: option 1 is nil: gdist: invalid argument")
	s, err := optim.NewAdam(optim.WithLearnRate(0.5), optim.WithBeta1(0.5), optim.WithClip(2), optim.WithL2Reg(0))
	require.NoError(t, err)
	h := s.Hyper()
	assert.Equal(t, optim.Hyper{LearnRate: 0.5, Beta1: 0.5, Beta2: 0.999, Eps: 1e-8, Batch: 1, Clip: 2, UseL2Reg: true}, h)
}

// TestOptionsNotApplicable: an option for another solver is refused by the
// constructor, naming the option and the solver, however valid its value.
func TestOptionsNotApplicable(t *testing.T) {
	for _, c := range []struct {
		option string
		err    error
	}{
		{"WithBeta1", func() error { _, err := optim.NewSGD(optim.WithBeta1(0.9)); return err }()},
		{"WithBeta2", func() error { _, err := optim.NewMomentum(optim.WithBeta2(0.99)); return err }()},
		{"WithEps", func() error { _, err := optim.NewSGD(optim.WithLearnRate(0.1), optim.WithEps(1e-6)); return err }()},
		{"WithMomentum", func() error { _, err := optim.NewAdam(optim.WithMomentum(0.9)); return err }()},
		{"WithMomentum", func() error { _, err := optim.NewSGD(optim.WithMomentum(0.9)); return err }()},
	} {
		require.ErrorIs(t, c.err, optim.ErrInvalidArgument, c.option)
		var oe *optim.OptionError
		require.ErrorAs(t, c.err, &oe, c.option)
		assert.Equal(t, c.option, oe.Option)
		assert.Contains(t, c.err.Error(), c.option)
		assert.Contains(t, c.err.Error(), "only")
	}
	_, err := optim.NewMomentum(optim.WithMomentum(0.5), optim.WithLearnRate(0.1), optim.WithClip(1))
	require.NoError(t, err, "the shared options and its own")
}

// stepped returns an Adam solver that took 3 steps on a fresh model.
func stepped(t *testing.T, dt tensor.Dtype) (*optim.Adam, []gorgonia.ValueGrad) {
	s, err := optim.NewAdam(optim.WithLearnRate(0.01))
	require.NoError(t, err)
	m := newModel(dt, 1)
	for step := range 3 {
		setGrads(m, step)
		require.NoError(t, s.Step(m))
	}
	return s, m
}

// TestSetStateMismatch: a state of another kind, parameter count, shape,
// dtype or name is refused with a matchable error and changes nothing.
func TestSetStateMismatch(t *testing.T) {
	s, _ := stepped(t, tensor.Float32)
	before := s.State()
	other, _ := stepped(t, tensor.Float64)

	sgd, err := optim.NewSGD()
	require.NoError(t, err)
	wrongKind := sgd.State()

	fewer := before.Clone()
	fewer.Params = fewer.Params[:2]

	reshaped := before.Clone()
	reshaped.Params[0].Shape = []int{5, 7}

	renamed := before.Clone()
	renamed.Params[3].Name = "other"

	short := before.Clone()
	short.Params[1].Slots[1].F32 = short.Params[1].Slots[1].F32[:3]

	mixed := before.Clone()
	mixed.Params[2].Slots[0].F64 = []float64{1}

	badIndex := before.Clone()
	badIndex.Params[1].Index = 4

	badHyper := before.Clone()
	badHyper.Hyper.Momentum = 0.9 // not Adam's

	cases := []struct {
		name  string
		st    optim.State
		want  error
		index int
	}{
		{"kind", wrongKind, optim.ErrKind, -1},
		{"count", fewer, optim.ErrParamCount, -1},
		{"shape", reshaped, optim.ErrShape, 0},
		{"dtype", other.State(), optim.ErrDtype, 0},
		{"name", renamed, optim.ErrName, 3},
		{"slot length", short, optim.ErrShape, 1},
		{"slot dtype", mixed, optim.ErrDtype, 2},
		{"index", badIndex, optim.ErrInvalidState, 1},
		{"hyper", badHyper, optim.ErrInvalidState, -1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := s.SetState(c.st)
			require.ErrorIs(t, err, c.want)
			var pe *optim.ParamError
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, c.index, pe.Index, "%v", err)
			assert.Equal(t, before, s.State(), "the solver is unchanged")
		})
	}
}

// TestStepMismatchChangesNothing: a restored state that does not fit the
// model, or a model with one bad parameter, fails Step before any update.
func TestStepMismatchChangesNothing(t *testing.T) {
	s, m := stepped(t, tensor.Float32)
	st := s.State()

	fresh, err := optim.NewAdam()
	require.NoError(t, err)
	require.NoError(t, fresh.SetState(st)) // a fresh solver takes any valid state

	other := newModel(tensor.Float64, 1)
	setGrads(other, 7)
	before := bits(other)
	err = fresh.Step(other)
	require.ErrorIs(t, err, optim.ErrDtype)
	assert.Equal(t, before, bits(other))
	assert.Equal(t, st, fresh.State())

	err = fresh.Step(m[:3])
	require.ErrorIs(t, err, optim.ErrParamCount)

	// The last parameter's gradient is missing: no parameter moves.
	broken := append([]gorgonia.ValueGrad(nil), m...)
	broken[len(broken)-1] = noGrad{}
	setGrads(m, 8)
	before = bits(m)
	err = s.Step(broken)
	require.ErrorIs(t, err, optim.ErrNoGrad)
	require.ErrorIs(t, err, errNoGrad, "the cause is kept")
	assert.Equal(t, before, bits(m))
	assert.Equal(t, st, s.State())

	// An integer tensor and an unsupported value type.
	ints := &param{name: "i", v: tensor.New(tensor.WithBacking([]int{1, 2})), g: tensor.New(tensor.WithBacking([]int{1, 2}))}
	fresh2, _ := optim.NewSGD()
	require.ErrorIs(t, fresh2.Step([]gorgonia.ValueGrad{ints}), optim.ErrDtype)
	odd := &param{name: "b", v: gorgonia.NewB(true), g: gorgonia.NewB(true)}
	require.ErrorIs(t, fresh2.Step([]gorgonia.ValueGrad{odd}), optim.ErrUnsupported)
	assert.Equal(t, 0, fresh2.State().Iter)
}

func TestInit(t *testing.T) {
	s, err := optim.NewMomentum()
	require.NoError(t, err)
	assert.Empty(t, s.State().Params)
	m := newModel(tensor.Float64, 2)
	before := bits(m)
	require.NoError(t, s.Init(m))
	assert.Equal(t, before, bits(m), "Init does not step")
	st := s.State()
	require.Len(t, st.Params, len(m))
	assert.Equal(t, 0, st.Iter)
	assert.Equal(t, []int{7, 5}, st.Params[0].Shape)
	v, ok := st.Params[0].Slot(optim.SlotVelocity)
	require.True(t, ok)
	assert.Equal(t, make([]float64, 35), v.F64)
	// Now the solver knows its parameters: a state for others is refused.
	other := newModel(tensor.Float32, 2)
	s2, _ := optim.NewMomentum()
	require.NoError(t, s2.Init(other))
	require.ErrorIs(t, s.SetState(s2.State()), optim.ErrDtype)
}

func TestUnflattenErrors(t *testing.T) {
	s, _ := stepped(t, tensor.Float64)
	good := s.State().Flatten()
	mutate := map[string]func(f *optim.Flat){
		"no kind":      func(f *optim.Flat) { delete(f.Strings, "kind") },
		"no iter":      func(f *optim.Flat) { delete(f.Ints, "iter") },
		"no lr":        func(f *optim.Flat) { delete(f.Floats, "lr") },
		"bad flag":     func(f *optim.Flat) { f.Ints["use_l1"] = 2 },
		"no tensor":    func(f *optim.Flat) { f.Tensors = f.Tensors[1:] },
		"extra tensor": func(f *optim.Flat) { f.Tensors = append(f.Tensors, optim.FlatTensor{Name: "x", F64: []float64{1}}) },
		"dup tensor":   func(f *optim.Flat) { f.Tensors = append(f.Tensors, f.Tensors[0]) },
		"bad dtype":    func(f *optim.Flat) { f.Strings["param.0.dtype"] = "int8" },
		"bad shape":    func(f *optim.Flat) { f.Strings["param.0.shape"] = "7xq" },
		"tensor shape": func(f *optim.Flat) { f.Tensors[0].Shape = []int{35} },
		"count":        func(f *optim.Flat) { f.Ints["params"] = 9 },
	}
	for name, mut := range mutate {
		t.Run(name, func(t *testing.T) {
			f := s.State().Flatten()
			mut(&f)
			_, err := optim.Unflatten(f)
			require.ErrorIs(t, err, optim.ErrInvalidState)
		})
	}
	back, err := optim.Unflatten(good)
	require.NoError(t, err)
	assert.Equal(t, s.State(), back)
	assert.Equal(t, "param.0.m", good.Tensors[0].Name)
	assert.Equal(t, "7x5", good.Strings["param.0.shape"])

	_, err = optim.New(optim.State{Kind: "rmsprop"})
	require.ErrorIs(t, err, optim.ErrKind)
}

var errNoGrad = errors.New("test: no gradient")

type noGrad struct{}

func (noGrad) Value() gorgonia.Value         { return gorgonia.NewF32(1) }
func (noGrad) Grad() (gorgonia.Value, error) { return nil, errNoGrad }

func nanf() float64 { z := 0.0; return z / z }
func inff() float64 { z := 0.0; return 1 / z }
