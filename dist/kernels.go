package dist

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	"github.com/x448/float16"

	"github.com/gdist/gdist/dist/internal/coll"
	"github.com/gdist/gdist/internal/vec"
)

// Reduction kernels. They are destination-first and in place (dst[i] = dst[i]
// op src[i]), do no checking (callers pass slices of equal length) and never
// allocate. Mean reduces as Sum; finish divides by the world size once the
// sum is complete.
//
// F32 and F64 buffers reduce in their own precision. F16 and BF16 elements are
// widened to float64, combined, and rounded back to their width (through
// float32, round to nearest even) at every hop, so every partial result on the
// wire has the native width. F32 data reduced "in float64" would give the same
// bits as the float32 kernels: float64 carries more than 2*24+2 significand
// bits, so rounding a float64 sum, product, quotient, max or min of two
// float32 values to float32 is the correctly rounded float32 result.

// littleEndian reports whether this host stores numbers little-endian; New
// refuses to run otherwise, because the kernels and the wire format
// reinterpret float slices as bytes.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// f32Bytes returns the bytes of s (no copy).
func f32Bytes(s []float32) []byte {
	if len(s) == 0 {
		return []byte{}
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 4*len(s))
}

// f64Bytes returns the bytes of s (no copy).
func f64Bytes(s []float64) []byte {
	if len(s) == 0 {
		return []byte{}
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 8*len(s))
}

// asF32 views b as float32s if it is 4-byte aligned.
func asF32(b []byte) ([]float32, bool) {
	if len(b) == 0 {
		return nil, true
	}
	p := unsafe.Pointer(unsafe.SliceData(b))
	if uintptr(p)&3 != 0 {
		return nil, false
	}
	return unsafe.Slice((*float32)(p), len(b)/4), true
}

// asF64 views b as float64s if it is 8-byte aligned.
func asF64(b []byte) ([]float64, bool) {
	if len(b) == 0 {
		return nil, true
	}
	p := unsafe.Pointer(unsafe.SliceData(b))
	if uintptr(p)&7 != 0 {
		return nil, false
	}
	return unsafe.Slice((*float64)(p), len(b)/8), true
}

type float interface{ ~float32 | ~float64 }

func sumInto[T float](dst, src []T) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] += src[i]
	}
}

func prodInto[T float](dst, src []T) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] *= src[i]
	}
}

func maxInto[T float](dst, src []T) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = max(dst[i], src[i])
	}
}

func minInto[T float](dst, src []T) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = min(dst[i], src[i])
	}
}

func divInto[T float](dst []T, d T) {
	for i := range dst {
		dst[i] /= d
	}
}

// sumF32 and sumF64 are the Sum kernels of the aligned F32 and F64 paths,
// the hot loop of every large all-reduce: vectorised adds that round
// exactly like sumInto's scalar loop, about 3.5x faster.
func sumF32(dst, src []float32) { vec.AddF32(dst, src) }

func sumF64(dst, src []float64) { vec.AddF64(dst, src) }

// reduceInto applies op to typed slices.
func reduceInto[T float](dst, src []T, op ReduceOp) {
	switch op {
	case Sum, Mean:
		sumInto(dst, src)
	case Prod:
		prodInto(dst, src)
	case Max:
		maxInto(dst, src)
	case Min:
		minInto(dst, src)
	}
}

// combine64 is the scalar form of op used by the element-by-element kernels.
func combine64(a, b float64, op ReduceOp) float64 {
	switch op {
	case Prod:
		return a * b
	case Max:
		return max(a, b)
	case Min:
		return min(a, b)
	}
	return a + b
}

// codec loads and stores one element kind from little-endian bytes.
type codec struct {
	size  int
	load  func(b []byte) float64
	store func(b []byte, v float64)
}

var (
	codecF16 = codec{2,
		func(b []byte) float64 { return float64(float16.Frombits(binary.LittleEndian.Uint16(b)).Float32()) },
		func(b []byte, v float64) { binary.LittleEndian.PutUint16(b, float16.Fromfloat32(float32(v)).Bits()) },
	}
	codecBF16 = codec{2,
		func(b []byte) float64 { return float64(f32FromBF16(binary.LittleEndian.Uint16(b))) },
		func(b []byte, v float64) { binary.LittleEndian.PutUint16(b, bf16FromF32(float32(v))) },
	}
	// The F32 and F64 codecs are the fallback for unaligned buffers; they
	// compute in the element's own precision, like the aligned kernels.
	codecF32 = codec{4,
		func(b []byte) float64 { return float64(math.Float32frombits(binary.LittleEndian.Uint32(b))) },
		func(b []byte, v float64) { binary.LittleEndian.PutUint32(b, math.Float32bits(float32(v))) },
	}
	codecF64 = codec{8,
		func(b []byte) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(b)) },
		func(b []byte, v float64) { binary.LittleEndian.PutUint64(b, math.Float64bits(v)) },
	}
)

