package checkpoint_test

import (
	"bytes"
	"errors"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/train/checkpoint"
)

// newStateAt is a small State whose contents depend on step, so a test
// can tell which checkpoint it got back.
func newStateAt(step int64) *checkpoint.State {
	w := make([]float32, 300)
	for i := range w {
		w[i] = float32(step) + float32(i)/1000
	}
	return &checkpoint.State{
		Config: testConfig{Name: "dir", Layers: int(step)},
		Params: []checkpoint.Named{{Name: "w", Tensor: tensor.New(tensor.WithShape(300), tensor.WithBacking(w))}},
		Optimizer: &checkpoint.Optimizer{Kind: "sgd", Iter: step, Slots: []checkpoint.Named{
			{Name: "w/v", Tensor: tensor.New(tensor.WithShape(300), tensor.WithBacking(seq32(300, float32(step))))},
		}},
		Epoch: step / 10, Sampler: []byte{byte(step)},
	}
}

func saveSteps(t *testing.T, d *checkpoint.Dir, steps ...int64) {
	t.Helper()
	for _, s := range steps {
		path, err := d.SaveStep(s, newStateAt(s))
		require.NoError(t, err)
		require.Equal(t, d.StepPath(s), path)
	}
}

func loadedStep(t *testing.T, f *checkpoint.File) int64 {
	t.Helper()
	var cfg testConfig
	require.NoError(t, f.Config(&cfg))
	require.Equal(t, int64(cfg.Layers), f.Step, "config and step agree")
	w, err := f.Tensor("w")
	require.NoError(t, err)
	require.Equal(t, float32(f.Step), w.Data().([]float32)[0])
	return f.Step
}

func TestDirSaveKeepLoad(t *testing.T) {
	d, err := checkpoint.OpenDir(filepath.Join(t.TempDir(), "ckpts"), checkpoint.WithKeep(3))
	require.NoError(t, err)

	_, found, err := d.LoadLatest()
	require.ErrorIs(t, err, checkpoint.ErrNoCheckpoint)
	require.NotErrorIs(t, err, checkpoint.ErrCorrupt, "an empty directory is not corruption")
	assert.Empty(t, found.Skipped)

	saveSteps(t, d, 100, 200, 300, 400, 1000)
	steps, err := d.Steps()
	require.NoError(t, err)
	assert.Equal(t, []int64{1000, 400, 300}, steps, "keeps the newest 3, ordered numerically")

	f, found, err := d.LoadLatest()
	require.NoError(t, err)
	assert.Equal(t, int64(1000), loadedStep(t, f))
	assert.Equal(t, checkpoint.Found{Path: d.StepPath(1000), Step: 1000}, found)
	requireSameState(t, func() *checkpoint.State { s := newStateAt(1000); s.Step = 1000; return s }(), f)

	// Saving a step again replaces it.
	saveSteps(t, d, 1000)
	steps, _ = d.Steps()
	assert.Equal(t, []int64{1000, 400, 300}, steps)

	// Files that are not checkpoints are ignored and kept.
	for _, name := range []string{"notes.txt", "ckpt-.gdc", "ckpt-+5.gdc", "ckpt-007.gdc", "ckpt--1.gdc", "ckpt-5.gdc.bak"} {
		require.NoError(t, os.WriteFile(filepath.Join(d.Path(), name), []byte("x"), 0o644))
	}
	saveSteps(t, d, 1100)
	steps, _ = d.Steps()
	assert.Equal(t, []int64{1100, 1000, 400}, steps)
	ents, _ := os.ReadDir(d.Path())
	assert.Len(t, ents, 3+6)

	_, err = d.SaveStep(-1, newStateAt(1))
	assert.ErrorIs(t, err, checkpoint.ErrInvalidArgument)
	_, err = d.SaveStep(1, nil)
	assert.ErrorIs(t, err, checkpoint.ErrInvalidArgument)
	_, err = checkpoint.OpenDir(t.TempDir(), checkpoint.WithKeep(0))
	assert.ErrorIs(t, err, checkpoint.ErrInvalidArgument)
	_, err = checkpoint.OpenDir(t.TempDir(), checkpoint.WithLogger(nil))
	assert.ErrorIs(t, err, checkpoint.ErrInvalidArgument)
}

// damage is one way a checkpoint file goes bad.
type damage struct {
	name string
	do   func(t *testing.T, path string, r *rand.Rand)
}

var damages = []damage{
	{"truncated", func(t *testing.T, path string, r *rand.Rand) {
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path, data[:r.IntN(len(data))], 0o644))
	}},
	{"flipped", func(t *testing.T, path string, r *rand.Rand) {
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		data[r.IntN(len(data))] ^= byte(1 + r.IntN(255))
		require.NoError(t, os.WriteFile(path, data, 0o644))
	}},
	{"empty", func(t *testing.T, path string, _ *rand.Rand) {
		require.NoError(t, os.WriteFile(path, nil, 0o644))
	}},
	{"renamed", func(t *testing.T, path string, _ *rand.Rand) {
		// Another step's (good) file under this step's name.
		data, err := os.ReadFile(filepath.Join(filepath.Dir(path), "ckpt-100.gdc"))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path, data, 0o644))
	}},
	{"not a checkpoint", func(t *testing.T, path string, _ *rand.Rand) {
		require.NoError(t, os.WriteFile(path, []byte("PK\x03\x04 zip"), 0o644))
	}},
}

