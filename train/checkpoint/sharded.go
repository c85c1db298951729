package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gorgonia.org/tensor"
)

// Sharded checkpoints. A job whose ranks each hold part of the state (ZeRO,
// fully sharded parameters) saves a checkpoint as a directory, as torch's
// distributed checkpoint (DCP) does:
//
//	ckpt-<step>/rank-00000.gdc   each rank's parts, a checkpoint file of the format above
//	ckpt-<step>/rank-00001.gdc
//	ckpt-<step>/index.json       written last: which file holds which part of which tensor
//
// Every tensor is stored in chunks, contiguous ranges of its elements in
// row-major order, as 1-D tensors named "<tensor>@<offset>" (parameters)
// and "<tensor>/<slot>@<offset>" (the optimizer's slots of that parameter,
// in the optimizer namespace, with the parameter's chunks). The index says,
// for every parameter, its dtype, its shape and its chunks (the file, the
// offset and the length of each), in order, covering it exactly once; and
// the optimizer's slot names. Rank 0's file also holds the rest of the
// state (configuration, step, epoch, sampler position, RNG, metadata and
// the optimizer's kind, iteration count and hyper-parameters). A directory
// without its index is an incomplete save and is never loaded.
//
// A loader of any world size and layout reads the index and then, from each
// file, only the chunks that overlap what it needs (Index.Read).

// IndexName is the name of a sharded checkpoint's index in its directory.
const IndexName = "index.json"

// ShardedFormat and ShardedVersion identify an index.
const (
	ShardedFormat  = "gdist.sharded"
	ShardedVersion = 1
)

// RankFile returns the name of rank's file in a sharded checkpoint.
func RankFile(rank int) string { return fmt.Sprintf("rank-%05d.gdc", rank) }

// ChunkName returns the name under which a chunk of tensor (a parameter, or
// "<parameter>/<slot>") starting at element off is stored.
func ChunkName(tensor string, off int) string { return tensor + "@" + strconv.Itoa(off) }

// SlotTensor returns the name of an optimizer slot of a parameter, as
// chunks store it: "<param>/<slot>".
func SlotTensor(param, slot string) string { return param + "/" + slot }

// Segment is part of a tensor: Len elements of the tensor named Name from
// element Off, in row-major order.
type Segment struct {
	Name     string
	Off, Len int
}

// Index is a sharded checkpoint's index (index.json).
type Index struct {
	Format  string `json:"format"`  // ShardedFormat
	Version int    `json:"version"` // ShardedVersion
	Step    int64  `json:"step"`
	// World is the number of ranks that saved, Layout how they held the
	// state (for example "ddp", "zero1", "zero2", "fsdp").
	World  int    `json:"world"`
	Layout string `json:"layout"`
	// Files are the ranks' files, in rank order; chunks refer to them by
	// position.
	Files []string `json:"files"`
	// Slots are the optimizer's per-parameter slots (for example "m" and
	// "v"), stored for every parameter with its chunks.
	Slots   []string      `json:"slots,omitempty"`
	Tensors []IndexTensor `json:"tensors"`
}

// IndexTensor is one parameter of a sharded checkpoint.
type IndexTensor struct {
	Name   string  `json:"name"`
	Dtype  string  `json:"dtype"` // "float32" or "float64"
	Shape  []int   `json:"shape"` // empty for a scalar
	Chunks []Chunk `json:"chunks"`
}

// Chunk is where a range of a tensor's elements is stored: in Files[File],
// elements [Off, Off+Len).
type Chunk struct {
	File int `json:"file"`
	Off  int `json:"off"`
	Len  int `json:"len"`
}

// Numel returns the number of elements of the tensor (1 for a scalar).
func (t IndexTensor) Numel() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// DtypeName returns the name an index gives a dtype.
func DtypeName(dt tensor.Dtype) string { return dt.String() }

// Tensor returns the named tensor of the index.
func (x *Index) Tensor(name string) (IndexTensor, bool) {
	for _, t := range x.Tensors {
		if t.Name == name {
			return t, true
		}
	}
	return IndexTensor{}, false
}

