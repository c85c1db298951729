package dist

import (
	"fmt"
	"unsafe"

	"github.com/x448/float16"
)

// Buffer is a typed view of the caller's memory: the one argument type of
// every collective, whatever the element type. Make one with F32, F64,
// F16 or Typed; it holds no copy, so a collective reads and writes the
// caller's slice in place, and the slice stays the caller's (it must not
// be touched while a collective using it runs). The zero Buffer is empty
// and has no DType: the ranks that take no part in a buffer (Gather's dst
// away from the root, Scatter's src) may pass it.
type Buffer struct {
	b  []byte
	dt DType
}

// F32 returns a Buffer over x.
func F32(x []float32) Buffer { return Buffer{f32Bytes(x), Float32} }

// F64 returns a Buffer over x.
func F64(x []float64) Buffer { return Buffer{f64Bytes(x), Float64} }

// F16 returns a Buffer over x (IEEE half precision, github.com/x448/float16).
func F16(x []float16.Float16) Buffer {
	if len(x) == 0 {
		return Buffer{[]byte{}, Float16}
	}
	return Buffer{unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), 2*len(x)), Float16}
}

// Typed returns a Buffer over b, which holds little-endian elements of
// type dt (EncodeFloat32 fills one from float32 values): the way to pass
// BFloat16 data, or bytes received from elsewhere. A collective refuses a
// Buffer whose dt is invalid (ErrUnsupportedDType) or whose length is not
// a whole number of elements (ErrInvalidArgument).
func Typed(b []byte, dt DType) Buffer { return Buffer{b, dt} }

// DType returns the element type (0 for the zero Buffer).
func (b Buffer) DType() DType { return b.dt }

// Len returns the number of elements (0 for an invalid Buffer).
func (b Buffer) Len() int {
	if s := b.dt.Size(); s != 0 {
		return len(b.b) / s
	}
	return 0
}

// Bytes returns the Buffer's memory, the caller's slice (no copy): for
// point-to-point messages, which carry bytes.
func (b Buffer) Bytes() []byte { return b.b }

// Slice returns the Buffer of elements [lo, hi). It panics if the range is
// out of bounds, as slicing does.
func (b Buffer) Slice(lo, hi int) Buffer {
	s := b.dt.Size()
	return Buffer{b.b[lo*s : hi*s : hi*s], b.dt}
}

// check validates b for operation op.
func (b Buffer) check(op opKind) error {
	if !b.dt.valid() {
		return fmt.Errorf("dist: %s: %w: %v", op, ErrUnsupportedDType, b.dt)
	}
	if len(b.b)%b.dt.Size() != 0 {
		return fmt.Errorf("dist: %s: %w: %d bytes is not a whole number of %v elements", op, ErrInvalidArgument, len(b.b), b.dt)
	}
	return nil
}

// isZero reports whether b is the zero Buffer (or an empty one with no
// type): what ranks without a part in a buffer may pass.
func (b Buffer) isZero() bool { return b.dt == 0 && len(b.b) == 0 }
