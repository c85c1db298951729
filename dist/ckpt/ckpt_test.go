package ckpt_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/ckpt"
	"github.com/gdist/gdist/dist/disttest"
	"github.com/gdist/gdist/train/checkpoint"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// state returns a training state at step: parameters and an optimizer slot
// whose values depend on step and salt, and the given RNG bytes.
func state(step int64, salt float32, rng string) *checkpoint.State {
	w := make([]float32, 12)
	m := make([]float32, 12)
	for i := range w {
		w[i] = float32(step)*0.5 + float32(i) + salt
		m[i] = float32(step) * 0.25 * float32(i)
	}
	return &checkpoint.State{
		Config: map[string]int{"width": 12},
		Params: []checkpoint.Named{{Name: "w", Tensor: tensor.New(tensor.WithShape(3, 4), tensor.WithBacking(w))}},
		Optimizer: &checkpoint.Optimizer{Kind: "adam", Iter: step, Scalars: map[string]float64{"lr": 1e-3},
			Slots: []checkpoint.Named{{Name: "param.0.m", Tensor: tensor.New(tensor.WithShape(3, 4), tensor.WithBacking(m))}}},
		Step: step, Epoch: step / 4, Sampler: []byte{byte(step), 7}, RNG: []byte(rng),
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// runRanks runs fn on n in-process ranks and requires every rank to succeed.
func runRanks(t *testing.T, n int, fn func(rank int, pg *dist.ProcessGroup) error) {
	t.Helper()
	for r, err := range disttest.Run(t, disttest.Cluster(t, n), fn) {
		require.NoError(t, err, "rank %d", r)
	}
}

// saveEvery trains n in-process ranks to step last, saving every every
// steps in dir.
func saveEvery(t *testing.T, dir string, n int, every, last int64) {
	t.Helper()
	ctx := ctxT(t)
	runRanks(t, n, func(rank int, pg *dist.ProcessGroup) error {
		m, err := ckpt.New(pg, dir, ckpt.WithEvery(every))
		if err != nil {
			return err
		}
		return train(ctx, m, rank, last)
	})
}

// dirSteps lists the steps of the checkpoints in dir, newest first.
func dirSteps(t *testing.T, dir string) []int64 {
	t.Helper()
	d, err := checkpoint.OpenDir(dir)
	require.NoError(t, err)
	steps, err := d.Steps()
	require.NoError(t, err)
	return steps
}

// resumeErrs returns the errors of resumeOn.
func resumeErrs(_ []*ckpt.Resumed, errs []error) []error { return errs }

// resumeOn resumes n in-process ranks from dir with opts and returns each
// rank's result and error.
func resumeOn(t *testing.T, n int, dir string, opts ...ckpt.Option) ([]*ckpt.Resumed, []error) {
	t.Helper()
	ctx := ctxT(t)
	return disttest.Results(t, disttest.Cluster(t, n), func(rank int, pg *dist.ProcessGroup) (*ckpt.Resumed, error) {
		m, err := ckpt.New(pg, dir, opts...)
		if err != nil {
			return nil, err
		}
		defer m.Close()
		return m.Resume(ctx)
	})
}

// train saves steps 1..last of state(step) with m.Step on every rank.
func train(ctx context.Context, m *ckpt.Manager, rank int, last int64) error {
	for step := int64(1); step <= last; step++ {
		if _, err := m.Step(ctx, step, func() (*checkpoint.State, error) {
			return state(step, 0, "rng of rank "+string(rune('0'+rank))), nil
		}); err != nil {
			return err
		}
	}
	return m.Close()
}

func TestRoundTrip(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	runRanks(t, 2, func(rank int, pg *dist.ProcessGroup) error {
		m, err := ckpt.New(pg, dir, ckpt.WithEvery(3), ckpt.WithKeep(2))
		if err != nil {
			return err
		}
		r, err := m.Resume(ctx)
		if err != nil {
			return err
		}
		assert.True(t, r.Fresh(), "rank %d: an empty directory", rank)
		assert.Equal(t, int64(-1), r.Newest)
		assert.Equal(t, rank == 0, m.Writer())
		return train(ctx, m, rank, 10)
	})
	assert.Equal(t, []int64{9, 6}, dirSteps(t, dir), "every 3 steps, the last 2 kept")

	runRanks(t, 2, func(rank int, pg *dist.ProcessGroup) error {
		m, err := ckpt.New(pg, dir, ckpt.WithEvery(3))
		if err != nil {
			return err
		}
		defer m.Close()
		r, err := m.Resume(ctx)
		if err != nil {
			return err
		}
		require.False(t, r.Fresh())
		assert.Equal(t, int64(9), r.Step)
		assert.Equal(t, int64(9), r.Newest)
		assert.Empty(t, r.Skipped)
		want := state(9, 0, "rng of rank 0")
		got := r.State
		assert.Equal(t, want.Step, got.Step)
		assert.Equal(t, want.Epoch, got.Epoch)
		assert.Equal(t, want.Sampler, got.Sampler)
		assert.Equal(t, want.RNG, got.RNG, "rank 0's RNG without WithRankRNG")
		assert.Equal(t, "2", got.Meta[ckpt.MetaWorld])
		w, err := r.File.Tensor("w")
		require.NoError(t, err)
		assert.Equal(t, want.Params[0].Tensor.Data(), w.Data())
		require.NotNil(t, got.Optimizer)
		assert.Equal(t, int64(9), got.Optimizer.Iter)
		slot, err := got.Optimizer.Slot("param.0.m")
		require.NoError(t, err)
		assert.Equal(t, want.Optimizer.Slots[0].Tensor.Data(), slot.Tensor.Data())
		// The live state rebuilt from the file is the same on every rank.
		return m.Verify(ctx, got)
	})
}

func TestRankRNG(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	runRanks(t, 3, func(rank int, pg *dist.ProcessGroup) error {
		m, err := ckpt.New(pg, dir, ckpt.WithEvery(2), ckpt.WithRankRNG())
		if err != nil {
			return err
		}
		return train(ctx, m, rank, 5)
	})
	runRanks(t, 3, func(rank int, pg *dist.ProcessGroup) error {
		m, err := ckpt.New(pg, dir, ckpt.WithRankRNG())
		if err != nil {
			return err
		}
		defer m.Close()
		r, err := m.Resume(ctx)
		if err != nil {
			return err
		}
		assert.Equal(t, int64(4), r.Step)
		assert.Equal(t, "rng of rank "+string(rune('0'+rank)), string(r.State.RNG), "rank %d gets its own RNG state", rank)
		// The RNG states differ by design: Verify does not compare them.
		return m.Verify(ctx, r.State)
	})
	// A bigger world is refused on every rank: it would find no RNG state
	// for its new rank, and a Manager does not reshard.
	errs := resumeErrs(resumeOn(t, 4, dir, ckpt.WithRankRNG()))
	for r, err := range errs {
		assert.ErrorIs(t, err, ckpt.ErrLayout, "rank %d", r)
	}
	// A checkpoint saved without every rank's RNG state has none for rank 1.
	dir = t.TempDir()
	saveEvery(t, dir, 2, 2, 2)
	errs = resumeErrs(resumeOn(t, 2, dir, ckpt.WithRankRNG()))
	assert.NoError(t, errs[0])
	assert.ErrorIs(t, errs[1], ckpt.ErrRankState)
}

func TestVerifyMismatch(t *testing.T) {
	ctx := ctxT(t)
	cases := []struct {
		part   string
		change func(st *checkpoint.State)
	}{
		{ckpt.PartStep, func(st *checkpoint.State) { st.Step++ }},
		{ckpt.PartEpoch, func(st *checkpoint.State) { st.Epoch++ }},
		{ckpt.PartParams, func(st *checkpoint.State) { st.Params[0].Tensor.Data().([]float32)[5] += 1e-6 }},
		{ckpt.PartOptimizer, func(st *checkpoint.State) { st.Optimizer.Iter++ }},
		{ckpt.PartOptimizer, func(st *checkpoint.State) { st.Optimizer.Slots[0].Tensor.Data().([]float32)[0] = -1 }},
		{ckpt.PartOptimizer, func(st *checkpoint.State) { st.Optimizer.Scalars["lr"] = 2e-3 }},
		{ckpt.PartOptimizer, func(st *checkpoint.State) { st.Optimizer = nil }},
		{ckpt.PartSampler, func(st *checkpoint.State) { st.Sampler[1]++ }},
		{ckpt.PartRNG, func(st *checkpoint.State) { st.RNG = []byte("other") }},
	}
	for _, c := range cases {
		t.Run(c.part, func(t *testing.T) {
			dir := t.TempDir()
			errs := disttest.Run(t, disttest.Cluster(t, 3), func(rank int, pg *dist.ProcessGroup) error {
				m, err := ckpt.New(pg, dir)
				if err != nil {
					return err
				}
				defer m.Close()
				st := state(8, 0, "rng")
				if rank == 2 {
					c.change(st)
				}
				return m.Verify(ctx, st)
			})
			for r, err := range errs {
				var me *ckpt.MismatchError
				require.ErrorAs(t, err, &me, "rank %d", r)
				assert.ErrorIs(t, err, ckpt.ErrMismatch)
				assert.Equal(t, c.part, me.Part, "rank %d", r)
				assert.Equal(t, 2, me.Rank)
				assert.Equal(t, []int{2}, me.Ranks)
				assert.Contains(t, err.Error(), c.part)
			}
		})
	}
}

// stages saves steps 1..last on every stage, every 2 steps.
func saveStages(t *testing.T, dir string, n int, last int64) {
	t.Helper()
	ctx := ctxT(t)
	runRanks(t, n, func(rank int, pg *dist.ProcessGroup) error {
		m, err := ckpt.New(pg, dir, ckpt.WithStage(rank), ckpt.WithEvery(2), ckpt.WithKeep(5))
		if err != nil {
			return err
		}
		if !m.Writer() {
			return errors.New("a stage is a writer")
		}
		for step := int64(1); step <= last; step++ {
			if _, err := m.Step(ctx, step, func() (*checkpoint.State, error) {
				return state(step, float32(100*rank), "stage rng"), nil // each stage its own layers
			}); err != nil {
				return err
			}
		}
		return m.Close()
	})
}

func resumeStages(t *testing.T, dir string, n int) ([]*ckpt.Resumed, []error) {
	t.Helper()
	ctx := ctxT(t)
	return disttest.Results(t, disttest.Cluster(t, n), func(rank int, pg *dist.ProcessGroup) (*ckpt.Resumed, error) {
		m, err := ckpt.New(pg, dir, ckpt.WithStage(rank))
		if err != nil {
			return nil, err
		}
		defer m.Close()
		r, err := m.Resume(ctx)
		if err != nil {
			return nil, err
		}
		// Stages hold different layers: only step and epoch are compared.
		return r, m.Verify(ctx, r.State)
	})
}

func TestStagesAgreeWhenOneIsTorn(t *testing.T) {
	dir := t.TempDir()
	saveStages(t, dir, 3, 9) // steps 2, 4, 6, 8 on each stage
	// Stage 1's newest file is torn (cut short), stage 2's next one has a
	// flipped byte: the newest step all three have intact is 4.
	torn := filepath.Join(ckpt.StageDir(dir, 1), "ckpt-8.gdc")
	b, err := os.ReadFile(torn)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(torn, b[:len(b)/2], 0o644))
	flipped := filepath.Join(ckpt.StageDir(dir, 2), "ckpt-6.gdc")
	b, err = os.ReadFile(flipped)
	require.NoError(t, err)
	b[len(b)-40] ^= 0x10
	require.NoError(t, os.WriteFile(flipped, b, 0o644))

	res, errs := resumeStages(t, dir, 3)
	for r, err := range errs {
		require.NoError(t, err, "stage %d", r)
		assert.Equal(t, int64(4), res[r].Step, "stage %d resumes from the common step", r)
		w, err := res[r].File.Tensor("w")
		require.NoError(t, err)
		assert.Equal(t, state(4, float32(100*r), "").Params[0].Tensor.Data(), w.Data(), "stage %d loads its own layers", r)
	}
	assert.Equal(t, []int64{8, 6, 8}, []int64{res[0].Newest, res[1].Newest, res[2].Newest})
	require.Len(t, res[1].Skipped, 1)
	assert.Equal(t, int64(8), res[1].Skipped[0].Step)
	assert.ErrorIs(t, res[1].Skipped[0], checkpoint.ErrCorrupt)
	require.Len(t, res[2].Skipped, 1)
	assert.Equal(t, int64(6), res[2].Skipped[0].Step)
	assert.Empty(t, res[0].Skipped)
}

func TestStagesWithoutCommonStep(t *testing.T) {
	dir := t.TempDir()
	saveStages(t, dir, 2, 4) // steps 2 and 4
	// Stage 1 loses everything: resuming must not start it afresh while
	// stage 0 goes on from step 4.
	require.NoError(t, os.RemoveAll(ckpt.StageDir(dir, 1)))
	_, errs := resumeStages(t, dir, 2)
	for r, err := range errs {
		assert.ErrorIs(t, err, ckpt.ErrNoCommonStep, "stage %d", r)
	}

	// Disjoint steps: stage 0 has 2 and 4, stage 1 only 6.
	require.NoError(t, os.MkdirAll(ckpt.StageDir(dir, 1), 0o755))
	require.NoError(t, checkpoint.SaveState(filepath.Join(ckpt.StageDir(dir, 1), "ckpt-6.gdc"), state(6, 0, "")))
	_, errs = resumeStages(t, dir, 2)
	for r, err := range errs {
		assert.ErrorIs(t, err, ckpt.ErrNoCommonStep, "stage %d", r)
	}
}

// TestDataParallelRanksAgree: the ranks of a data-parallel job pass over a
// torn newest file together and all resume from the previous step.
func TestDataParallelRanksAgree(t *testing.T) {
	dir := t.TempDir()
	saveEvery(t, dir, 2, 2, 6) // steps 2, 4, 6
	// Tear step 6: both ranks read the same directory and skip it.
	p := filepath.Join(dir, "ckpt-6.gdc")
	require.NoError(t, os.Truncate(p, 100))
	res, errs := resumeOn(t, 2, dir)
	for r, err := range errs {
		require.NoError(t, err)
		assert.Equal(t, int64(4), res[r].Step)
		require.Len(t, res[r].Skipped, 1)
		assert.ErrorIs(t, res[r].Skipped[0], checkpoint.ErrCorrupt)
	}
}

func TestInterval(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	runRanks(t, 2, func(rank int, pg *dist.ProcessGroup) error {
		// Every step is due: the interval (1ns) has always passed.
		m, err := ckpt.New(pg, dir, ckpt.WithInterval(time.Nanosecond), ckpt.WithKeep(10))
		if err != nil {
			return err
		}
		defer m.Close()
		for step := int64(1); step <= 3; step++ {
			saved, err := m.Step(ctx, step, func() (*checkpoint.State, error) { return state(step, 0, ""), nil })
			if err != nil {
				return err
			}
			assert.True(t, saved, "rank %d step %d", rank, step)
		}
		return m.Close()
	})
	assert.Equal(t, []int64{3, 2, 1}, dirSteps(t, dir))
}

func TestOptions(t *testing.T) {
	pg := disttest.Cluster(t, 1)[0]
	dir := t.TempDir()
	for name, o := range map[string]ckpt.Option{
		"every":    ckpt.WithEvery(0),
		"interval": ckpt.WithInterval(0),
		"keep":     ckpt.WithKeep(0),
		"stage":    ckpt.WithStage(-1),
		"tag":      ckpt.WithTag(dist.TagReservedBase),
		"logger":   ckpt.WithLogger(nil),
		"nil":      nil,
	} {
		_, err := ckpt.New(pg, dir, o)
		assert.ErrorIs(t, err, ckpt.ErrInvalidArgument, name)
	}
	_, err := ckpt.New(pg, dir, ckpt.WithStage(0), ckpt.WithRankRNG())
	assert.ErrorIs(t, err, ckpt.ErrInvalidArgument, "rank RNG with stages")
	_, err = ckpt.New(pg, "")
	assert.ErrorIs(t, err, ckpt.ErrInvalidArgument)

	m, err := ckpt.New(pg, dir)
	require.NoError(t, err)
	require.NoError(t, m.Close())
	require.NoError(t, m.Close(), "idempotent")
	assert.ErrorIs(t, m.Save(context.Background(), 1, state(1, 0, "")), ckpt.ErrClosed)
	_, err = m.Resume(context.Background())
	assert.ErrorIs(t, err, ckpt.ErrClosed)
}

// TestOnlyWritersCopy: without WithRankRNG a rank that does not write never
// builds its state; with it, every rank does (for its RNG) and only rank 0
// writes.
func TestOnlyWritersCopy(t *testing.T) {
	ctx := ctxT(t)
	for _, rankRNG := range []bool{false, true} {
		dir := t.TempDir()
		calls := make([]int, 2)
		runRanks(t, 2, func(rank int, pg *dist.ProcessGroup) error {
			opts := []ckpt.Option{ckpt.WithEvery(2)}
			if rankRNG {
				opts = append(opts, ckpt.WithRankRNG())
			}
			m, err := ckpt.New(pg, dir, opts...)
			if err != nil {
				return err
			}
			for step := int64(1); step <= 4; step++ {
				saved, err := m.Step(ctx, step, func() (*checkpoint.State, error) {
					calls[rank]++
					return state(step, 0, "r"), nil
				})
				if err != nil {
					return err
				}
				assert.Equal(t, step%2 == 0, saved, "rank %d step %d", rank, step)
			}
			if err := m.Close(); err != nil {
				return err
			}
			st := m.Stats()
			if rank == 0 {
				assert.Equal(t, 2, st.Saves)
				assert.Equal(t, 2, st.Writes)
				assert.Positive(t, st.Copy)
			} else {
				assert.Zero(t, st.Saves, "rank %d writes nothing", rank)
			}
			assert.Equal(t, rankRNG, st.Gather > 0, "rank %d", rank)
			return nil
		})
		want := []int{2, 0}
		if rankRNG {
			want = []int{2, 2}
		}
		assert.Equal(t, want, calls, "rank RNG %v", rankRNG)
	}
}

// damageAll truncates every checkpoint file in dir and returns their names.
func damageAll(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		if filepath.Ext(e.Name()) == ".gdc" {
			require.NoError(t, os.Truncate(filepath.Join(dir, e.Name()), 100))
			names = append(names, e.Name())
		}
	}
	require.NotEmpty(t, names)
	return names
}

