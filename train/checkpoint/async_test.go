package checkpoint_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/train/checkpoint"
)

func TestAsyncSavesSnapshots(t *testing.T) {
	ctx := context.Background()
	d, err := checkpoint.OpenDir(t.TempDir(), checkpoint.WithKeep(10))
	require.NoError(t, err)
	a := checkpoint.NewAsync(d)
	t.Cleanup(func() { a.Close() })

	// One State mutated in place between saves, as a training loop does.
	s := newStateAt(0)
	w := s.Params[0].Tensor.Data().([]float32)
	m := s.Optimizer.Slots[0].Tensor.Data().([]float32)
	for step := int64(1); step <= 5; step++ {
		for i := range w {
			w[i] = float32(step) + float32(i)/1000
			m[i] = float32(i) * float32(step)
		}
		s.Config = testConfig{Name: "dir", Layers: int(step)}
		s.Optimizer.Iter = step
		s.Sampler = []byte{byte(step)}
		s.Meta = map[string]string{"step": string(rune('0' + step))}
		require.NoError(t, a.Save(ctx, step, s))
		// Scribble over everything Save was given: the snapshot is a copy.
		for i := range w {
			w[i], m[i] = -1, -1
		}
		s.Sampler[0] = 0xFF
		s.Meta["step"] = "x"
	}
	require.NoError(t, a.Wait(ctx))
	require.NoError(t, a.Wait(ctx), "nothing in flight")

	for step := int64(1); step <= 5; step++ {
		f, err := checkpoint.Load(d.StepPath(step))
		require.NoError(t, err)
		want := newStateAt(step)
		want.Step = step
		want.Epoch = 0
		want.Meta = map[string]string{"step": string(rune('0' + step))}
		for i := range 300 {
			want.Optimizer.Slots[0].Tensor.Data().([]float32)[i] = float32(i) * float32(step)
		}
		requireSameState(t, want, f)
	}
	st := a.Stats()
	assert.Equal(t, 5, st.Saves)
	assert.Equal(t, 5, st.Writes)
	assert.Zero(t, st.Failed)
	assert.Equal(t, d.StepPath(5), st.LastPath)
	assert.Positive(t, st.Copy)
	assert.Positive(t, st.Write)

	require.NoError(t, a.Close())
	require.NoError(t, a.Close(), "idempotent")
	assert.ErrorIs(t, a.Save(ctx, 6, s), checkpoint.ErrClosed)
	assert.ErrorIs(t, a.Wait(ctx), checkpoint.ErrClosed)
}

// TestAsyncReportsWriteErrors: a write that fails on the goroutine is
// reported by the next call, once, as a *WriteError naming the step.
func TestAsyncReportsWriteErrors(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	path := filepath.Join(root, "ck")
	d, err := checkpoint.OpenDir(path)
	require.NoError(t, err)
	a := checkpoint.NewAsync(d)
	defer a.Close()

	// The directory disappears: writes fail.
	require.NoError(t, os.RemoveAll(path))
	require.NoError(t, os.WriteFile(path, []byte("a file, not a directory"), 0o644))
	require.NoError(t, a.Save(ctx, 1, newStateAt(1)))
	err = a.Wait(ctx)
	var we *checkpoint.WriteError
	require.ErrorAs(t, err, &we)
	assert.Equal(t, int64(1), we.Step)
	require.NoError(t, a.Wait(ctx), "reported once")

	// Reported by the next Save, whose own snapshot is still queued...
	require.NoError(t, a.Save(ctx, 2, newStateAt(2)))
	err = a.Save(ctx, 3, newStateAt(3))
	require.ErrorAs(t, err, &we)
	assert.Equal(t, int64(2), we.Step)
	// ... and written once the directory is back.
	err = a.Wait(ctx)
	require.ErrorAs(t, err, &we)
	assert.Equal(t, int64(3), we.Step)
	require.NoError(t, os.Remove(path))
	require.NoError(t, os.Mkdir(path, 0o755))
	require.NoError(t, a.Save(ctx, 4, newStateAt(4)))
	require.NoError(t, a.Wait(ctx))
	f, _, err := d.LoadLatest()
	require.NoError(t, err)
	assert.Equal(t, int64(4), f.Step)

	// By Close, too.
	require.NoError(t, os.RemoveAll(path))
	require.NoError(t, a.Save(ctx, 5, newStateAt(5)))
	require.ErrorAs(t, a.Close(), &we)
	assert.Equal(t, 4, a.Stats().Failed, "steps 1, 2, 3 and 5")

	// Bad arguments and a state that cannot be copied queue nothing.
	b := checkpoint.NewAsync(d)
	defer b.Close()
	assert.ErrorIs(t, b.Save(ctx, -1, newStateAt(1)), checkpoint.ErrInvalidArgument)
	assert.ErrorIs(t, b.Save(ctx, 1, nil), checkpoint.ErrInvalidArgument)
	bad := newStateAt(1)
	bad.Params[0].Tensor = tensor.New(tensor.WithShape(1), tensor.WithBacking([]bool{true}))
	assert.ErrorIs(t, b.Save(ctx, 1, bad), checkpoint.ErrUnsupportedDtype)
	assert.Zero(t, b.Stats().Saves)
}

