package optim_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/gorgonia"

	"github.com/gdist/gdist/train/optim"
)

const steps = 100

// TestBitwiseGorgonia runs each solver beside Gorgonia's of the same settings
// for 100 steps on the same parameters and gradients and compares every
// weight and gradient bit after every step.
func TestBitwiseGorgonia(t *testing.T) {
	for _, s := range settings() {
		for _, dt := range dtypes {
			t.Run(s.name+"/"+dt.String(), func(t *testing.T) {
				ours, err := s.ours()
				require.NoError(t, err)
				theirs := s.theirs()
				a, b := newModel(dt, 5), newModel(dt, 5)
				require.Equal(t, bits(a), bits(b))
				start := bits(a)
				for step := range steps {
					setGrads(a, step)
					setGrads(b, step)
					require.NoError(t, theirs.Step(a))
					require.NoError(t, ours.Step(b))
					require.Equal(t, bits(a), bits(b), "step %d", step)
				}
				require.NotEqual(t, start, bits(b), "the parameters moved")
				require.Equal(t, steps, ours.State().Iter)
			})
		}
	}
}

// TestResumeBitwise runs 50 steps, exports the state, sends it through its
// flat (checkpoint) form, restores it into a fresh solver (New, and the
// constructor plus SetState) and runs 50 more: the parameters equal, bit for
// bit, 100 uninterrupted steps of Gorgonia's solver.
func TestResumeBitwise(t *testing.T) {
	for _, s := range settings() {
		for _, dt := range dtypes {
			t.Run(s.name+"/"+dt.String(), func(t *testing.T) {
				want := newModel(dt, 9)
				theirs := s.theirs()
				for step := range steps {
					setGrads(want, step)
					require.NoError(t, theirs.Step(want))
				}

				for _, restore := range []string{"New", "SetState"} {
					got := newModel(dt, 9)
					first, err := s.ours()
					require.NoError(t, err)
					for step := range steps / 2 {
						setGrads(got, step)
						require.NoError(t, first.Step(got))
					}
					st := first.State()
					require.Equal(t, steps/2, st.Iter)
					require.Len(t, st.Params, len(got))
					flat := st.Flatten()
					back, err := optim.Unflatten(flat)
					require.NoError(t, err)
					require.Equal(t, st, back)

					var second optim.Solver
					if restore == "New" {
						second, err = optim.New(back)
						require.NoError(t, err)
					} else {
						second, err = s.ours()
						require.NoError(t, err)
						require.NoError(t, second.SetState(back))
					}
					// The restored solver owns a copy: scribbling on the
					// exported state must not reach it.
					for _, p := range back.Params {
						for _, sl := range p.Slots {
							for i := range sl.F32 {
								sl.F32[i] = 1e9
							}
							for i := range sl.F64 {
								sl.F64[i] = 1e9
							}
						}
					}
					for step := steps / 2; step < steps; step++ {
						setGrads(got, step)
						require.NoError(t, second.Step(got))
					}
					require.Equal(t, bits(want), bits(got), restore)
					require.Equal(t, steps, second.State().Iter)
				}
			})
		}
	}
}

// TestScalarDense: a parameter that is a *tensor.Dense of shape () takes the
// tensor path. Gorgonia's VanillaSolver handles it (its Momentum and Adam
// panic on one), so SGD is compared with it; Adam must just step it.
func TestScalarDense(t *testing.T) {
	for _, dt := range dtypes {
		mk := func() []gorgonia.ValueGrad {
			return []gorgonia.ValueGrad{&param{name: "s", v: makeValue(dt, []int{}, []float64{0.75}), g: makeValue(dt, []int{}, []float64{0})}}
		}
		a, b := mk(), mk()
		theirs := gorgonia.NewVanillaSolver(gorgonia.WithLearnRate(0.1), gorgonia.WithL1Reg(0.01), gorgonia.WithClip(1))
		ours, err := optim.NewSGD(optim.WithLearnRate(0.1), optim.WithL1Reg(0.01), optim.WithClip(1))
		require.NoError(t, err)
		for step := range 20 {
			setGrads(a, step)
			setGrads(b, step)
			require.NoError(t, theirs.Step(a))
			require.NoError(t, ours.Step(b))
			require.Equal(t, bits(a), bits(b), "step %d", step)
		}
		adam, err := optim.NewAdam()
		require.NoError(t, err)
		c := mk()
		before := bits(c)
		setGrads(c, 1)
		require.NoError(t, adam.Step(c))
		require.NotEqual(t, before, bits(c))
		st := adam.State()
		require.Len(t, st.Params, 1)
		assert.Empty(t, st.Params[0].Shape)
		assert.Equal(t, 1, st.Params[0].Slots[0].Len())
	}
}

var _ gorgonia.Solver = optim.Solver(nil)
