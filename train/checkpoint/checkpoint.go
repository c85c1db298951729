package checkpoint

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"path/filepath"
	"unicode/utf8"

	"gorgonia.org/tensor"

	"github.com/gdist/gdist/internal/errs"
)

// Version is the format version this package writes. Readers accept it and
// every earlier version down to MinVersion.
const Version = 2

// MinVersion is the oldest format version this package reads.
const MinVersion = 1

// Limits enforced by readers and writers.
const (
	// MaxHeaderBytes bounds the header body (configuration plus index).
	MaxHeaderBytes = 64 << 20
	// MaxRank bounds the number of dimensions of a tensor.
	MaxRank = 32
	// MaxNameBytes bounds the length of a tensor name.
	MaxNameBytes = math.MaxUint16
)

const (
	align       = 8
	preamble    = 16 // magic + version + header length
	trailerSize = 24 // end magic + file length + header crc + trailer crc
	maxTensor   = 1 << 46
)

var (
	magic    = [8]byte{0x89, 'G', 'D', 'C', '\r', '\n', 0x1A, '\n'}
	endMagic = [8]byte{'G', 'D', 'C', 'E', 'N', 'D', '\r', '\n'}
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Errors returned by this package. Match them with errors.Is.
var (
	// ErrBadMagic means the input does not start with the checkpoint magic.
	ErrBadMagic = errors.New("checkpoint: bad magic (not a gdist checkpoint)")
	// ErrUnsupportedVersion means the file has a format version this build
	// does not read.
	ErrUnsupportedVersion = errors.New("checkpoint: unsupported version")
	// ErrCorrupt means the file is truncated or malformed.
	ErrCorrupt = errors.New("checkpoint: corrupt file")
	// ErrChecksum means a checksum did not match. It wraps ErrCorrupt, so
	// errors.Is(err, ErrCorrupt) also holds.
	ErrChecksum = fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
	// ErrMissingTensor means a requested tensor is not in the file (or was
	// not selected when the file was loaded).
	ErrMissingTensor = errors.New("checkpoint: missing tensor")
	// ErrUnsupportedDtype means a tensor's element type cannot be stored.
	ErrUnsupportedDtype = errors.New("checkpoint: unsupported dtype")
	// ErrInvalidArgument is matched by the errors of an invalid argument
	// (empty, duplicate or over-long name, nil tensor, bad option). It is
	// the value every gdist package exports under this name
	// (errs.ErrInvalidArgument).
	ErrInvalidArgument = errs.ErrInvalidArgument
	// ErrNoCheckpoint means a Dir holds no checkpoint that verifies. When
	// some files were rejected, the error also wraps their reasons, so
	// errors.Is(err, ErrCorrupt) tells "all corrupt" from "none yet".
	ErrNoCheckpoint = errors.New("checkpoint: no good checkpoint")
	// ErrClosed is returned by an Async writer after Close.
	ErrClosed = errors.New("checkpoint: async writer closed")
)

// Named is a tensor with its name. Names are arbitrary non-empty UTF-8
// strings, unique within a file; gdist models use dotted, layer-prefixed
// names such as "layer03.attn.wq".
type Named struct {
	Name   string
	Tensor tensor.Tensor
}

// dtype codes on disk.
const (
	codeFloat32 = 1
	codeFloat64 = 2
	codeInt32   = 3
	codeInt64   = 4
)

func codeOf(dt tensor.Dtype) (uint8, error) {
	switch dt {
	case tensor.Float32:
		return codeFloat32, nil
	case tensor.Float64:
		return codeFloat64, nil
	case tensor.Int32:
		return codeInt32, nil
	case tensor.Int64:
		return codeInt64, nil
	}
	return 0, fmt.Errorf("%w: %v", ErrUnsupportedDtype, dt)
}

func elemSize(code uint8) int {
	switch code {
	case codeFloat32, codeInt32:
		return 4
	case codeFloat64, codeInt64:
		return 8
	}
	return 0
}

// Namespaces of the tensors in a file (version 2).
const (
	spaceParams    = 0
	spaceOptimizer = 1
)

// entry is one index record.
type entry struct {
	space  uint8
	name   string
	code   uint8
	shape  []int
	offset uint64
	length uint64
	crc    uint32
}

func alignUp(n uint64) uint64 { return (n + align - 1) &^ (align - 1) }

// ---------------------------------------------------------------------------
// Writing

// source is a tensor prepared for writing: its flat data slice.
type source struct {
	data any // []float32, []float64, []int32 or []int64
	n    int
}

func prepare(t tensor.Tensor) (source, uint8, []int, error) {
	if t == nil {
		return source{}, 0, nil, fmt.Errorf("checkpoint: %w: nil tensor", ErrInvalidArgument)
	}
	code, err := codeOf(t.Dtype())
	if err != nil {
		return source{}, 0, nil, err
	}
	if d, ok := t.(*tensor.Dense); ok && (d.IsView() || !d.DataOrder().IsRowMajor()) {
		t = d.Materialize()
	}
	shape := []int(t.Shape().Clone())
	n := 1
	for _, s := range shape {
		n *= s
	}
	if n == 0 {
		// tensor.Dense.Data panics on an empty array.
		return source{data: emptyOf(code), n: 0}, code, shape, nil
	}
	var data any
	switch v := t.Data().(type) {
	case []float32:
		data = v
	case []float64:
		data = v
	case []int32:
		data = v
	case []int64:
		data = v
	case float32:
		data = []float32{v}
	case float64:
		data = []float64{v}
	case int32:
		data = []int32{v}
	case int64:
		data = []int64{v}
	default:
		return source{}, 0, nil, fmt.Errorf("%w: data of type %T", ErrUnsupportedDtype, v)
	}
	if l := dataLen(data); l < n {
		return source{}, 0, nil, fmt.Errorf("checkpoint: %w: tensor of shape %v holds %d elements", ErrInvalidArgument, shape, l)
	}
	return source{data: data, n: n}, code, shape, nil
}

func emptyOf(code uint8) any {
	switch code {
	case codeFloat32:
		return []float32{}
	case codeFloat64:
		return []float64{}
	case codeInt32:
		return []int32{}
	}
	return []int64{}
}

func dtypeOf(code uint8) tensor.Dtype {
	switch code {
	case codeFloat32:
		return tensor.Float32
	case codeFloat64:
		return tensor.Float64
	case codeInt32:
		return tensor.Int32
	}
	return tensor.Int64
}

func dataLen(data any) int {
	switch v := data.(type) {
	case []float32:
		return len(v)
	case []float64:
		return len(v)
	case []int32:
		return len(v)
	case []int64:
		return len(v)
	}
	return 0
}

// encodeTo writes the first n elements of data to w, little-endian, through
// scratch.
func encodeTo(w io.Writer, s source, scratch []byte) error {
	const chunk = 4096
	for start := 0; start < s.n; start += chunk {
		end := min(start+chunk, s.n)
		b := scratch[:0]
		switch v := s.data.(type) {
		case []float32:
			for _, x := range v[start:end] {
				b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
			}
		case []float64:
			for _, x := range v[start:end] {
				b = binary.LittleEndian.AppendUint64(b, math.Float64bits(x))
			}
		case []int32:
			for _, x := range v[start:end] {
				b = binary.LittleEndian.AppendUint32(b, uint32(x))
			}
		case []int64:
			for _, x := range v[start:end] {
				b = binary.LittleEndian.AppendUint64(b, uint64(x))
			}
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	return nil
}

// Write encodes cfg (with encoding/json) and tensors to w as a checkpoint
// holding only a configuration and parameters. It is WriteState with
// State{Config: cfg, Params: tensors}.
func Write(w io.Writer, cfg any, tensors []Named) error {
	return WriteState(w, &State{Config: cfg, Params: tensors})
}

// checkNames validates the names of one namespace.
func checkNames(ts []Named, what string) error {
	seen := make(map[string]bool, len(ts))
	for i, nt := range ts {
		switch {
		case nt.Name == "":
			return fmt.Errorf("checkpoint: %w: empty %s name (index %d)", ErrInvalidArgument, what, i)
		case len(nt.Name) > MaxNameBytes:
			return fmt.Errorf("checkpoint: %w: %s name of %d bytes", ErrInvalidArgument, what, len(nt.Name))
		case !utf8.ValidString(nt.Name):
			return fmt.Errorf("checkpoint: %w: %s name %q is not UTF-8", ErrInvalidArgument, what, nt.Name)
		case seen[nt.Name]:
			return fmt.Errorf("checkpoint: %w: duplicate %s name %q", ErrInvalidArgument, what, nt.Name)
		}
		seen[nt.Name] = true
	}
	return nil
}

// WriteState encodes s to w in the current format (see the package
// documentation). Parameters are written in order, then the optimizer's
// slots in order. WriteState does not retain or modify s or anything it
// refers to.
func WriteState(w io.Writer, s *State) error {
	if s == nil {
		return fmt.Errorf("checkpoint: %w: nil state", ErrInvalidArgument)
	}
	cfgJSON, err := json.Marshal(s.Config)
	if err != nil {
		return fmt.Errorf("checkpoint: encoding config: %w", err)
	}
	rec, err := encodeState(s)
	if err != nil {
		return err
	}
	if err := checkNames(s.Params, "tensor"); err != nil {
		return err
	}
	type item struct {
		space uint8
		nt    Named
	}
	items := make([]item, 0, len(s.Params))
	for _, nt := range s.Params {
		items = append(items, item{spaceParams, nt})
	}
	if s.Optimizer != nil {
		if err := checkNames(s.Optimizer.Slots, "optimizer slot"); err != nil {
			return err
		}
		for _, nt := range s.Optimizer.Slots {
			items = append(items, item{spaceOptimizer, nt})
		}
	}

	srcs := make([]source, len(items))
	entries := make([]entry, len(items))
	scratch := make([]byte, 0, 4096*8)
	for i, it := range items {
		src, code, shape, err := prepare(it.nt.Tensor)
		if err != nil {
			return fmt.Errorf("tensor %q: %w", it.nt.Name, err)
		}
		if len(shape) > MaxRank {
			return fmt.Errorf("checkpoint: %w: tensor %q has rank %d", ErrInvalidArgument, it.nt.Name, len(shape))
		}
		h := crc32.New(castagnoli)
		if err := encodeTo(h, src, scratch); err != nil {
			return err
		}
		srcs[i] = src
		entries[i] = entry{space: it.space, name: it.nt.Name, code: code, shape: shape,
			length: uint64(src.n * elemSize(code)), crc: h.Sum32()}
	}

	// Offsets depend on the header length, which depends only on the
	// config, the state record, names and ranks, so compute it first.
	hlen := uint64(4 + len(cfgJSON) + 4 + len(rec) + 4)
	for _, e := range entries {
		hlen += uint64(1 + 2 + len(e.name) + 2 + 8*len(e.shape) + 8 + 8 + 4)
	}
	if hlen > MaxHeaderBytes {
		return fmt.Errorf("checkpoint: %w: header of %d bytes exceeds %d", ErrInvalidArgument, hlen, MaxHeaderBytes)
	}
	le := binary.LittleEndian
	head := make([]byte, 0, preamble+hlen+4+align)
	head = append(head, magic[:]...)
	head = le.AppendUint32(head, Version)
	head = le.AppendUint32(head, uint32(hlen))
	head = le.AppendUint32(head, uint32(len(cfgJSON)))
	head = append(head, cfgJSON...)
	head = le.AppendUint32(head, uint32(len(rec)))
	head = append(head, rec...)
	head = le.AppendUint32(head, uint32(len(entries)))
	off := alignUp(preamble + hlen + 4)
	for i := range entries {
		e := &entries[i]
		e.offset = off
		off = alignUp(off + e.length)
		head = append(head, e.space)
		head = le.AppendUint16(head, uint16(len(e.name)))
		head = append(head, e.name...)
		head = append(head, e.code, uint8(len(e.shape)))
		for _, d := range e.shape {
			head = le.AppendUint64(head, uint64(d))
		}
		head = le.AppendUint64(head, e.offset)
		head = le.AppendUint64(head, e.length)
		head = le.AppendUint32(head, e.crc)
	}
	headerCRC := crc32.Checksum(head, castagnoli)
	head = le.AppendUint32(head, headerCRC)
	pos := uint64(len(head))
	head = append(head, make([]byte, alignUp(pos)-pos)...)
	pos = uint64(len(head))
	if _, err := w.Write(head); err != nil {
		return fmt.Errorf("checkpoint: write: %w", err)
	}
	var zeros [align]byte
	for i, e := range entries {
		if err := encodeTo(w, srcs[i], scratch); err != nil {
			return fmt.Errorf("checkpoint: write: %w", err)
		}
		pos += e.length
		if pad := alignUp(pos) - pos; pad > 0 {
			if _, err := w.Write(zeros[:pad]); err != nil {
				return fmt.Errorf("checkpoint: write: %w", err)
			}
			pos += pad
		}
	}
	if _, err := w.Write(appendTrailer(nil, pos, headerCRC)); err != nil {
		return fmt.Errorf("checkpoint: write: %w", err)
	}
	return nil
}

// appendTrailer appends the trailer that starts at offset pos of a file
// whose header checksum is headerCRC.
func appendTrailer(b []byte, pos uint64, headerCRC uint32) []byte {
	le := binary.LittleEndian
	start := len(b)
	b = append(b, endMagic[:]...)
	b = le.AppendUint64(b, pos+trailerSize)
	b = le.AppendUint32(b, headerCRC)
	return le.AppendUint32(b, crc32.Checksum(b[start:], castagnoli))
}

// Save writes a checkpoint holding cfg and tensors to path atomically (see
// SaveState).
func Save(path string, cfg any, tensors []Named) error {
	return SaveState(path, &State{Config: cfg, Params: tensors})
}

// SaveState writes s to path atomically: it writes a temporary file in the
// same directory, syncs it, renames it over path and syncs the directory. On
// error the temporary file is removed and path is untouched.
func SaveState(path string, s *State) error { return saveAtomic(path, s, nil) }

// saveAtomic is SaveState; check, if not nil, runs on the complete, synced
// temporary file before the rename, and an error from it aborts the save.
func saveAtomic(path string, s *State, check func(tmp string) error) error {
	return writeAtomic(path, func(w io.Writer) error { return WriteState(w, s) }, check)
}

// WriteFileAtomic writes the file at path with write, atomically as
// SaveState does: a temporary file in the same directory, synced, renamed
// over path, the directory synced. On error the temporary file is removed
// and path is untouched. For files of other formats (a model exported to
// safetensors).
func WriteFileAtomic(path string, write func(w io.Writer) error) error {
	return writeAtomic(path, write, nil)
}

func writeAtomic(path string, write func(w io.Writer) error, check func(tmp string) error) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+tmpMarker+"*")
	if err != nil {
		return fmt.Errorf("checkpoint: save: %w", err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<16)
	if err = write(bw); err != nil {
		return err
	}
	if err = bw.Flush(); err != nil {
		return fmt.Errorf("checkpoint: save: %w", err)
	}
	if err = f.Sync(); err != nil {
		return fmt.Errorf("checkpoint: save: %w", err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("checkpoint: save: %w", err)
	}
	if check != nil {
		if err = check(tmp); err != nil {
			return err
		}
	}
	if err = os.Rename(tmp, path); err != nil {
		return fmt.Errorf("checkpoint: save: %w", err)
	}
	syncDir(dir)
	return nil
}

// tmpMarker is part of every temporary file name SaveState creates.
const tmpMarker = ".tmp"

// syncDir makes a rename or removal in dir durable; not every platform
// supports syncing a directory, so a failure is ignored.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}

// ---------------------------------------------------------------------------
// Reading

// File is a decoded checkpoint. Its tensors are *tensor.Dense values owned by
// the File; callers may keep or modify them, and the other exported fields.
type File struct {
	// Version is the format version of the file.
	Version uint32
	// Step and Epoch are the training step and epoch the file records
	// (zero in version 1 files).
	Step, Epoch int64
	// Sampler and RNG are the opaque sampler position and RNG state (nil if
	// absent, and in version 1 files).
	Sampler, RNG []byte
	// Meta is the user metadata (nil if there was none).
	Meta map[string]string
	// Optimizer is the optimizer state, or nil if the file holds none (as
	// every version 1 file). Its Slots are the optimizer tensors that were
	// loaded, as *tensor.Dense.
	Optimizer *Optimizer

	config  []byte
	tensors []Named
	byName  map[string]int
}

// Config decodes the configuration JSON into v (a pointer), as
// encoding/json.Unmarshal does.
func (f *File) Config(v any) error {
	if err := json.Unmarshal(f.config, v); err != nil {
		return fmt.Errorf("checkpoint: decoding config: %w", err)
	}
	return nil
}

// ConfigJSON returns a copy of the raw configuration JSON.
func (f *File) ConfigJSON() []byte { return bytes.Clone(f.config) }

// Names returns the names of the loaded parameter tensors in file order. The
// caller owns the returned slice.
func (f *File) Names() []string {
	names := make([]string, len(f.tensors))
	for i, t := range f.tensors {
		names[i] = t.Name
	}
	return names
}

// Len returns the number of loaded parameter tensors.
func (f *File) Len() int { return len(f.tensors) }

// Tensor returns the named parameter tensor, or an error matching
// ErrMissingTensor. The returned tensor is shared with the File.
func (f *File) Tensor(name string) (*tensor.Dense, error) {
	i, ok := f.byName[name]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrMissingTensor, name)
	}
	return f.tensors[i].Tensor.(*tensor.Dense), nil
}

// Tensors returns the loaded parameter tensors in file order. The caller
// owns the returned slice; the tensors in it are shared with the File.
func (f *File) Tensors() []Named { return append([]Named(nil), f.tensors...) }

// State returns the file's contents as a State that SaveState writes back
// unchanged: Config is the raw configuration (a json.RawMessage). The State
// shares its tensors, byte slices and maps with the File.
func (f *File) State() *State {
	return &State{
		Config: json.RawMessage(f.config), Params: f.Tensors(), Optimizer: f.Optimizer,
		Step: f.Step, Epoch: f.Epoch, Sampler: f.Sampler, RNG: f.RNG, Meta: f.Meta,
	}
}

func (f *File) add(e entry, t *tensor.Dense) {
	if e.space == spaceOptimizer {
		f.Optimizer.Slots = append(f.Optimizer.Slots, Named{Name: e.name, Tensor: t})
		return
	}
	f.byName[e.name] = len(f.tensors)
	f.tensors = append(f.tensors, Named{Name: e.name, Tensor: t})
}

// header is a parsed preamble + header body.
type header struct {
	version   uint32
	config    []byte
	state     *State // step, epoch, sampler, RNG, meta, optimizer without slots
	entries   []entry
	crc       uint32 // the header checksum
	end       uint64 // offset of the first byte after the header checksum
	dataEnd   uint64 // offset after the last tensor's padding
	trailerAt uint64 // offset of the trailer (version 2)
}

func corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrCorrupt}, args...)...)
}

