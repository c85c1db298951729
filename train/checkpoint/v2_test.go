package checkpoint_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/train/checkpoint"
)

// sampleState is a State using every field: optimizer slots of both float
// types (one named like a parameter, as namespaces allow), opaque sampler
// and RNG bytes and metadata.
func sampleState(t testing.TB) *checkpoint.State {
	t.Helper()
	rng, err := rand.NewPCG(1, 2).MarshalBinary()
	require.NoError(t, err)
	return &checkpoint.State{
		Config: testConfig{Name: "v2", Layers: 2, LR: 1e-3},
		Params: sampleTensors(),
		Optimizer: &checkpoint.Optimizer{
			Kind: "adam", Iter: 1234,
			Scalars: map[string]float64{"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8},
			Strings: map[string]string{"dtype": "float32", "note": "ünïcødé"},
			Slots: []checkpoint.Named{
				{Name: "layer00.emb/m", Tensor: tensor.New(tensor.WithShape(12), tensor.WithBacking(seq32(12, 0.5)))},
				{Name: "layer00.emb/v", Tensor: tensor.New(tensor.WithShape(12), tensor.WithBacking(seq32(12, 0.25)))},
				{Name: "layer01.w", Tensor: tensor.New(tensor.WithShape(6), tensor.WithBacking([]float64{1, 2, 3, 4, 5, 6}))},
			},
		},
		Step: 5000, Epoch: 3,
		Sampler: []byte("epoch 3, next 1280"),
		RNG:     rng,
		Meta:    map[string]string{"git": "abc123", "host": "x", "": "empty key"},
	}
}

func seq32(n int, scale float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(i) * scale
	}
	return v
}

func encodeState(t testing.TB, s *checkpoint.State) []byte {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, checkpoint.WriteState(&buf, s))
	return buf.Bytes()
}

func requireSameState(t *testing.T, want *checkpoint.State, f *checkpoint.File) {
	t.Helper()
	assert.Equal(t, want.Step, f.Step)
	assert.Equal(t, want.Epoch, f.Epoch)
	assert.Equal(t, want.Sampler, f.Sampler)
	assert.Equal(t, want.RNG, f.RNG)
	assert.Equal(t, want.Meta, f.Meta)
	wantCfg, err := json.Marshal(want.Config)
	require.NoError(t, err)
	assert.JSONEq(t, string(wantCfg), string(f.ConfigJSON()))
	require.Equal(t, len(want.Params), f.Len())
	for _, nt := range want.Params {
		g, err := f.Tensor(nt.Name)
		require.NoError(t, err, nt.Name)
		requireSameTensor(t, nt.Tensor, g)
	}
	if want.Optimizer == nil {
		assert.Nil(t, f.Optimizer)
		return
	}
	require.NotNil(t, f.Optimizer)
	o, g := want.Optimizer, f.Optimizer
	assert.Equal(t, o.Kind, g.Kind)
	assert.Equal(t, o.Iter, g.Iter)
	assert.Equal(t, o.Scalars, g.Scalars)
	assert.Equal(t, o.Strings, g.Strings)
	require.Len(t, g.Slots, len(o.Slots))
	for i, s := range o.Slots {
		assert.Equal(t, s.Name, g.Slots[i].Name)
		requireSameTensor(t, s.Tensor, g.Slots[i].Tensor.(*tensor.Dense))
	}
}

func TestStateRoundTrip(t *testing.T) {
	s := sampleState(t)
	data := encodeState(t, s)
	f, err := checkpoint.Read(bytes.NewReader(data))
	require.NoError(t, err)
	assert.Equal(t, uint32(2), f.Version)
	requireSameState(t, s, f)

	// Namespaces: "layer01.w" is both a parameter (float64 2x1x3) and a slot.
	p, err := f.Tensor("layer01.w")
	require.NoError(t, err)
	assert.Equal(t, []int{2, 1, 3}, []int(p.Shape()))
	slot, err := f.Optimizer.Slot("layer01.w")
	require.NoError(t, err)
	assert.Equal(t, []int{6}, []int(slot.Tensor.Shape()))
	_, err = f.Optimizer.Slot("nope")
	assert.ErrorIs(t, err, checkpoint.ErrMissingTensor)

	// The RNG state restores the generator where it was.
	src := rand.NewPCG(1, 2)
	var back rand.PCG
	require.NoError(t, back.UnmarshalBinary(f.RNG))
	assert.Equal(t, src.Uint64(), back.Uint64())

	// Deterministic, and File.State writes the same bytes back.
	assert.Equal(t, data, encodeState(t, s))
	assert.Equal(t, data, encodeState(t, f.State()))

	// The subset reader agrees, and its filter applies to slots too.
	sub, err := checkpoint.ReadSubset(bytes.NewReader(data), int64(len(data)), func(n string) bool {
		return strings.HasPrefix(n, "layer00.")
	})
	require.NoError(t, err)
	assert.Equal(t, []string{"layer00.emb"}, sub.Names())
	require.NotNil(t, sub.Optimizer)
	assert.Len(t, sub.Optimizer.Slots, 2)
	assert.Equal(t, int64(5000), sub.Step)
	assert.Equal(t, s.Optimizer.Scalars, sub.Optimizer.Scalars)

	// An empty State round-trips as well.
	empty := encodeState(t, &checkpoint.State{})
	f, err = checkpoint.Read(bytes.NewReader(empty))
	require.NoError(t, err)
	assert.Zero(t, f.Len())
	assert.Nil(t, f.Optimizer)
	assert.Nil(t, f.Meta)
	assert.Equal(t, "null", string(f.ConfigJSON()))
}