// TestDirFallsBackPastDamage damages the newest checkpoints in many seeded
// ways: LoadLatest returns the newest good one, names what it skipped and
// why, and removes nothing; SaveStep afterwards works and prunes normally.
func TestDirFallsBackPastDamage(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for round := range 60 {
		dmg := damages[round%len(damages)]
		t.Run(dmg.name, func(t *testing.T) {
			d, err := checkpoint.OpenDir(t.TempDir(), checkpoint.WithKeep(4))
			require.NoError(t, err)
			saveSteps(t, d, 100, 200, 300)
			bad := 1 + r.IntN(2) // damage the newest one or two
			for i := range bad {
				dmg.do(t, d.StepPath(int64(300-100*i)), r)
			}
			f, found, err := d.LoadLatest()
			require.NoError(t, err)
			want := int64(300 - 100*bad)
			assert.Equal(t, want, loadedStep(t, f))
			assert.Equal(t, want, found.Step)
			require.Len(t, found.Skipped, bad)
			for i, s := range found.Skipped {
				assert.Equal(t, int64(300-100*i), s.Step)
				assert.Equal(t, d.StepPath(s.Step), s.Path)
				switch {
				case dmg.name == "not a checkpoint":
					assert.ErrorIs(t, s, checkpoint.ErrBadMagic)
				case dmg.name == "flipped" && errors.Is(s, checkpoint.ErrBadMagic),
					dmg.name == "flipped" && errors.Is(s, checkpoint.ErrUnsupportedVersion):
					// a flip in the magic or the version field
				default:
					assert.ErrorIs(t, s, checkpoint.ErrCorrupt)
				}
				var se *checkpoint.SkipError
				require.True(t, errors.As(error(s), &se))
			}
			latest, err := d.Latest()
			require.NoError(t, err)
			assert.Equal(t, found, latest)
			steps, _ := d.Steps()
			assert.Equal(t, []int64{300, 200, 100}, steps, "LoadLatest removes nothing")

			// Training goes on: the next save is good and becomes the latest.
			saveSteps(t, d, 400, 500)
			f, found, err = d.LoadLatest()
			require.NoError(t, err)
			assert.Equal(t, int64(500), loadedStep(t, f))
			assert.Empty(t, found.Skipped)
		})
	}
}