// readFull wraps io.ReadFull, turning a short read into ErrCorrupt.
func readFull(r io.Reader, b []byte, what string) error {
	if _, err := io.ReadFull(r, b); err != nil {
		return readErr(err, what)
	}
	return nil
}

func readHeader(r io.Reader) (*header, error) {
	var pre [preamble]byte
	if n, err := io.ReadFull(r, pre[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			// Too short for the preamble: truncated if what is there is
			// the start of a checkpoint, not a checkpoint otherwise.
			if bytes.HasPrefix(magic[:], pre[:min(n, len(magic))]) {
				return nil, fmt.Errorf("%w: truncated preamble (%d bytes): %w", ErrCorrupt, n, io.ErrUnexpectedEOF)
			}
			return nil, ErrBadMagic
		}
		return nil, fmt.Errorf("checkpoint: reading header: %w", err)
	}
	if !bytes.Equal(pre[:8], magic[:]) {
		return nil, ErrBadMagic
	}
	le := binary.LittleEndian
	h := &header{version: le.Uint32(pre[8:12])}
	if h.version < MinVersion || h.version > Version {
		return nil, fmt.Errorf("%w: file version %d, this build reads versions %d to %d",
			ErrUnsupportedVersion, h.version, MinVersion, Version)
	}
	hlen := le.Uint32(pre[12:16])
	if hlen > MaxHeaderBytes {
		return nil, corrupt("header length %d exceeds %d", hlen, MaxHeaderBytes)
	}
	// Read the header through a buffer that grows as data arrives, so a
	// damaged length field costs no more memory than the input holds.
	var hb bytes.Buffer
	hb.Grow(preamble + int(min(hlen, 1<<16)) + 4)
	hb.Write(pre[:])
	if _, err := io.CopyN(&hb, r, int64(hlen)+4); err != nil {
		return nil, readErr(err, "header")
	}
	buf := hb.Bytes()
	body := buf[preamble : preamble+int(hlen)]
	h.crc = le.Uint32(buf[preamble+int(hlen):])
	if got := crc32.Checksum(buf[:preamble+int(hlen)], castagnoli); got != h.crc {
		return nil, fmt.Errorf("%w: header crc %08x, stored %08x", ErrChecksum, got, h.crc)
	}
	h.end = uint64(len(buf))
	if err := h.parse(body); err != nil {
		return nil, err
	}
	return h, nil
}

