package checkpoint

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/tensor"
)

// writeSharded writes a two-rank sharded checkpoint of one float32 tensor
// "w" of 10 elements (rank 0 holds [0, 4), rank 1 [4, 10)) with an Adam-like
// slot "m" = -w, and returns its directory.
func writeSharded(t *testing.T, root string, step int64) string {
	t.Helper()
	dir := ShardedPath(root, step)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	vals := make([]float32, 10)
	neg := make([]float32, 10)
	for i := range vals {
		vals[i] = float32(i) + 0.5
		neg[i] = -vals[i]
	}
	for r, c := range []Chunk{{File: 0, Off: 0, Len: 4}, {File: 1, Off: 4, Len: 6}} {
		st := &State{Config: struct{}{}, Step: step,
			Params:    []Named{{Name: ChunkName("w", c.Off), Tensor: tensor.New(tensor.WithShape(c.Len), tensor.WithBacking(vals[c.Off:c.Off+c.Len]))}},
			Optimizer: &Optimizer{Kind: "adam", Slots: []Named{{Name: ChunkName(SlotTensor("w", "m"), c.Off), Tensor: tensor.New(tensor.WithShape(c.Len), tensor.WithBacking(neg[c.Off:c.Off+c.Len]))}}}}
		require.NoError(t, SaveState(filepath.Join(dir, RankFile(r)), st))
	}
	x := &Index{Format: ShardedFormat, Version: ShardedVersion, Step: step, World: 2, Layout: "fsdp",
		Files: []string{RankFile(0), RankFile(1)}, Slots: []string{"m"},
		Tensors: []IndexTensor{{Name: "w", Dtype: "float32", Shape: []int{2, 5}, Chunks: []Chunk{{0, 0, 4}, {1, 4, 6}}}}}
	require.NoError(t, WriteIndex(dir, x))
	return dir
}

func TestShardedRead(t *testing.T) {
	root := t.TempDir()
	dir := writeSharded(t, root, 7)
	x, err := ReadIndex(dir)
	require.NoError(t, err)
	// Ranges across the chunk boundary, inside one chunk, and whole.
	a, b, c := make([]float32, 5), make([]float32, 2), make([]float32, 10)
	require.NoError(t, x.Read(dir, []Want{{Tensor: "w", Off: 2, F32: a}, {Tensor: "w", Off: 6, F32: b}, {Tensor: "w", Slot: "m", F32: c}}))
	assert.Equal(t, []float32{2.5, 3.5, 4.5, 5.5, 6.5}, a)
	assert.Equal(t, []float32{6.5, 7.5}, b)
	assert.Equal(t, float32(-9.5), c[9])

	for name, w := range map[string]Want{
		"unknown tensor": {Tensor: "v", F32: a},
		"unknown slot":   {Tensor: "w", Slot: "v", F32: a},
		"past the end":   {Tensor: "w", Off: 8, F32: a},
		"other dtype":    {Tensor: "w", F64: make([]float64, 2)},
	} {
		assert.Error(t, x.Read(dir, []Want{w}), name)
	}

	steps, err := ShardedSteps(root)
	require.NoError(t, err)
	assert.Equal(t, []int64{7}, steps)
}

// TestIndexRejected: indexes that do not describe a whole checkpoint are
// refused when read (ErrCorrupt) and when written.
func TestIndexRejected(t *testing.T) {
	root := t.TempDir()
	dir := writeSharded(t, root, 1)
	good, err := os.ReadFile(filepath.Join(dir, IndexName))
	require.NoError(t, err)
	edits := map[string]func(x *Index){
		"format":       func(x *Index) { x.Format = "other" },
		"gap":          func(x *Index) { x.Tensors[0].Chunks[1].Off = 5 },
		"overlap":      func(x *Index) { x.Tensors[0].Chunks[1].Off = 3 },
		"short":        func(x *Index) { x.Tensors[0].Chunks[1].Len = 5 },
		"file index":   func(x *Index) { x.Tensors[0].Chunks[1].File = 2 },
		"path in file": func(x *Index) { x.Files[1] = "../rank-00001.gdc" },
		"dtype":        func(x *Index) { x.Tensors[0].Dtype = "int8" },
		"shape":        func(x *Index) { x.Tensors[0].Shape = []int{0, 10} },
		"duplicate":    func(x *Index) { x.Tensors = append(x.Tensors, x.Tensors[0]) },
		"world":        func(x *Index) { x.World = 0 },
	}
	for name, edit := range edits {
		var x Index
		require.NoError(t, json.Unmarshal(good, &x))
		edit(&x)
		assert.ErrorIs(t, WriteIndex(t.TempDir(), &x), ErrInvalidArgument, name)
		b, err := json.Marshal(&x)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, IndexName), b, 0o644))
		_, err = ReadIndex(dir)
		assert.Error(t, err, name)
		if name != "version" {
			assert.ErrorIs(t, err, ErrCorrupt, name)
		}
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, IndexName), append(good[:len(good)-2:len(good)-2], []byte(`,"extra":1}`)...), 0o644))
	_, err = ReadIndex(dir)
	assert.ErrorIs(t, err, ErrCorrupt, "unknown field")
	require.NoError(t, os.Remove(filepath.Join(dir, IndexName)))
	_, err = ReadIndex(dir)
	assert.True(t, errors.Is(err, os.ErrNotExist))
}

// TestShardedDamage: a flipped byte in a rank file fails the read of that
// file's chunks with ErrCorrupt.
func TestShardedDamage(t *testing.T) {
	dir := writeSharded(t, t.TempDir(), 3)
	p := filepath.Join(dir, RankFile(1))
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	b[len(b)-40] ^= 1
	require.NoError(t, os.WriteFile(p, b, 0o644))
	x, err := ReadIndex(dir)
	require.NoError(t, err)
	require.NoError(t, x.Read(dir, []Want{{Tensor: "w", F32: make([]float32, 4)}}), "rank 0's chunk is intact")
	assert.ErrorIs(t, x.Read(dir, []Want{{Tensor: "w", Off: 4, F32: make([]float32, 6)}, {Tensor: "w", Slot: "m", Off: 4, F32: make([]float32, 6)}}), ErrCorrupt)
}

func TestPruneSharded(t *testing.T) {
	root := t.TempDir()
	for _, s := range []int64{1, 2, 3, 4} {
		writeSharded(t, root, s)
	}
	require.NoError(t, os.MkdirAll(ShardedPath(root, 2)+"x", 0o755)) // not a checkpoint
	require.NoError(t, os.Remove(filepath.Join(ShardedPath(root, 2), IndexName)))
	require.NoError(t, os.MkdirAll(ShardedPath(root, 5), 0o755)) // a save in progress
	require.NoError(t, PruneSharded(root, 2))
	steps, err := ShardedSteps(root)
	require.NoError(t, err)
	assert.Equal(t, []int64{4, 3}, steps)
	for _, name := range []string{"ckpt-5", "ckpt-2x"} {
		_, err := os.Stat(filepath.Join(root, name))
		assert.NoError(t, err, name)
	}
	for _, name := range []string{"ckpt-1", "ckpt-2"} {
		_, err := os.Stat(filepath.Join(root, name))
		assert.True(t, errors.Is(err, os.ErrNotExist), name)
	}
	assert.ErrorIs(t, PruneSharded(root, 0), ErrInvalidArgument)
}