// TestResumeAllDamaged is issue 21's first scenario: every checkpoint in the
// directory fails verification. Resuming is an error on every rank that
// lists each file and why, and touches nothing; starting afresh over them
// takes WithStartFreshOverDamaged, which sets them aside.
func TestResumeAllDamaged(t *testing.T) {
	dir := t.TempDir()
	saveEvery(t, dir, 2, 2, 6) // steps 2, 4, 6 (3 kept)
	names := damageAll(t, dir)
	_, errs := resumeOn(t, 2, dir)
	for r, err := range errs {
		require.ErrorIs(t, err, ckpt.ErrDamaged, "rank %d", r)
		assert.ErrorIs(t, err, checkpoint.ErrCorrupt, "rank %d: the reasons are in the chain", r)
		var de *ckpt.DamagedError
		require.ErrorAs(t, err, &de)
		assert.Len(t, de.Files, len(names))
		for _, n := range names {
			assert.Contains(t, err.Error(), n, "rank %d names every file", r)
		}
		assert.Contains(t, err.Error(), "WithStartFreshOverDamaged")
	}
	for _, n := range names {
		_, err := os.Stat(filepath.Join(dir, n))
		assert.NoError(t, err, "%s is left in place by the refusal", n)
	}

	res, errs := resumeOn(t, 2, dir, ckpt.WithStartFreshOverDamaged())
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
		assert.True(t, res[r].Fresh())
		assert.Len(t, res[r].Skipped, len(names), "rank %d lists what it passed over", r)
	}
	for _, n := range names {
		_, err := os.Stat(filepath.Join(dir, n+".corrupt"))
		assert.NoError(t, err, "%s set aside", n)
	}
	// Nothing left to pass over: a fresh start without the option.
	res, errs = resumeOn(t, 2, dir)
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
		assert.True(t, res[r].Fresh())
		assert.Empty(t, res[r].Skipped)
	}
}