func (h *header) parse(b []byte) error {
	p := &parser{b: b}
	h.config = bytes.Clone(p.bytes32("config"))
	if p.err == nil && !json.Valid(h.config) {
		return corrupt("configuration is not JSON")
	}
	if h.version >= 2 {
		rec := p.bytes32("state record")
		if p.err != nil {
			return p.err
		}
		st, err := decodeState(rec)
		if err != nil {
			return err
		}
		h.state = st
	} else {
		h.state = &State{}
	}
	n := int(p.u32("tensor count"))
	minEntry := 24 // u16 name length, u8 dtype, u8 rank, offset, length, crc, a 1-byte name
	if h.version >= 2 {
		minEntry++ // namespace
	}
	if p.err == nil && n > len(p.b)/minEntry {
		return corrupt("tensor count %d too large for header", n)
	}
	h.entries = make([]entry, 0, min(n, 1024))
	seen := [2]map[string]bool{make(map[string]bool), make(map[string]bool)}
	next := alignUp(h.end)
	for i := 0; i < n && p.err == nil; i++ {
		var e entry
		if h.version >= 2 {
			e.space = p.u8("namespace")
			if p.err == nil && e.space > spaceOptimizer {
				return corrupt("entry %d: namespace %d", i, e.space)
			}
			if e.space == spaceOptimizer && h.state.Optimizer == nil {
				return corrupt("entry %d: optimizer tensor without optimizer state", i)
			}
		}
		e.name = string(p.bytes16("name"))
		if p.err != nil {
			break
		}
		if e.name == "" || !utf8.ValidString(e.name) || seen[e.space][e.name] {
			return corrupt("entry %d: empty, non-UTF-8 or duplicate name %q", i, e.name)
		}
		seen[e.space][e.name] = true
		e.code = p.u8("dtype")
		rank := int(p.u8("rank"))
		if p.err != nil {
			break
		}
		es := elemSize(e.code)
		if es == 0 {
			return fmt.Errorf("%w: tensor %q has dtype code %d", ErrUnsupportedDtype, e.name, e.code)
		}
		if rank > MaxRank {
			return corrupt("tensor %q has rank %d", e.name, rank)
		}
		count := uint64(1)
		e.shape = make([]int, rank)
		for d := range rank {
			v := p.u64("dimension")
			if v > maxTensor || (v != 0 && count > maxTensor/v) {
				return corrupt("tensor %q is too large", e.name)
			}
			count *= v
			e.shape[d] = int(v)
		}
		e.offset = p.u64("data offset")
		e.length = p.u64("data length")
		e.crc = p.u32("data crc")
		if p.err != nil {
			break
		}
		if e.length != count*uint64(es) {
			return corrupt("tensor %q: data length %d does not match shape %v", e.name, e.length, e.shape)
		}
		// The writer places every tensor right after the previous one's
		// padding, so any other offset is damage.
		if e.offset != next || e.offset > math.MaxInt64-e.length {
			return corrupt("tensor %q: bad data offset %d", e.name, e.offset)
		}
		next = alignUp(e.offset + e.length)
		h.entries = append(h.entries, e)
	}
	if p.err != nil {
		return p.err
	}
	if len(p.b) != 0 {
		return corrupt("%d trailing bytes in header", len(p.b))
	}
	h.dataEnd = next
	h.trailerAt = next
	return nil
}