// validate checks the index in itself: format and version, file names,
// dtypes and shapes, and that every tensor's chunks cover it exactly once.
func (x *Index) validate() error {
	bad := func(format string, args ...any) error { return corrupt("index: "+format, args...) }
	switch {
	case x.Format != ShardedFormat:
		return bad("format %q, want %q", x.Format, ShardedFormat)
	case x.Version != ShardedVersion:
		return fmt.Errorf("%w: sharded checkpoint index version %d", ErrUnsupportedVersion, x.Version)
	case x.World < 1 || len(x.Files) == 0:
		return bad("world %d with %d files", x.World, len(x.Files))
	}
	for _, f := range x.Files {
		if f == "" || f != filepath.Base(f) || strings.HasPrefix(f, ".") {
			return bad("file name %q", f)
		}
	}
	seen := make(map[string]bool, len(x.Tensors))
	for _, t := range x.Tensors {
		if t.Name == "" || seen[t.Name] {
			return bad("tensor name %q empty or repeated", t.Name)
		}
		seen[t.Name] = true
		if t.Dtype != DtypeName(tensor.Float32) && t.Dtype != DtypeName(tensor.Float64) {
			return bad("tensor %q has dtype %q", t.Name, t.Dtype)
		}
		for _, d := range t.Shape {
			if d <= 0 {
				return bad("tensor %q has shape %v", t.Name, t.Shape)
			}
		}
		next := 0
		for _, c := range t.Chunks {
			if c.File < 0 || c.File >= len(x.Files) || c.Off != next || c.Len <= 0 {
				return bad("tensor %q: chunk %+v where element %d is due", t.Name, c, next)
			}
			next += c.Len
		}
		if next != t.Numel() {
			return bad("tensor %q: chunks cover %d of %d elements", t.Name, next, t.Numel())
		}
	}
	return nil
}

// WriteIndex writes x as dir/index.json atomically (a temporary file,
// synced, renamed into place).
func WriteIndex(dir string, x *Index) error {
	if err := x.validate(); err != nil {
		return fmt.Errorf("checkpoint: %w: %w", ErrInvalidArgument, err)
	}
	b, err := json.MarshalIndent(x, "", "  ")
	if err != nil {
		return fmt.Errorf("checkpoint: index: %w", err)
	}
	return WriteFileAtomic(filepath.Join(dir, IndexName), func(w io.Writer) error {
		_, err := w.Write(append(b, '\n'))
		return err
	})
}

// ReadIndex reads and checks dir/index.json. A missing index is an error
// matching os.ErrNotExist; a malformed one matches ErrCorrupt.
func ReadIndex(dir string) (*Index, error) {
	b, err := os.ReadFile(filepath.Join(dir, IndexName))
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var x Index
	if err := dec.Decode(&x); err != nil {
		return nil, corrupt("index %s: %v", filepath.Join(dir, IndexName), err)
	}
	if err := x.validate(); err != nil {
		return nil, fmt.Errorf("checkpoint: %s: %w", dir, err)
	}
	return &x, nil
}

// Want asks Index.Read for elements [Off, Off+len) of a tensor — the
// parameter itself when Slot is "", else that optimizer slot of it — to be
// copied into F32 or F64 (the one of the tensor's dtype; its length is the
// number of elements wanted).
type Want struct {
	Tensor, Slot string
	Off          int
	F32          []float32
	F64          []float64
}

func (w Want) len() int { return len(w.F32) + len(w.F64) }

// piece is a part of a chunk that a Want needs.
type piece struct {
	want     int // index into the wants
	key      string
	slot     bool
	chunkLen int
	from, to int // elements of the chunk
	at       int // where they go in the want's slice
}