func TestWriteStateInvalid(t *testing.T) {
	one := tensor.New(tensor.WithShape(1), tensor.WithBacking([]float32{1}))
	cases := map[string]*checkpoint.State{
		"nil slot tensor": {Optimizer: &checkpoint.Optimizer{Slots: []checkpoint.Named{{Name: "m"}}}},
		"duplicate slot": {Optimizer: &checkpoint.Optimizer{Slots: []checkpoint.Named{
			{Name: "m", Tensor: one}, {Name: "m", Tensor: one}}}},
		"empty slot name": {Optimizer: &checkpoint.Optimizer{Slots: []checkpoint.Named{{Tensor: one}}}},
		"long meta key":   {Meta: map[string]string{strings.Repeat("k", 70000): ""}},
		"long scalar":     {Optimizer: &checkpoint.Optimizer{Scalars: map[string]float64{strings.Repeat("k", 70000): 1}}},
		"long kind":       {Optimizer: &checkpoint.Optimizer{Kind: strings.Repeat("k", 70000)}},
	}
	for name, s := range cases {
		t.Run(name, func(t *testing.T) {
			assert.ErrorIs(t, checkpoint.WriteState(&bytes.Buffer{}, s), checkpoint.ErrInvalidArgument)
		})
	}
	assert.ErrorIs(t, checkpoint.WriteState(&bytes.Buffer{}, nil), checkpoint.ErrInvalidArgument)
}

// TestV1FileLoads reads testdata/v1.gdc, written by the version 1 writer
// before version 2 existed.
func TestV1FileLoads(t *testing.T) {
	const path = "testdata/v1.gdc"
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, uint32(1), binary.LittleEndian.Uint32(data[8:]))

	want := &checkpoint.State{Config: testConfig{Name: "v1", Layers: 3, LR: 0.01}, Params: sampleTensors()}
	f, err := checkpoint.Load(path)
	require.NoError(t, err)
	assert.Equal(t, uint32(1), f.Version)
	requireSameState(t, want, f)
	var cfg testConfig
	require.NoError(t, f.Config(&cfg))
	assert.Equal(t, testConfig{Name: "v1", Layers: 3, LR: 0.01}, cfg)

	sub, err := checkpoint.LoadSubset(path, func(n string) bool { return n == "layer01.w" })
	require.NoError(t, err)
	assert.Equal(t, []string{"layer01.w"}, sub.Names())

	// Re-saved, it becomes a version 2 file with the same contents.
	v2 := encodeState(t, f.State())
	g, err := checkpoint.Read(bytes.NewReader(v2))
	require.NoError(t, err)
	assert.Equal(t, uint32(checkpoint.Version), g.Version)
	requireSameState(t, want, g)

	// Damage to a v1 file is still detected (every truncation, every flip
	// outside padding, which version 1 readers skip but this one checks).
	for n := range len(data) {
		_, err := checkpoint.Read(bytes.NewReader(data[:n]))
		require.ErrorIs(t, err, checkpoint.ErrCorrupt, "v1 truncated to %d", n)
	}
	for i := 12; i < len(data); i++ {
		bad := bytes.Clone(data)
		bad[i] ^= 0x01
		_, err := checkpoint.Read(bytes.NewReader(bad))
		require.ErrorIs(t, err, checkpoint.ErrCorrupt, "v1 flip at %d", i)
	}
}

// bigState is a State of about 100 KB.
func bigState(t testing.TB) *checkpoint.State {
	s := sampleState(t)
	r := rand.New(rand.NewPCG(3, 4))
	w := make([]float32, 20000)
	for i := range w {
		w[i] = r.Float32()
	}
	s.Params = append(s.Params, checkpoint.Named{Name: "layer09.big", Tensor: tensor.New(tensor.WithShape(100, 200), tensor.WithBacking(w))})
	s.Optimizer.Slots = append(s.Optimizer.Slots, checkpoint.Named{Name: "layer09.big/m",
		Tensor: tensor.New(tensor.WithShape(20000), tensor.WithBacking(seq32(20000, 1e-3)))})
	return s
}