// checkTrailer verifies a version 2 trailer read from offset h.trailerAt.
func (h *header) checkTrailer(b []byte) error {
	want := appendTrailer(nil, h.trailerAt, h.crc)
	if !bytes.Equal(b, want) {
		le := binary.LittleEndian
		if got := crc32.Checksum(b[:trailerSize-4], castagnoli); got != le.Uint32(b[trailerSize-4:]) {
			return fmt.Errorf("%w: trailer crc %08x, stored %08x", ErrChecksum, got, le.Uint32(b[trailerSize-4:]))
		}
		return corrupt("trailer does not match the header (length %d, header crc %08x)",
			le.Uint64(b[8:]), le.Uint32(b[16:]))
	}
	return nil
}

// decode turns raw little-endian bytes into a dense tensor after checking
// the entry's checksum.
func decode(e entry, raw []byte) (*tensor.Dense, error) {
	if got := crc32.Checksum(raw, castagnoli); got != e.crc {
		return nil, fmt.Errorf("%w: tensor %q crc %08x, stored %08x", ErrChecksum, e.name, got, e.crc)
	}
	if len(raw) == 0 {
		return tensor.New(tensor.Of(dtypeOf(e.code)), tensor.WithShape(e.shape...)), nil
	}
	le := binary.LittleEndian
	var back any
	switch e.code {
	case codeFloat32:
		v := make([]float32, len(raw)/4)
		for i := range v {
			v[i] = math.Float32frombits(le.Uint32(raw[4*i:]))
		}
		back = v
	case codeFloat64:
		v := make([]float64, len(raw)/8)
		for i := range v {
			v[i] = math.Float64frombits(le.Uint64(raw[8*i:]))
		}
		back = v
	case codeInt32:
		v := make([]int32, len(raw)/4)
		for i := range v {
			v[i] = int32(le.Uint32(raw[4*i:]))
		}
		back = v
	case codeInt64:
		v := make([]int64, len(raw)/8)
		for i := range v {
			v[i] = int64(le.Uint64(raw[8*i:]))
		}
		back = v
	}
	return tensor.New(tensor.WithShape(e.shape...), tensor.WithBacking(back)), nil
}

