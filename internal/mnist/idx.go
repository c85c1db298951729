package mnist

import (
	"bufio"
	"compress/flate"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
)

// Magic numbers of the two IDX files MNIST uses: unsigned-byte data with
// three dimensions (images: count, rows, columns) or one (labels: count).
const (
	MagicImages uint32 = 0x00000803
	MagicLabels uint32 = 0x00000801
)

const (
	typeUbyte = 0x08 // the only IDX element type ReadIDX accepts
	maxDims   = 8
	// maxElements bounds what a header may announce, so a corrupt header
	// cannot make ReadIDX allocate gigabytes. MNIST's largest file holds
	// 47 040 000 bytes.
	maxElements = 1 << 30
)

// preallocMax is the largest payload allocated in one piece before any of
// it has arrived; larger payloads grow as data arrives. A variable so tests
// can lower it.
var preallocMax = 64 << 20

// ErrFormat reports malformed IDX data: a bad magic number, an unsupported
// element type, dimensions that do not fit, a truncated payload, trailing
// bytes, or a corrupt gzip stream. Errors from ReadIDX, NewSet and Load that
// describe such problems satisfy errors.Is(err, ErrFormat).
var ErrFormat = errors.New("mnist: malformed IDX data")

// IDX is one decoded IDX file of unsigned bytes.
type IDX struct {
	// Dims holds the size of each dimension, outermost first.
	Dims []int
	// Data holds the elements in row-major order; len(Data) is the product
	// of Dims. The caller owns Dims and Data.
	Data []byte
}

// Magic returns the file's magic number: 0x0000 08 NN, where NN is the
// number of dimensions.
func (x *IDX) Magic() uint32 { return typeUbyte<<8 | uint32(len(x.Dims)) }

// ReadIDX reads one IDX file of unsigned bytes (element type 0x08) from r,
// plain or gzip-compressed (detected from the first two bytes). It reads r to
// its end: bytes after the payload are an error, and so is a payload shorter
// than the header announces (io.ErrUnexpectedEOF, wrapped with ErrFormat).
// It never panics on malformed input.
func ReadIDX(r io.Reader) (*IDX, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var src io.Reader = br
	if head, err := br.Peek(2); err == nil && head[0] == 0x1f && head[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, readErr("gzip header", err)
		}
		defer zr.Close()
		src = zr
	}

	var hdr [4]byte
	if _, err := io.ReadFull(src, hdr[:]); err != nil {
		return nil, readErr("magic number", err)
	}
	magic := binary.BigEndian.Uint32(hdr[:])
	if hdr[0] != 0 || hdr[1] != 0 {
		return nil, fmt.Errorf("%w: bad magic number %#08x", ErrFormat, magic)
	}
	if hdr[2] != typeUbyte {
		return nil, fmt.Errorf("%w: magic number %#08x: element type %#02x is not unsigned byte (0x08)", ErrFormat, magic, hdr[2])
	}
	ndims := int(hdr[3])
	if ndims < 1 || ndims > maxDims {
		return nil, fmt.Errorf("%w: magic number %#08x: %d dimensions, want 1 to %d", ErrFormat, magic, ndims, maxDims)
	}

	var dimBuf [4 * maxDims]byte
	if _, err := io.ReadFull(src, dimBuf[:4*ndims]); err != nil {
		return nil, readErr("dimensions", err)
	}
	dims := make([]int, ndims)
	total := 1
	for i := range dims {
		d := binary.BigEndian.Uint32(dimBuf[4*i:])
		if d > maxElements {
			return nil, fmt.Errorf("%w: dimension %d is %d, more than %d", ErrFormat, i, d, maxElements)
		}
		dims[i] = int(d)
		total *= int(d) // cannot overflow: each factor and the running product are <= 2^30
		if total > maxElements {
			return nil, fmt.Errorf("%w: dimensions %v hold more than %d elements", ErrFormat, dims[:i+1], maxElements)
		}
	}

	data, err := readPayload(src, total)
	if err != nil {
		return nil, err
	}

	// Reading to EOF both rejects trailing bytes and makes the gzip reader
	// verify its checksum.
	var one [1]byte
	n, err := io.ReadFull(src, one[:])
	if n > 0 {
		return nil, fmt.Errorf("%w: trailing bytes after %d-byte payload", ErrFormat, total)
	}
	if err != io.EOF {
		return nil, readErr("end of data", err)
	}
	return &IDX{Dims: dims, Data: data}, nil
}

// readPayload reads exactly total bytes, allocating no more than has
// arrived (plus one chunk) once total exceeds preallocMax.
func readPayload(src io.Reader, total int) ([]byte, error) {
	data := make([]byte, 0, min(total, preallocMax))
	for len(data) < total {
		if len(data) == cap(data) {
			data = slices.Grow(data, min(total-len(data), cap(data)))
		}
		end := min(cap(data), total)
		n, err := io.ReadFull(src, data[len(data):end])
		data = data[:len(data)+n]
		if err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) || err == io.EOF {
				return nil, fmt.Errorf("%w: payload has %d of %d bytes: %w", ErrFormat, len(data), total, io.ErrUnexpectedEOF)
			}
			return nil, readErr("payload", err)
		}
	}
	return data, nil
}

// readErr wraps an error met while reading part of an IDX stream. A short
// read and a corrupt gzip stream are format errors; anything else (an I/O
// error from the underlying reader) is wrapped as is.
func readErr(part string, err error) error {
	var corrupt flate.CorruptInputError
	switch {
	case err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("%w: %s: %w", ErrFormat, part, io.ErrUnexpectedEOF)
	case errors.Is(err, gzip.ErrHeader), errors.Is(err, gzip.ErrChecksum), errors.As(err, &corrupt):
		return fmt.Errorf("%w: %s: %w", ErrFormat, part, err)
	default:
		return fmt.Errorf("mnist: reading IDX %s: %w", part, err)
	}
}