// TestTornFiles truncates a checkpoint at every offset (small file) and at
// many seeded random offsets (large file): every reader reports ErrCorrupt.
func TestTornFiles(t *testing.T) {
	small := encodeState(t, sampleState(t))
	big := encodeState(t, bigState(t))
	r := rand.New(rand.NewPCG(9, 9))
	offsets := func(data []byte) []int {
		if len(data) < 4096 {
			out := make([]int, len(data))
			for i := range out {
				out[i] = i
			}
			return out
		}
		out := []int{0, 1, 16, len(data) - 1, len(data) - 24, len(data) - 25}
		for range 400 {
			out = append(out, r.IntN(len(data)))
		}
		return out
	}
	dir := t.TempDir()
	for name, data := range map[string][]byte{"small": small, "big": big} {
		t.Run(name, func(t *testing.T) {
			for _, n := range offsets(data) {
				torn := data[:n]
				_, err := checkpoint.Read(bytes.NewReader(torn))
				require.ErrorIs(t, err, checkpoint.ErrCorrupt, "Read truncated to %d of %d", n, len(data))
				_, err = checkpoint.ReadSubset(bytes.NewReader(torn), int64(n), nil)
				require.ErrorIs(t, err, checkpoint.ErrCorrupt, "ReadSubset truncated to %d", n)
				_, err = checkpoint.ReadSubset(bytes.NewReader(torn), int64(n), func(string) bool { return false })
				require.ErrorIs(t, err, checkpoint.ErrCorrupt, "ReadSubset (nothing selected) truncated to %d", n)
			}
			// Through the file loaders, for a sample of offsets.
			path := filepath.Join(dir, name+".gdc")
			for _, n := range offsets(data)[:40] {
				require.NoError(t, os.WriteFile(path, data[:n], 0o644))
				_, err := checkpoint.Load(path)
				require.ErrorIs(t, err, checkpoint.ErrCorrupt, "Load truncated to %d", n)
				_, err = checkpoint.LoadSubset(path, nil)
				require.ErrorIs(t, err, checkpoint.ErrCorrupt, "LoadSubset truncated to %d", n)
			}
			// Trailing garbage is damage too.
			require.NoError(t, os.WriteFile(path, append(bytes.Clone(data), 0), 0o644))
			_, err := checkpoint.Load(path)
			require.ErrorIs(t, err, checkpoint.ErrCorrupt)
			_, err = checkpoint.LoadSubset(path, nil)
			require.ErrorIs(t, err, checkpoint.ErrCorrupt)
		})
	}
}