func newFile(h *header) *File {
	s := h.state
	f := &File{Version: h.version, config: h.config, byName: make(map[string]int),
		Step: s.Step, Epoch: s.Epoch, Sampler: s.Sampler, RNG: s.RNG, Meta: s.Meta}
	if s.Optimizer != nil {
		o := *s.Optimizer
		f.Optimizer = &o
	}
	return f
}

// Read decodes a whole checkpoint from r, reading it sequentially up to the
// end of the trailer (it does not check that r ends there), and verifies
// every checksum, that padding is zero and that the trailer matches.
func Read(r io.Reader) (*File, error) {
	h, err := readHeader(r)
	if err != nil {
		return nil, err
	}
	f := newFile(h)
	pos := h.end
	var buf bytes.Buffer
	skipPad := func(to uint64) error {
		if to <= pos {
			return nil
		}
		var pad [align]byte
		if err := readFull(r, pad[:to-pos], "padding"); err != nil {
			return err
		}
		if pad != [align]byte{} {
			return corrupt("non-zero padding before offset %d", to)
		}
		pos = to
		return nil
	}
	for _, e := range h.entries {
		if err := skipPad(e.offset); err != nil {
			return nil, err
		}
		buf.Reset()
		// CopyN grows the buffer as data arrives, so a truncated stream
		// fails without allocating what the header claims.
		buf.Grow(int(min(e.length, 1<<24)))
		if _, err := io.CopyN(&buf, r, int64(e.length)); err != nil {
			return nil, readErr(err, "tensor "+e.name)
		}
		t, err := decode(e, buf.Bytes())
		if err != nil {
			return nil, err
		}
		f.add(e, t)
		pos = e.offset + e.length
	}
	if err := skipPad(h.dataEnd); err != nil {
		return nil, err
	}
	if h.version >= 2 {
		var tr [trailerSize]byte
		if err := readFull(r, tr[:], "trailer"); err != nil {
			return nil, err
		}
		if err := h.checkTrailer(tr[:]); err != nil {
			return nil, err
		}
	}
	return f, nil
}

