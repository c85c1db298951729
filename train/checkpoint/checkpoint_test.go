package checkpoint_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/train/checkpoint"
)

type testConfig struct {
	Name   string  `json:"name"`
	Layers int     `json:"layers"`
	LR     float64 `json:"lr"`
}

func sampleTensors() []checkpoint.Named {
	return []checkpoint.Named{
		{Name: "layer00.emb", Tensor: tensor.New(tensor.WithShape(3, 4), tensor.WithBacking([]float32{
			1, 2, 3, 4, 5, 6, 7, 8, 9, 10, -11.5, float32(1e-30)}))},
		{Name: "layer01.w", Tensor: tensor.New(tensor.WithShape(2, 1, 3), tensor.WithBacking([]float64{
			0.1, -0.2, 0.3, 1e300, -1e-300, 42}))},
		{Name: "layer01.steps", Tensor: tensor.New(tensor.WithShape(5), tensor.WithBacking([]int64{1, -2, 3, 1 << 40, -1 << 50}))},
		{Name: "layer02.ids", Tensor: tensor.New(tensor.WithShape(1, 1), tensor.WithBacking([]int32{-7}))},
		{Name: "layer02.scale", Tensor: tensor.New(tensor.FromScalar(float64(2.5)))},
		{Name: "layer02.empty", Tensor: tensor.New(tensor.WithShape(0, 3), tensor.Of(tensor.Float32))},
		{Name: "unicode.ünïcødé", Tensor: tensor.New(tensor.WithShape(1), tensor.WithBacking([]float32{3}))},
	}
}

func encode(t *testing.T, cfg any, ts []checkpoint.Named) []byte {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, checkpoint.Write(&buf, cfg, ts))
	return buf.Bytes()
}

func requireSameTensor(t *testing.T, want tensor.Tensor, got *tensor.Dense) {
	t.Helper()
	require.NotNil(t, got)
	assert.Equal(t, want.Dtype(), got.Dtype())
	assert.True(t, want.Shape().Eq(got.Shape()), "shape %v vs %v", want.Shape(), got.Shape())
	if want.Shape().TotalSize() == 0 && !want.Shape().IsScalar() {
		return // Dense.Data panics on empty tensors
	}
	assert.Equal(t, want.Data(), got.Data())
}

func TestRoundTrip(t *testing.T) {
	cfg := testConfig{Name: "tiny", Layers: 2, LR: 3e-4}
	ts := sampleTensors()
	data := encode(t, cfg, ts)

	f, err := checkpoint.Read(bytes.NewReader(data))
	require.NoError(t, err)
	assert.Equal(t, uint32(checkpoint.Version), f.Version)
	var got testConfig
	require.NoError(t, f.Config(&got))
	assert.Equal(t, cfg, got)
	assert.JSONEq(t, `{"name":"tiny","layers":2,"lr":0.0003}`, string(f.ConfigJSON()))

	names := make([]string, len(ts))
	for i, nt := range ts {
		names[i] = nt.Name
		g, err := f.Tensor(nt.Name)
		require.NoError(t, err, nt.Name)
		requireSameTensor(t, nt.Tensor, g)
	}
	assert.Equal(t, names, f.Names())
	assert.Equal(t, len(ts), f.Len())
	assert.Len(t, f.Tensors(), len(ts))

	_, err = f.Tensor("nope")
	assert.ErrorIs(t, err, checkpoint.ErrMissingTensor)

	// Writing again is byte-identical (deterministic output).
	assert.Equal(t, data, encode(t, cfg, ts))

	// The subset reader over the same bytes agrees.
	f2, err := checkpoint.ReadSubset(bytes.NewReader(data), int64(len(data)), nil)
	require.NoError(t, err)
	assert.Equal(t, names, f2.Names())
}

func TestAlignment(t *testing.T) {
	data := encode(t, nil, sampleTensors())
	assert.Zero(t, len(data)%8, "file length is a multiple of 8")
	assert.Equal(t, []byte{0x89, 'G', 'D', 'C', '\r', '\n', 0x1A, '\n'}, data[:8])
	assert.Equal(t, uint32(checkpoint.Version), binary.LittleEndian.Uint32(data[8:]))
	assert.Equal(t, []byte("GDCEND\r\n"), data[len(data)-24:len(data)-16], "trailer")
	assert.Equal(t, uint64(len(data)), binary.LittleEndian.Uint64(data[len(data)-16:]), "trailer records the file length")
}