// TestFlippedBytesEveryRegion flips seeded random bytes in every region of a
// large checkpoint and checks the error each gives.
func TestFlippedBytesEveryRegion(t *testing.T) {
	data := encodeState(t, bigState(t))
	regions := layout(t, data)
	byRegion := map[string][]int{}
	for i, r := range regions {
		r, _, _ = strings.Cut(r, ":")
		byRegion[r] = append(byRegion[r], i)
	}
	for _, r := range []string{"preamble", "config", "state", "index", "header-crc", "padding", "tensor", "trailer"} {
		require.NotEmpty(t, byRegion[r], "region %s", r)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for region, idx := range byRegion {
		t.Run(region, func(t *testing.T) {
			for range 200 {
				i := idx[rng.IntN(len(idx))]
				bad := bytes.Clone(data)
				bad[i] ^= byte(1 + rng.IntN(255))
				_, err := checkpoint.Read(bytes.NewReader(bad))
				switch {
				case i < 8:
					require.ErrorIs(t, err, checkpoint.ErrBadMagic, "byte %d", i)
				case i < 12:
					if v := binary.LittleEndian.Uint32(bad[8:]); v >= checkpoint.MinVersion && v <= checkpoint.Version {
						// Another readable version: the header checksum,
						// which covers the version, catches it.
						require.ErrorIs(t, err, checkpoint.ErrChecksum, "byte %d, version %d", i, v)
					} else {
						require.ErrorIs(t, err, checkpoint.ErrUnsupportedVersion, "byte %d", i)
					}
				case i < 16, region == "padding":
					require.ErrorIs(t, err, checkpoint.ErrCorrupt, "byte %d (%s)", i, regions[i])
				default: // covered by a checksum
					require.ErrorIs(t, err, checkpoint.ErrChecksum, "byte %d (%s)", i, regions[i])
				}
			}
		})
	}
}

// layout names the region of every byte of a version 2 file: preamble,
// config, state, index, header-crc, padding, tensor:<name> or trailer. It
// also checks that padding is zero and that the regions tile the file.
func layout(t testing.TB, data []byte) []string {
	t.Helper()
	le := binary.LittleEndian
	out := make([]string, len(data))
	mark := func(from, to int, what string) {
		for i := from; i < to; i++ {
			require.Empty(t, out[i], "byte %d is in %s and %s", i, out[i], what)
			out[i] = what
		}
	}
	mark(0, 16, "preamble")
	hlen := int(le.Uint32(data[12:]))
	p := 16
	clen := int(le.Uint32(data[p:]))
	mark(p, p+4+clen, "config")
	p += 4 + clen
	slen := int(le.Uint32(data[p:]))
	mark(p, p+4+slen, "state")
	p += 4 + slen
	n := int(le.Uint32(data[p:]))
	start := p
	p += 4
	type ent struct {
		name     string
		off, len int
	}
	var ents []ent
	for range n {
		nl := int(le.Uint16(data[p+1:]))
		name := string(data[p+3 : p+3+nl])
		p += 3 + nl
		rank := int(data[p+1])
		p += 2 + 8*rank
		ents = append(ents, ent{name, int(le.Uint64(data[p:])), int(le.Uint64(data[p+8:]))})
		p += 20
	}
	mark(start, p, "index")
	require.Equal(t, 16+hlen, p)
	mark(p, p+4, "header-crc")
	for _, e := range ents {
		mark(e.off, e.off+e.len, "tensor:"+e.name)
	}
	mark(len(data)-24, len(data), "trailer")
	for i := range out {
		if out[i] == "" {
			require.Zero(t, data[i], "padding byte %d", i)
			out[i] = "padding"
		}
	}
	return out
}

// FuzzRead feeds arbitrary bytes to both readers: they must not panic, must
// fail with one of the package's errors, and, when they succeed, agree with
// each other and re-encode to a file that reads back the same.
func FuzzRead(f *testing.F) {
	v1, err := os.ReadFile("testdata/v1.gdc")
	require.NoError(f, err)
	f.Add(v1)
	f.Add(encodeState(f, sampleState(f)))
	f.Add(encodeState(f, &checkpoint.State{}))
	f.Add(encodeState(f, &checkpoint.State{Optimizer: &checkpoint.Optimizer{Kind: "sgd"}, Meta: map[string]string{"a": "b"}}))
	f.Add([]byte{})
	known := []error{checkpoint.ErrBadMagic, checkpoint.ErrUnsupportedVersion, checkpoint.ErrCorrupt, checkpoint.ErrUnsupportedDtype}
	classified := func(err error) bool {
		for _, k := range known {
			if errors.Is(err, k) {
				return true
			}
		}
		return false
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		full, err := checkpoint.Read(bytes.NewReader(data))
		if err != nil && !classified(err) {
			t.Fatalf("Read: unclassified error %v", err)
		}
		sub, serr := checkpoint.ReadSubset(bytes.NewReader(data), int64(len(data)), nil)
		if serr != nil && !classified(serr) {
			t.Fatalf("ReadSubset: unclassified error %v", serr)
		}
		if err != nil || serr != nil {
			return
		}
		if fmt.Sprint(full.Names()) != fmt.Sprint(sub.Names()) || full.Step != sub.Step {
			t.Fatalf("readers disagree: %v/%d vs %v/%d", full.Names(), full.Step, sub.Names(), sub.Step)
		}
		var buf bytes.Buffer
		if err := checkpoint.WriteState(&buf, full.State()); err != nil {
			t.Fatalf("re-encoding a file that read: %v", err)
		}
		again, err := checkpoint.Read(&buf)
		if err != nil {
			t.Fatalf("re-encoded file does not read: %v", err)
		}
		if fmt.Sprint(again.Names()) != fmt.Sprint(full.Names()) || again.Epoch != full.Epoch {
			t.Fatalf("re-encoded file differs")
		}
	})
}

// TestVersionRelabelled: a version 2 file whose version field reads 1 (or
// the reverse) is not parsed with the other layout: the header checksum,
// which covers the version, rejects it.
func TestVersionRelabelled(t *testing.T) {
	v2 := encodeState(t, sampleState(t))
	v1, err := os.ReadFile("testdata/v1.gdc")
	require.NoError(t, err)
	for name, c := range map[string]struct {
		data []byte
		to   uint32
	}{"v2 as v1": {v2, 1}, "v1 as v2": {v1, 2}} {
		bad := bytes.Clone(c.data)
		binary.LittleEndian.PutUint32(bad[8:], c.to)
		_, err := checkpoint.Read(bytes.NewReader(bad))
		assert.ErrorIs(t, err, checkpoint.ErrChecksum, name)
		_, err = checkpoint.ReadSubset(bytes.NewReader(bad), int64(len(bad)), nil)
		assert.ErrorIs(t, err, checkpoint.ErrChecksum, name)
	}
}
