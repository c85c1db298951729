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
)

// Version is the format version this package writes and the only one it reads.
const Version = 1

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
	align     = 8
	preamble  = 16 // magic + version + header length
	maxTensor = 1 << 46
)

var magic = [8]byte{0x89, 'G', 'D', 'C', '\r', '\n', 0x1A, '\n'}

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
	// ErrInvalid means an argument to Write was invalid (empty, duplicate or
	// over-long name, nil tensor).
	ErrInvalid = errors.New("checkpoint: invalid argument")
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

// entry is one index record.
type entry struct {
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
		return source{}, 0, nil, fmt.Errorf("%w: nil tensor", ErrInvalid)
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
		return source{}, 0, nil, fmt.Errorf("%w: tensor of shape %v holds %d elements", ErrInvalid, shape, l)
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

// Write encodes cfg (with encoding/json) and tensors to w in the format
// described in the package documentation. Tensors are written in the given
// order. Write does not retain or modify cfg or the tensors.
func Write(w io.Writer, cfg any, tensors []Named) error {
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("checkpoint: encoding config: %w", err)
	}
	srcs := make([]source, len(tensors))
	entries := make([]entry, len(tensors))
	seen := make(map[string]bool, len(tensors))
	scratch := make([]byte, 0, 4096*8)
	for i, nt := range tensors {
		switch {
		case nt.Name == "":
			return fmt.Errorf("%w: empty tensor name (index %d)", ErrInvalid, i)
		case len(nt.Name) > MaxNameBytes:
			return fmt.Errorf("%w: tensor name of %d bytes", ErrInvalid, len(nt.Name))
		case !utf8.ValidString(nt.Name):
			return fmt.Errorf("%w: tensor name %q is not UTF-8", ErrInvalid, nt.Name)
		case seen[nt.Name]:
			return fmt.Errorf("%w: duplicate tensor name %q", ErrInvalid, nt.Name)
		}
		seen[nt.Name] = true
		src, code, shape, err := prepare(nt.Tensor)
		if err != nil {
			return fmt.Errorf("tensor %q: %w", nt.Name, err)
		}
		if len(shape) > MaxRank {
			return fmt.Errorf("%w: tensor %q has rank %d", ErrInvalid, nt.Name, len(shape))
		}
		h := crc32.New(castagnoli)
		if err := encodeTo(h, src, scratch); err != nil {
			return err
		}
		srcs[i] = src
		entries[i] = entry{name: nt.Name, code: code, shape: shape,
			length: uint64(src.n * elemSize(code)), crc: h.Sum32()}
	}

	// Header body.
	var body bytes.Buffer
	body.Grow(len(cfgJSON) + 64*len(entries))
	le := binary.LittleEndian
	body.Write(le.AppendUint32(nil, uint32(len(cfgJSON))))
	body.Write(cfgJSON)
	body.Write(le.AppendUint32(nil, uint32(len(entries))))
	// Offsets depend on the header length, which depends only on names and
	// ranks, so compute the length first.
	hlen := uint64(4 + len(cfgJSON) + 4)
	for _, e := range entries {
		hlen += uint64(2 + len(e.name) + 2 + 8*len(e.shape) + 8 + 8 + 4)
	}
	if hlen > MaxHeaderBytes {
		return fmt.Errorf("%w: header of %d bytes exceeds %d", ErrInvalid, hlen, MaxHeaderBytes)
	}
	off := alignUp(preamble + hlen + 4)
	for i := range entries {
		e := &entries[i]
		e.offset = off
		off = alignUp(off + e.length)
		b := le.AppendUint16(nil, uint16(len(e.name)))
		b = append(b, e.name...)
		b = append(b, e.code, uint8(len(e.shape)))
		for _, d := range e.shape {
			b = le.AppendUint64(b, uint64(d))
		}
		b = le.AppendUint64(b, e.offset)
		b = le.AppendUint64(b, e.length)
		b = le.AppendUint32(b, e.crc)
		body.Write(b)
	}

	head := make([]byte, 0, preamble+body.Len()+4+align)
	head = append(head, magic[:]...)
	head = le.AppendUint32(head, Version)
	head = le.AppendUint32(head, uint32(body.Len()))
	head = append(head, body.Bytes()...)
	head = le.AppendUint32(head, crc32.Checksum(head, castagnoli))
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
	return nil
}