func TestDirAllCorrupt(t *testing.T) {
	var logs bytes.Buffer
	d, err := checkpoint.OpenDir(t.TempDir(), checkpoint.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	saveSteps(t, d, 1, 2)
	require.NoError(t, os.Truncate(d.StepPath(1), 40))
	require.NoError(t, os.Truncate(d.StepPath(2), 0))
	_, found, err := d.LoadLatest()
	require.ErrorIs(t, err, checkpoint.ErrNoCheckpoint)
	require.ErrorIs(t, err, checkpoint.ErrCorrupt, "the reasons are wrapped")
	var se *checkpoint.SkipError
	require.ErrorAs(t, err, &se)
	assert.Len(t, found.Skipped, 2)
	assert.Contains(t, logs.String(), "passing over a checkpoint")
}

// TestDirFailedSaveKeepsPrevious: a save that fails leaves the earlier
// checkpoints as they were and no temporary file; a temporary file left by
// a crash is never taken for a checkpoint and is removed by OpenDir.
func TestDirFailedSaveKeepsPrevious(t *testing.T) {
	dir := t.TempDir()
	d, err := checkpoint.OpenDir(dir, checkpoint.WithKeep(1))
	require.NoError(t, err)
	saveSteps(t, d, 10)
	before, err := os.ReadFile(d.StepPath(10))
	require.NoError(t, err)

	bad := newStateAt(20)
	bad.Params = append(bad.Params, bad.Params[0]) // duplicate name
	_, err = d.SaveStep(20, bad)
	require.ErrorIs(t, err, checkpoint.ErrInvalidArgument)
	bad = newStateAt(10)
	bad.Params[0].Tensor = nil
	_, err = d.SaveStep(10, bad) // same step as the good one
	require.ErrorIs(t, err, checkpoint.ErrInvalidArgument)

	ents, _ := os.ReadDir(dir)
	require.Len(t, ents, 1)
	after, err := os.ReadFile(d.StepPath(10))
	require.NoError(t, err)
	assert.Equal(t, before, after)

	// A crash in the middle of a write leaves a partial temporary file.
	tmp := filepath.Join(dir, ".ckpt-30.gdc.tmp123456")
	require.NoError(t, os.WriteFile(tmp, before[:len(before)/2], 0o644))
	f, _, err := d.LoadLatest()
	require.NoError(t, err)
	assert.Equal(t, int64(10), f.Step)
	_, err = checkpoint.OpenDir(dir)
	require.NoError(t, err)
	_, err = os.Stat(tmp)
	assert.ErrorIs(t, err, os.ErrNotExist)
	_, err = os.Stat(d.StepPath(10))
	assert.NoError(t, err)
}

// TestDirReadersDuringSaves: readers polling LoadLatest while a writer
// saves and prunes always get a complete checkpoint, never an error, and
// never a step older than one they already saw.
func TestDirReadersDuringSaves(t *testing.T) {
	d, err := checkpoint.OpenDir(t.TempDir(), checkpoint.WithKeep(2))
	require.NoError(t, err)
	saveSteps(t, d, 0)
	stop := make(chan struct{})
	errc := make(chan error, 2)
	for range 2 {
		go func() {
			last := int64(-1)
			for {
				select {
				case <-stop:
					errc <- nil
					return
				default:
				}
				f, found, err := d.LoadLatest()
				switch {
				case err != nil:
					errc <- err
					return
				case len(found.Skipped) > 0:
					errc <- found.Skipped[0]
					return
				case f.Step < last:
					errc <- errors.New("went back in time")
					return
				}
				last = f.Step
			}
		}()
	}
	for step := int64(1); step <= 40; step++ {
		_, err := d.SaveStep(step, newStateAt(step))
		require.NoError(t, err)
	}
	close(stop)
	require.NoError(t, <-errc)
	require.NoError(t, <-errc)
}

// TestDirDamagedNewerFiles is issue 21's scenario: damaged ckpt-100050,
// ckpt-100100 and ckpt-100150 lie in the directory of a run that saves ten
// checkpoints from step 50. Pruning must keep that run's newest three good
// files (the damaged ones neither count nor push them out) and set the
// damaged ones aside, logging it.
func TestDirDamagedNewerFiles(t *testing.T) {
	var logs bytes.Buffer
	d, err := checkpoint.OpenDir(t.TempDir(), checkpoint.WithKeep(3),
		checkpoint.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	r := rand.New(rand.NewPCG(21, 2))
	for i, step := range []int64{100050, 100100, 100150} {
		saveSteps(t, d, step)
		damages[i%2].do(t, d.StepPath(step), r) // truncated, flipped
	}
	// Not a checkpoint at all, and a good one of a later step: neither is
	// this run's, neither counts.
	require.NoError(t, os.WriteFile(d.StepPath(100200), []byte("PK\x03\x04 zip"), 0o644))

	for step := int64(50); step <= 500; step += 50 {
		saveSteps(t, d, step)
		_, err := os.Stat(d.StepPath(step))
		require.NoError(t, err, "the checkpoint just saved (step %d) is never pruned", step)
	}
	steps, err := d.Steps()
	require.NoError(t, err)
	assert.Equal(t, []int64{500, 450, 400}, steps, "the run's newest three good checkpoints")
	for _, step := range []int64{100050, 100100, 100150, 100200} {
		_, err := os.Stat(d.StepPath(step) + ".corrupt")
		assert.NoError(t, err, "step %d set aside", step)
	}
	assert.Contains(t, logs.String(), "set aside a checkpoint that does not verify")
	f, found, err := d.LoadLatest()
	require.NoError(t, err)
	assert.Equal(t, int64(500), loadedStep(t, f))
	assert.Empty(t, found.Skipped)
}

// TestDirSetAside: a damaged file set aside under a name already taken
// gets another.
func TestDirSetAside(t *testing.T) {
	d, err := checkpoint.OpenDir(t.TempDir())
	require.NoError(t, err)
	saveSteps(t, d, 550)
	require.NoError(t, os.Truncate(d.StepPath(550), 10))
	_, err = d.SetAside(550, checkpoint.ErrCorrupt)
	require.NoError(t, err)
	saveSteps(t, d, 550)
	require.NoError(t, os.Truncate(d.StepPath(550), 10))
	aside, err := d.SetAside(550, checkpoint.ErrCorrupt)
	require.NoError(t, err)
	assert.Equal(t, d.StepPath(550)+".corrupt-2", aside)
}

// TestDirOlderDamagedFilesDoNotCount: damaged files below the step saved
// are set aside, not counted among the kept, so the good ones stay.
func TestDirOlderDamagedFilesDoNotCount(t *testing.T) {
	d, err := checkpoint.OpenDir(t.TempDir(), checkpoint.WithKeep(3))
	require.NoError(t, err)
	saveSteps(t, d, 10, 20, 30)
	require.NoError(t, os.Truncate(d.StepPath(20), 64))
	require.NoError(t, os.Truncate(d.StepPath(30), 0))
	// A fresh Dir has not verified these files itself.
	d, err = checkpoint.OpenDir(d.Path(), checkpoint.WithKeep(3))
	require.NoError(t, err)
	saveSteps(t, d, 40)
	steps, err := d.Steps()
	require.NoError(t, err)
	assert.Equal(t, []int64{40, 10}, steps, "step 10 is still one of the newest three good files")
	saveSteps(t, d, 50, 60)
	steps, _ = d.Steps()
	assert.Equal(t, []int64{60, 50, 40}, steps)
}