// TestAsyncWaitHonoursContext: a Wait whose context ends before the write
// does returns the context's error, and the write is still reported later.
func TestAsyncWaitHonoursContext(t *testing.T) {
	d, err := checkpoint.OpenDir(t.TempDir())
	require.NoError(t, err)
	a := checkpoint.NewAsync(d)
	defer a.Close()
	require.NoError(t, a.Save(context.Background(), 1, bigState(t)))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// The write may or may not have finished; either answer is allowed,
	// but a cancelled context must not make Wait block or lose the write.
	if err := a.Wait(ctx); err != nil {
		require.True(t, errors.Is(err, context.Canceled), "%v", err)
	}
	require.NoError(t, a.Save(context.Background(), 2, bigState(t)))
	require.NoError(t, a.Close())
	steps, err := d.Steps()
	require.NoError(t, err)
	assert.Equal(t, []int64{2, 1}, steps)
}

// mlpState is the state of the MNIST MLP (784-256-128-10, 235,146 float32
// parameters) with Adam's two moments per parameter.
func mlpState() *checkpoint.State {
	sizes := []int{784, 256, 128, 10}
	s := &checkpoint.State{Config: map[string]any{"sizes": sizes}, Optimizer: &checkpoint.Optimizer{
		Kind: "adam", Iter: 1000, Scalars: map[string]float64{"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8}}}
	for l := range len(sizes) - 1 {
		for _, p := range []struct {
			name  string
			shape []int
		}{{"w", []int{sizes[l], sizes[l+1]}}, {"b", []int{sizes[l+1]}}} {
			n := 1
			for _, d := range p.shape {
				n *= d
			}
			name := "layer" + string(rune('0'+l)) + "." + p.name
			s.Params = append(s.Params, checkpoint.Named{Name: name,
				Tensor: tensor.New(tensor.WithShape(p.shape...), tensor.WithBacking(seq32(n, 1e-4)))})
			for _, slot := range []string{"m", "v"} {
				s.Optimizer.Slots = append(s.Optimizer.Slots, checkpoint.Named{Name: name + "/" + slot,
					Tensor: tensor.New(tensor.WithShape(n), tensor.WithBacking(seq32(n, 1e-5)))})
			}
		}
	}
	return s
}

func TestMLPStateSize(t *testing.T) {
	n := 0
	for _, p := range mlpState().Params {
		n += p.Tensor.Shape().TotalSize()
	}
	assert.Equal(t, 235146, n)
}

// BenchmarkAsyncSaveMLP measures what a training loop pays per checkpoint
// of the MNIST MLP with Adam: "copy-ms" is the time Save blocks (the copy),
// "write-ms" the time the goroutine spends writing (encode, fsync, read
// back and verify, rename, prune).
func BenchmarkAsyncSaveMLP(b *testing.B) {
	d, err := checkpoint.OpenDir(b.TempDir(), checkpoint.WithKeep(2))
	require.NoError(b, err)
	a := checkpoint.NewAsync(d)
	s := mlpState()
	ctx := context.Background()
	step := int64(0)
	for b.Loop() {
		step++
		require.NoError(b, a.Save(ctx, step, s))
		require.NoError(b, a.Wait(ctx))
	}
	require.NoError(b, a.Close())
	st := a.Stats()
	b.ReportMetric(float64(st.Copy.Microseconds())/1000/float64(st.Saves), "copy-ms")
	b.ReportMetric(float64(st.Write.Microseconds())/1000/float64(st.Writes), "write-ms")
	fi, err := os.Stat(st.LastPath)
	require.NoError(b, err)
	b.ReportMetric(float64(fi.Size())/1e6, "MB")
}

// BenchmarkLoadLatestMLP measures resuming: finding and fully verifying
// the newest checkpoint of the MNIST MLP with Adam.
func BenchmarkLoadLatestMLP(b *testing.B) {
	d, err := checkpoint.OpenDir(b.TempDir())
	require.NoError(b, err)
	_, err = d.SaveStep(1, mlpState())
	require.NoError(b, err)
	for b.Loop() {
		if _, _, err := d.LoadLatest(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWriteStateMLP is the encoding alone (to io.Discard), and
// BenchmarkSaveStateMLP an atomic save without the read-back verification,
// to split BenchmarkAsyncSaveMLP's write time.
func BenchmarkWriteStateMLP(b *testing.B) {
	s := mlpState()
	for b.Loop() {
		if err := checkpoint.WriteState(io.Discard, s); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSaveStateMLP(b *testing.B) {
	s := mlpState()
	path := filepath.Join(b.TempDir(), "mlp.gdc")
	for b.Loop() {
		if err := checkpoint.SaveState(path, s); err != nil {
			b.Fatal(err)
		}
	}
}