// Save writes a checkpoint to path atomically: it writes a temporary file in
// the same directory, syncs it, and renames it over path. On error the
// temporary file is removed and path is untouched.
func Save(path string, cfg any, tensors []Named) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp*")
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
	if err = Write(bw, cfg, tensors); err != nil {
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
	if err = os.Rename(tmp, path); err != nil {
		return fmt.Errorf("checkpoint: save: %w", err)
	}
	// Make the rename durable; not every platform supports syncing a
	// directory, so a failure here is ignored.
	if d, derr := os.Open(dir); derr == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// ---------------------------------------------------------------------------
// Reading

// File is a decoded checkpoint. Its tensors are *tensor.Dense values owned by
// the File; callers may keep or modify them.
type File struct {
	// Version is the format version of the file.
	Version uint32

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

// Names returns the names of the loaded tensors in file order. The caller
// owns the returned slice.
func (f *File) Names() []string {
	names := make([]string, len(f.tensors))
	for i, t := range f.tensors {
		names[i] = t.Name
	}
	return names
}

// Len returns the number of loaded tensors.
func (f *File) Len() int { return len(f.tensors) }

// Tensor returns the named tensor, or an error matching ErrMissingTensor.
// The returned tensor is shared with the File.
func (f *File) Tensor(name string) (*tensor.Dense, error) {
	i, ok := f.byName[name]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrMissingTensor, name)
	}
	return f.tensors[i].Tensor.(*tensor.Dense), nil
}

// Tensors returns the loaded tensors in file order. The caller owns the
// returned slice; the tensors in it are shared with the File.
func (f *File) Tensors() []Named { return append([]Named(nil), f.tensors...) }

func (f *File) add(name string, t *tensor.Dense) {
	f.byName[name] = len(f.tensors)
	f.tensors = append(f.tensors, Named{Name: name, Tensor: t})
}

// header is a parsed preamble + header body.
type header struct {
	version uint32
	config  []byte
	entries []entry
	end     uint64 // offset of the first byte after the header checksum
}

func corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrCorrupt}, args...)...)
}

// readFull wraps io.ReadFull, turning a short read into ErrCorrupt.
func readFull(r io.Reader, b []byte, what string) error {
	if _, err := io.ReadFull(r, b); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("%w: truncated %s: %w", ErrCorrupt, what, io.ErrUnexpectedEOF)
		}
		return fmt.Errorf("checkpoint: reading %s: %w", what, err)
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
	if h.version != Version {
		return nil, fmt.Errorf("%w: file version %d, this build reads version %d", ErrUnsupportedVersion, h.version, Version)
	}
	hlen := le.Uint32(pre[12:16])
	if hlen > MaxHeaderBytes {
		return nil, corrupt("header length %d exceeds %d", hlen, MaxHeaderBytes)
	}
	buf := make([]byte, preamble+int(hlen)+4)
	copy(buf, pre[:])
	if err := readFull(r, buf[preamble:], "header"); err != nil {
		return nil, err
	}
	body := buf[preamble : preamble+int(hlen)]
	if got, want := crc32.Checksum(buf[:preamble+int(hlen)], castagnoli), le.Uint32(buf[preamble+int(hlen):]); got != want {
		return nil, fmt.Errorf("%w: header crc %08x, stored %08x", ErrChecksum, got, want)
	}
	h.end = uint64(len(buf))
	if err := h.parse(body); err != nil {
		return nil, err
	}
	return h, nil
}