func TestViewIsMaterialized(t *testing.T) {
	full := tensor.New(tensor.WithShape(3, 3), tensor.WithBacking([]float64{0, 1, 2, 3, 4, 5, 6, 7, 8}))
	view, err := full.Slice(nil, tensor.S(1, 3)) // columns 1..2
	require.NoError(t, err)
	data := encode(t, nil, []checkpoint.Named{{Name: "v", Tensor: view}})
	f, err := checkpoint.Read(bytes.NewReader(data))
	require.NoError(t, err)
	g, err := f.Tensor("v")
	require.NoError(t, err)
	assert.Equal(t, []float64{1, 2, 4, 5, 7, 8}, g.Data())
}

func TestWriteInvalid(t *testing.T) {
	one := tensor.New(tensor.WithShape(1), tensor.WithBacking([]float32{1}))
	cases := map[string]struct {
		ts   []checkpoint.Named
		want error
	}{
		"empty name": {[]checkpoint.Named{{Name: "", Tensor: one}}, checkpoint.ErrInvalidArgument},
		"duplicate":  {[]checkpoint.Named{{Name: "a", Tensor: one}, {Name: "a", Tensor: one}}, checkpoint.ErrInvalidArgument},
		"nil tensor": {[]checkpoint.Named{{Name: "a"}}, checkpoint.ErrInvalidArgument},
		"long name":  {[]checkpoint.Named{{Name: strings.Repeat("x", 70000), Tensor: one}}, checkpoint.ErrInvalidArgument},
		"dtype": {[]checkpoint.Named{{Name: "a", Tensor: tensor.New(tensor.WithShape(1),
			tensor.WithBacking([]bool{true}))}}, checkpoint.ErrUnsupportedDtype},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := checkpoint.Write(io.Discard, nil, tc.ts)
			assert.ErrorIs(t, err, tc.want)
		})
	}
}

func TestCorruptionDetected(t *testing.T) {
	data := encode(t, testConfig{Name: "x"}, sampleTensors())

	t.Run("every byte flip", func(t *testing.T) {
		// Flipping any byte must be detected by the full reader, which
		// also checks the padding; the index reader, which does not read
		// padding, must detect every flip outside it.
		regions := layout(t, data)
		for i := range data {
			bad := bytes.Clone(data)
			bad[i] ^= 0x40
			_, err := checkpoint.Read(bytes.NewReader(bad))
			require.Error(t, err, "flip at byte %d (%s) not detected", i, regions[i])
			switch {
			case i < 8:
				require.ErrorIs(t, err, checkpoint.ErrBadMagic, "byte %d", i)
			case i < 12:
				require.ErrorIs(t, err, checkpoint.ErrUnsupportedVersion, "byte %d", i)
			default:
				require.ErrorIs(t, err, checkpoint.ErrCorrupt, "byte %d (%s)", i, regions[i])
			}
			if regions[i] == "padding" {
				continue
			}
			_, err = checkpoint.ReadSubset(bytes.NewReader(bad), int64(len(bad)), nil)
			require.Error(t, err, "subset: flip at byte %d (%s) not detected", i, regions[i])
		}
	})

	t.Run("data checksum", func(t *testing.T) {
		bad := bytes.Clone(data)
		bad[len(bad)-9] ^= 1 // inside the last tensor's data, before padding
		_, err := checkpoint.Read(bytes.NewReader(bad))
		require.ErrorIs(t, err, checkpoint.ErrChecksum)
		require.ErrorIs(t, err, checkpoint.ErrCorrupt)
	})

	t.Run("truncation", func(t *testing.T) {
		for _, n := range []int{0, 3, 8, 15, 16, 40, len(data) / 2, len(data) - 9} {
			_, err := checkpoint.Read(bytes.NewReader(data[:n]))
			require.ErrorIs(t, err, checkpoint.ErrCorrupt, "truncated to %d", n)
			_, err = checkpoint.ReadSubset(bytes.NewReader(data[:n]), int64(n), nil)
			require.ErrorIs(t, err, checkpoint.ErrCorrupt, "subset truncated to %d", n)
			require.ErrorIs(t, err, checkpoint.ErrCorrupt, "subset truncated to %d", n)
		}
	})

	t.Run("not a checkpoint", func(t *testing.T) {
		_, err := checkpoint.Read(strings.NewReader("PK\x03\x04 this is a zip file, not a checkpoint"))
		require.ErrorIs(t, err, checkpoint.ErrBadMagic)
		_, err = checkpoint.Read(strings.NewReader("{}"))
		require.ErrorIs(t, err, checkpoint.ErrBadMagic)
	})

	t.Run("future version", func(t *testing.T) {
		bad := bytes.Clone(data)
		binary.LittleEndian.PutUint32(bad[8:], checkpoint.Version+1)
		_, err := checkpoint.Read(bytes.NewReader(bad))
		require.ErrorIs(t, err, checkpoint.ErrUnsupportedVersion)
		require.NotErrorIs(t, err, checkpoint.ErrCorrupt)
	})

	t.Run("huge header refused", func(t *testing.T) {
		bad := bytes.Clone(data[:16])
		binary.LittleEndian.PutUint32(bad[12:], 0xFFFFFFF0)
		_, err := checkpoint.Read(bytes.NewReader(bad))
		require.ErrorIs(t, err, checkpoint.ErrCorrupt)
	})
}

func TestSaveLoadAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "model.ckpt")
	ts := sampleTensors()
	require.NoError(t, checkpoint.Save(path, testConfig{Layers: 1}, ts))
	require.NoError(t, checkpoint.Save(path, testConfig{Layers: 2}, ts)) // overwrite

	f, err := checkpoint.Load(path)
	require.NoError(t, err)
	var cfg testConfig
	require.NoError(t, f.Config(&cfg))
	assert.Equal(t, 2, cfg.Layers)

	// A failed save leaves the old file and no temporary files behind.
	bad := []checkpoint.Named{{Name: "a", Tensor: ts[0].Tensor}, {Name: "a", Tensor: ts[0].Tensor}}
	require.ErrorIs(t, checkpoint.Save(path, testConfig{Layers: 3}, bad), checkpoint.ErrInvalidArgument)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1)
	assert.Equal(t, "model.ckpt", entries[0].Name())
	f, err = checkpoint.Load(path)
	require.NoError(t, err)
	require.NoError(t, f.Config(&cfg))
	assert.Equal(t, 2, cfg.Layers)

	_, err = checkpoint.Load(filepath.Join(dir, "missing"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

// countingReaderAt records which byte ranges were read.
type countingReaderAt struct {
	r     io.ReaderAt
	bytes int64
}

func (c *countingReaderAt) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(p, off)
	c.bytes += int64(n)
	return n, err
}

func TestLoadSubset(t *testing.T) {
	// A big tensor that a subset load must not read.
	big := make([]float64, 1<<16)
	for i := range big {
		big[i] = float64(i)
	}
	ts := append(sampleTensors(), checkpoint.Named{Name: "layer09.big",
		Tensor: tensor.New(tensor.WithShape(256, 256), tensor.WithBacking(big))})
	dir := t.TempDir()
	path := filepath.Join(dir, "m.ckpt")
	require.NoError(t, checkpoint.Save(path, testConfig{Name: "s"}, ts))

	keep := func(name string) bool { return strings.HasPrefix(name, "layer01.") }
	f, err := checkpoint.LoadSubset(path, keep)
	require.NoError(t, err)
	assert.Equal(t, []string{"layer01.w", "layer01.steps"}, f.Names())
	var cfg testConfig
	require.NoError(t, f.Config(&cfg))
	assert.Equal(t, "s", cfg.Name)
	w, err := f.Tensor("layer01.w")
	require.NoError(t, err)
	requireSameTensor(t, ts[1].Tensor, w)
	_, err = f.Tensor("layer00.emb")
	assert.ErrorIs(t, err, checkpoint.ErrMissingTensor)

	// Only the header and the selected tensors are read.
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	cr := &countingReaderAt{r: bytes.NewReader(data)}
	_, err = checkpoint.ReadSubset(cr, int64(len(data)), keep)
	require.NoError(t, err)
	assert.Less(t, cr.bytes, int64(4096), "read %d of %d bytes", cr.bytes, len(data))

	// Corruption in an unselected tensor is not seen; in a selected one it is.
	bad := bytes.Clone(data)
	bad[len(bad)-100] ^= 1 // inside layer09.big
	_, err = checkpoint.ReadSubset(bytes.NewReader(bad), int64(len(bad)), keep)
	require.NoError(t, err)
	_, err = checkpoint.ReadSubset(bytes.NewReader(bad), int64(len(bad)),
		func(n string) bool { return n == "layer09.big" })
	require.ErrorIs(t, err, checkpoint.ErrChecksum)

	// Selecting nothing still validates the header.
	f, err = checkpoint.LoadSubset(path, func(string) bool { return false })
	require.NoError(t, err)
	assert.Zero(t, f.Len())
}

func TestConfigErrors(t *testing.T) {
	data := encode(t, map[string]any{"layers": "two"}, nil)
	f, err := checkpoint.Read(bytes.NewReader(data))
	require.NoError(t, err)
	var cfg testConfig
	require.Error(t, f.Config(&cfg))
	require.Error(t, checkpoint.Write(io.Discard, func() {}, nil))
	assert.True(t, errors.Is(checkpoint.ErrChecksum, checkpoint.ErrCorrupt))
}