// Read fills wants from the chunks of the checkpoint in dir (whose index is
// x), reading from each file only the chunks that overlap them. A tensor
// or slot the index does not have, a range past a tensor's end or a slice
// of the other dtype is an error matching ErrInvalidArgument; a chunk
// missing from its file, or of another length, matches ErrCorrupt.
func (x *Index) Read(dir string, wants []Want) error {
	byName := make(map[string]*IndexTensor, len(x.Tensors))
	for i := range x.Tensors {
		byName[x.Tensors[i].Name] = &x.Tensors[i]
	}
	perFile := make(map[int][]piece)
	for wi, w := range wants {
		t, ok := byName[w.Tensor]
		switch {
		case !ok:
			return fmt.Errorf("checkpoint: %w: no tensor %q in the checkpoint", ErrMissingTensor, w.Tensor)
		case w.Slot != "" && !slices.Contains(x.Slots, w.Slot):
			return fmt.Errorf("checkpoint: %w: no optimizer slot %q in the checkpoint", ErrMissingTensor, w.Slot)
		case w.Off < 0 || w.Off+w.len() > t.Numel():
			return fmt.Errorf("checkpoint: %w: elements [%d, %d) of %q, which has %d", ErrInvalidArgument, w.Off, w.Off+w.len(), w.Tensor, t.Numel())
		case (w.F32 != nil) != (t.Dtype == DtypeName(tensor.Float32)) || (w.F32 != nil && w.F64 != nil):
			return fmt.Errorf("checkpoint: %w: %q is %s", ErrInvalidArgument, w.Tensor, t.Dtype)
		}
		lo, hi := w.Off, w.Off+w.len()
		k, _ := slices.BinarySearchFunc(t.Chunks, lo, func(c Chunk, e int) int {
			if c.Off+c.Len <= e {
				return -1
			}
			if c.Off > e {
				return 1
			}
			return 0
		})
		for ; k < len(t.Chunks) && t.Chunks[k].Off < hi; k++ {
			c := t.Chunks[k]
			a, b := max(lo, c.Off), min(hi, c.Off+c.Len)
			name := t.Name
			if w.Slot != "" {
				name = SlotTensor(t.Name, w.Slot)
			}
			perFile[c.File] = append(perFile[c.File], piece{want: wi, key: ChunkName(name, c.Off), slot: w.Slot != "",
				chunkLen: c.Len, from: a - c.Off, to: b - c.Off, at: a - lo})
		}
	}
	files := make([]int, 0, len(perFile))
	for fi := range perFile {
		files = append(files, fi)
	}
	slices.Sort(files)
	for _, fi := range files {
		ps := perFile[fi]
		keys := make(map[string]bool, len(ps))
		for _, p := range ps {
			keys[p.key] = true
		}
		path := filepath.Join(dir, x.Files[fi])
		f, err := LoadSubset(path, func(name string) bool { return keys[name] })
		if err != nil {
			return err
		}
		for _, p := range ps {
			t, err := f.chunk(p.key, p.slot)
			if err != nil {
				return fmt.Errorf("checkpoint: %s: %w: %w", path, ErrCorrupt, err)
			}
			w := wants[p.want]
			switch data := t.Data().(type) {
			case []float32:
				if len(data) != p.chunkLen || w.F32 == nil {
					return corrupt("%s: chunk %q has %d float32 elements, index says %d %s", path, p.key, len(data), p.chunkLen, byName[w.Tensor].Dtype)
				}
				copy(w.F32[p.at:], data[p.from:p.to])
			case []float64:
				if len(data) != p.chunkLen || w.F64 == nil {
					return corrupt("%s: chunk %q has %d float64 elements, index says %d %s", path, p.key, len(data), p.chunkLen, byName[w.Tensor].Dtype)
				}
				copy(w.F64[p.at:], data[p.from:p.to])
			default:
				return corrupt("%s: chunk %q holds %T", path, p.key, data)
			}
		}
	}
	return nil
}

// chunk returns a loaded chunk from the parameter or the optimizer
// namespace.
func (f *File) chunk(key string, slot bool) (*tensor.Dense, error) {
	if !slot {
		return f.Tensor(key)
	}
	if f.Optimizer == nil {
		return nil, fmt.Errorf("%w: optimizer chunk %q (the file holds no optimizer state)", ErrMissingTensor, key)
	}
	n, err := f.Optimizer.Slot(key)
	if err != nil {
		return nil, err
	}
	return n.Tensor.(*tensor.Dense), nil
}

// ShardedPath returns the directory of the sharded checkpoint of step under
// root: root/ckpt-<step>.
func ShardedPath(root string, step int64) string {
	return filepath.Join(root, "ckpt-"+strconv.FormatInt(step, 10))
}

// ShardedSteps returns the steps of the sharded checkpoints under root that
// have an index (complete saves), newest first. A missing root has none.
func ShardedSteps(root string) ([]int64, error) {
	ents, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	var steps []int64
	for _, e := range ents {
		s, ok := strings.CutPrefix(e.Name(), "ckpt-")
		if !ok || !e.IsDir() {
			continue
		}
		step, err := strconv.ParseInt(s, 10, 64)
		if err != nil || step < 0 || strconv.FormatInt(step, 10) != s {
			continue
		}
		if _, err := os.Stat(filepath.Join(root, e.Name(), IndexName)); err == nil {
			steps = append(steps, step)
		}
	}
	slices.Sort(steps)
	slices.Reverse(steps)
	return steps, nil
}

// PruneSharded removes the sharded checkpoints under root older than the
// keep newest complete ones, and incomplete ones (no index) older than the
// newest complete one. keep must be at least 1.
func PruneSharded(root string, keep int) error {
	if keep < 1 {
		return fmt.Errorf("checkpoint: %w: keep %d", ErrInvalidArgument, keep)
	}
	steps, err := ShardedSteps(root)
	if err != nil || len(steps) == 0 {
		return err
	}
	complete := make(map[int64]bool, len(steps))
	for _, s := range steps {
		complete[s] = true
	}
	oldest := steps[min(keep, len(steps))-1]
	ents, err := os.ReadDir(root)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	var errs []error
	for _, e := range ents {
		s, ok := strings.CutPrefix(e.Name(), "ckpt-")
		step, perr := strconv.ParseInt(s, 10, 64)
		if !ok || !e.IsDir() || perr != nil {
			continue
		}
		if step < oldest || (!complete[step] && step < steps[0]) {
			if err := os.RemoveAll(filepath.Join(root, e.Name())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	syncDir(root)
	return errors.Join(errs...)
}
