package optim_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/train/checkpoint"
	"github.com/gdist/gdist/train/optim"
)

// TestCheckpointRoundTrip: a solver's state written into a checkpoint file
// and read back restores a solver that continues bit for bit.
func TestCheckpointRoundTrip(t *testing.T) {
	for _, s := range settings() {
		for _, dt := range dtypes {
			t.Run(s.name+"/"+dt.String(), func(t *testing.T) {
				want := newModel(dt, 4)
				ref, err := s.ours()
				require.NoError(t, err)
				for step := range steps {
					setGrads(want, step)
					require.NoError(t, ref.Step(want))
				}

				got := newModel(dt, 4)
				first, err := s.ours()
				require.NoError(t, err)
				for step := range steps / 2 {
					setGrads(got, step)
					require.NoError(t, first.Step(got))
				}
				st := first.State()
				var buf bytes.Buffer
				require.NoError(t, checkpoint.WriteState(&buf, &checkpoint.State{Config: "x", Optimizer: st.Checkpoint()}))
				f, err := checkpoint.Read(&buf)
				require.NoError(t, err)
				back, err := optim.FromCheckpoint(f.Optimizer)
				require.NoError(t, err)
				require.Equal(t, st, back)

				second, err := optim.New(back)
				require.NoError(t, err)
				for step := steps / 2; step < steps; step++ {
					setGrads(got, step)
					require.NoError(t, second.Step(got))
				}
				require.Equal(t, bits(want), bits(got))
			})
		}
	}
}

func TestFromCheckpointErrors(t *testing.T) {
	_, err := optim.FromCheckpoint(nil)
	require.ErrorIs(t, err, optim.ErrInvalidState)

	s, err := optim.NewAdam()
	require.NoError(t, err)
	require.NoError(t, s.Init(newModel(dtypes[0], 1)))
	good := s.State().Checkpoint()

	frac := *good
	frac.Scalars = map[string]float64{}
	for k, v := range good.Scalars {
		frac.Scalars[k] = v
	}
	frac.Scalars["int.params"] = 2.5
	_, err = optim.FromCheckpoint(&frac)
	assert.ErrorIs(t, err, optim.ErrInvalidState, "a fractional integer")

	short := *good
	short.Slots = good.Slots[1:]
	_, err = optim.FromCheckpoint(&short)
	assert.ErrorIs(t, err, optim.ErrInvalidState, "a missing slot")

	kind := *good
	kind.Kind = "rmsprop"
	_, err = optim.FromCheckpoint(&kind)
	assert.ErrorIs(t, err, optim.ErrInvalidState, "an unknown kind: its slots belong to nothing")
}