// TestResumePastDamagedNewerFiles: issue 21's second scenario through a
// Manager. Damaged files at steps above the run's (ckpt-100050, -100100,
// -100150) are set aside by the resume, and the run that then saves ten
// checkpoints keeps its newest good ones.
func TestResumePastDamagedNewerFiles(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	for _, step := range []int64{100050, 100100, 100150} {
		require.NoError(t, checkpoint.SaveState(filepath.Join(dir, "ckpt-"+strconv.FormatInt(step, 10)+".gdc"), state(step, 0, "")))
	}
	damageAll(t, dir)
	runRanks(t, 2, func(rank int, pg *dist.ProcessGroup) error {
		m, err := ckpt.New(pg, dir, ckpt.WithEvery(50), ckpt.WithStartFreshOverDamaged())
		if err != nil {
			return err
		}
		r, err := m.Resume(ctx)
		if err != nil {
			return err
		}
		assert.True(t, r.Fresh())
		return train(ctx, m, rank, 500) // 10 saves
	})
	assert.Equal(t, []int64{500, 450, 400}, dirSteps(t, dir))
}

// TestResumeOtherWorld is issue 21's third scenario: a checkpoint saved on
// 2 ranks, resumed on 3 by a program that uses dist/ckpt alone, is refused
// on every rank with an error naming both world sizes; so is one saved by
// a pipeline stage read as data-parallel.
func TestResumeOtherWorld(t *testing.T) {
	dir := t.TempDir()
	saveEvery(t, dir, 2, 2, 4)
	errs := resumeErrs(resumeOn(t, 3, dir))
	for r, err := range errs {
		require.ErrorIs(t, err, ckpt.ErrLayout, "rank %d", r)
		var le *ckpt.LayoutError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, []int{2, 3}, []int{le.SavedWorld, le.World})
		assert.Contains(t, err.Error(), "saved on 2 ranks, resuming on 3: not supported by ckpt.Manager")
	}

	// Stage 0's files of a 2-stage job, copied where a data-parallel job
	// of 2 looks for them.
	dir = t.TempDir()
	saveStages(t, dir, 2, 2)
	b, err := os.ReadFile(filepath.Join(ckpt.StageDir(dir, 0), "ckpt-2.gdc"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ckpt-2.gdc"), b, 0o644))
	errs = resumeErrs(resumeOn(t, 2, dir))
	for r, err := range errs {
		require.ErrorIs(t, err, ckpt.ErrLayout, "rank %d", r)
		assert.Contains(t, err.Error(), "pipeline stage 0")
	}
}