func (h *header) parse(b []byte) error {
	le := binary.LittleEndian
	need := func(n int, what string) error {
		if len(b) < n {
			return corrupt("header ends inside %s", what)
		}
		return nil
	}
	if err := need(4, "config length"); err != nil {
		return err
	}
	clen := int(le.Uint32(b))
	b = b[4:]
	if err := need(clen, "config"); err != nil {
		return err
	}
	h.config = bytes.Clone(b[:clen])
	b = b[clen:]
	if err := need(4, "tensor count"); err != nil {
		return err
	}
	n := int(le.Uint32(b))
	b = b[4:]
	if n > len(b)/24 { // every entry takes at least 24 bytes
		return corrupt("tensor count %d too large for header", n)
	}
	h.entries = make([]entry, 0, n)
	seen := make(map[string]bool, n)
	next := alignUp(h.end)
	for i := range n {
		if err := need(2, "name length"); err != nil {
			return err
		}
		nl := int(le.Uint16(b))
		b = b[2:]
		if err := need(nl+2, "name"); err != nil {
			return err
		}
		var e entry
		e.name = string(b[:nl])
		b = b[nl:]
		if nl == 0 || !utf8.ValidString(e.name) || seen[e.name] {
			return corrupt("entry %d: empty, non-UTF-8 or duplicate name %q", i, e.name)
		}
		seen[e.name] = true
		e.code, b = b[0], b[1:]
		rank := int(b[0])
		b = b[1:]
		es := elemSize(e.code)
		if es == 0 {
			return fmt.Errorf("%w: tensor %q has dtype code %d", ErrUnsupportedDtype, e.name, e.code)
		}
		if rank > MaxRank {
			return corrupt("tensor %q has rank %d", e.name, rank)
		}
		if err := need(8*rank+20, "entry"); err != nil {
			return err
		}
		count := uint64(1)
		e.shape = make([]int, rank)
		for d := range rank {
			v := le.Uint64(b)
			b = b[8:]
			if v > maxTensor || (v != 0 && count > maxTensor/v) {
				return corrupt("tensor %q is too large", e.name)
			}
			count *= v
			e.shape[d] = int(v)
		}
		e.offset = le.Uint64(b)
		e.length = le.Uint64(b[8:])
		e.crc = le.Uint32(b[16:])
		b = b[20:]
		if e.length != count*uint64(es) {
			return corrupt("tensor %q: data length %d does not match shape %v", e.name, e.length, e.shape)
		}
		if e.offset < next || e.offset%align != 0 {
			return corrupt("tensor %q: bad data offset %d", e.name, e.offset)
		}
		next = alignUp(e.offset + e.length)
		h.entries = append(h.entries, e)
	}
	if len(b) != 0 {
		return corrupt("%d trailing bytes in header", len(b))
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
	return &File{Version: h.version, config: h.config, byName: make(map[string]int)}
}

// Read decodes a whole checkpoint from r, reading it sequentially, and
// verifies every checksum.
func Read(r io.Reader) (*File, error) {
	h, err := readHeader(r)
	if err != nil {
		return nil, err
	}
	f := newFile(h)
	pos := h.end
	var buf bytes.Buffer
	for _, e := range h.entries {
		if skip := e.offset - pos; skip > 0 {
			if _, err := io.CopyN(io.Discard, r, int64(skip)); err != nil {
				return nil, readErr(err, "padding")
			}
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
		f.add(e.name, t)
		pos = e.offset + e.length
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
// tensors for which keep returns true (all of them if keep is nil), reading
// each with one ReadAt. size is the total size of the input in bytes, or -1
// if unknown; when known, entries pointing past it are reported as
// ErrCorrupt before anything is allocated for them.
func ReadSubset(r io.ReaderAt, size int64, keep func(name string) bool) (*File, error) {
	limit := int64(math.MaxInt64)
	if size >= 0 {
		limit = size
	}
	h, err := readHeader(io.NewSectionReader(r, 0, limit))
	if err != nil {
		return nil, err
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
		f.add(e.name, t)
	}
	return f, nil
}

// Load reads and verifies the whole checkpoint at path.
func Load(path string) (*File, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: load: %w", err)
	}
	defer fh.Close()
	f, err := Read(bufio.NewReaderSize(fh, 1<<16))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// LoadSubset reads the index of the checkpoint at path and decodes only the
// tensors for which keep returns true; the others are not read. Only the
// checksums of the header and of the selected tensors are verified.
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