// reduceElems is the element-by-element kernel: each pair is widened to
// float64, combined and stored back in the codec's width.
func reduceElems(c codec, dst, src []byte, op ReduceOp) {
	src = src[:len(dst)]
	if c.size == 4 {
		// float32 arithmetic, to match the aligned kernel bit for bit.
		for i := 0; i+4 <= len(dst); i += 4 {
			a := math.Float32frombits(binary.LittleEndian.Uint32(dst[i:]))
			b := math.Float32frombits(binary.LittleEndian.Uint32(src[i:]))
			var r float32
			switch op {
			case Prod:
				r = a * b
			case Max:
				r = max(a, b)
			case Min:
				r = min(a, b)
			default:
				r = a + b
			}
			binary.LittleEndian.PutUint32(dst[i:], math.Float32bits(r))
		}
		return
	}
	for i := 0; i+c.size <= len(dst); i += c.size {
		c.store(dst[i:], combine64(c.load(dst[i:]), c.load(src[i:]), op))
	}
}

func divElems(c codec, dst []byte, n int) {
	if c.size == 4 {
		for i := 0; i+4 <= len(dst); i += 4 {
			a := math.Float32frombits(binary.LittleEndian.Uint32(dst[i:]))
			binary.LittleEndian.PutUint32(dst[i:], math.Float32bits(a/float32(n)))
		}
		return
	}
	for i := 0; i+c.size <= len(dst); i += c.size {
		c.store(dst[i:], c.load(dst[i:])/float64(n))
	}
}

func codecOf(dt DType) codec {
	switch dt {
	case Float16:
		return codecF16
	case BFloat16:
		return codecBF16
	case Float32:
		return codecF32
	}
	return codecF64
}

// reducer combines wire buffers of one dtype with one ReduceOp.
type reducer struct {
	dt DType
	op ReduceOp
}

// into sets dst = dst op src element by element; len(src) == len(dst), both a
// whole number of elements.
func (r reducer) into(dst, src []byte) {
	switch r.dt {
	case Float32:
		if d, ok := asF32(dst); ok {
			if s, ok := asF32(src); ok {
				if r.op == Sum || r.op == Mean {
					sumF32(d, s)
					return
				}
				reduceInto(d, s, r.op)
				return
			}
		}
	case Float64:
		if d, ok := asF64(dst); ok {
			if s, ok := asF64(src); ok {
				if r.op == Sum || r.op == Mean {
					sumF64(d, s)
					return
				}
				reduceInto(d, s, r.op)
				return
			}
		}
	}
	reduceElems(codecOf(r.dt), dst, src, r.op)
}

// finish completes a reduction of n contributions held in dst: for Mean it
// divides by n; for the other ops it does nothing.
func (r reducer) finish(dst []byte, n int) {
	if r.op != Mean {
		return
	}
	switch r.dt {
	case Float32:
		if d, ok := asF32(dst); ok {
			divInto(d, float32(n))
			return
		}
	case Float64:
		if d, ok := asF64(dst); ok {
			divInto(d, float64(n))
			return
		}
	}
	divElems(codecOf(r.dt), dst, n)
}

// collReducers holds every (dtype, op) as the coll.Reducer the algorithms
// take, made once so that passing one (and handing its Combine to a
// transport's RecvReduce) allocates nothing.
var collReducers = func() (t [Float64 + 1][Prod + 1]coll.Reducer) {
	for dt := Float16; dt <= Float64; dt++ {
		for op := range t[dt] {
			r := reducer{dt: dt, op: ReduceOp(op)}
			t[dt][op] = coll.Reducer{Size: dt.Size(), Combine: r.into}
			if r.op == Mean {
				t[dt][op].Finish = r.finish
			}
		}
	}
	return t
}()

// asColl returns r as the algorithms take it.
func (r reducer) asColl() coll.Reducer { return collReducers[r.dt][r.op] }

// EncodeFloat32 writes src into dst as little-endian elements of type dt,
// rounding to nearest even (F16, BF16) or widening (F64). len(dst) must be
// len(src)*dt.Size(). It allocates nothing and keeps neither slice. It is the
// way to fill a buffer for AllReduceTyped from float32 values.
func EncodeFloat32(dst []byte, src []float32, dt DType) error {
	if !dt.valid() {
		return fmt.Errorf("%w: %v", ErrUnsupportedDType, dt)
	}
	if len(dst) != len(src)*dt.Size() {
		return fmt.Errorf("dist: %w: encode %d values as %v needs %d bytes, got %d", ErrInvalidArgument, len(src), dt, len(src)*dt.Size(), len(dst))
	}
	switch dt {
	case Float32:
		copy(dst, f32Bytes(src))
	default:
		c := codecOf(dt)
		for i, v := range src {
			c.store(dst[i*c.size:], float64(v))
		}
	}
	return nil
}

// DecodeFloat32 reads the little-endian elements of type dt in src into dst
// (F64 values are rounded to float32). len(src) must be len(dst)*dt.Size().
// It allocates nothing and keeps neither slice.
func DecodeFloat32(dst []float32, src []byte, dt DType) error {
	if !dt.valid() {
		return fmt.Errorf("%w: %v", ErrUnsupportedDType, dt)
	}
	if len(src) != len(dst)*dt.Size() {
		return fmt.Errorf("dist: %w: decode %d values of %v needs %d bytes, got %d", ErrInvalidArgument, len(dst), dt, len(dst)*dt.Size(), len(src))
	}
	switch dt {
	case Float32:
		copy(f32Bytes(dst), src)
	default:
		c := codecOf(dt)
		for i := range dst {
			dst[i] = float32(c.load(src[i*c.size:]))
		}
	}
	return nil
}