func readErr(err error, what string) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: truncated %s: %w", ErrCorrupt, what, io.ErrUnexpectedEOF)
	}
	return fmt.Errorf("checkpoint: reading %s: %w", what, err)
}

// ReadSubset decodes the header of the checkpoint in r and then only the
// tensors (parameters and optimizer slots alike) for which keep returns true
// (all of them if keep is nil), reading each with one ReadAt. size is the
// total size of the input in bytes, or -1 if unknown; when known, entries
// pointing past it are reported as ErrCorrupt before anything is allocated
// for them, and a version 2 input must end exactly at its trailer. The
// trailer is always read and checked, so a truncated file is detected even
// when keep selects nothing.
func ReadSubset(r io.ReaderAt, size int64, keep func(name string) bool) (*File, error) {
	limit := int64(math.MaxInt64)
	if size >= 0 {
		limit = size
	}
	h, err := readHeader(io.NewSectionReader(r, 0, limit))
	if err != nil {
		return nil, err
	}
	if h.version >= 2 {
		if size >= 0 && uint64(size) != h.trailerAt+trailerSize {
			return nil, corrupt("file is %d bytes, its header says %d", size, h.trailerAt+trailerSize)
		}
		tr := make([]byte, trailerSize)
		if n, err := r.ReadAt(tr, int64(h.trailerAt)); n < len(tr) {
			if err == nil || errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, readErr(err, "trailer")
		}
		if err := h.checkTrailer(tr); err != nil {
			return nil, err
		}
	}
	f := newFile(h)
	for _, e := range h.entries {
		if keep != nil && !keep(e.name) {
			continue
		}
		if size >= 0 && e.offset+e.length > uint64(size) {
			return nil, corrupt("tensor %q extends past the end of the file", e.name)
		}
		raw := make([]byte, e.length)
		if n, err := r.ReadAt(raw, int64(e.offset)); n < len(raw) {
			if err == nil || errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, readErr(err, "tensor "+e.name)
		}
		t, err := decode(e, raw)
		if err != nil {
			return nil, err
		}
		f.add(e, t)
	}
	return f, nil
}

// Load reads and verifies the whole checkpoint at path, and that nothing
// follows its end.
func Load(path string) (*File, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: load: %w", err)
	}
	defer fh.Close()
	br := bufio.NewReaderSize(fh, 1<<16)
	f, err := Read(br)
	if err == nil {
		if _, perr := br.Peek(1); perr == nil {
			err = corrupt("bytes after the end of the checkpoint")
		} else if !errors.Is(perr, io.EOF) {
			err = fmt.Errorf("checkpoint: load: %w", perr)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// LoadSubset reads the index of the checkpoint at path and decodes only the
// tensors for which keep returns true; the others are not read. Only the
// checksums of the header, the trailer and the selected tensors are
// verified.
func LoadSubset(path string, keep func(name string) bool) (*File, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: load: %w", err)
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, fmt.Errorf("checkpoint: load: %w", err)
	}
	f, err := ReadSubset(fh, st.Size(), keep)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}
