package vec

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
	"gonum.org/v1/gonum/blas/gonum"
)

// TestAddIsExact: the vectorised add gives the bits of a plain dst + src,
// whatever the length (vector body and scalar tail).
func TestAddIsExact(t *testing.T) {
	for _, n := range []int{0, 1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 1000, 4099} {
		d32, s32 := make([]float32, n), make([]float32, n+2)
		d64, s64 := make([]float64, n), make([]float64, n+2)
		for i := range s32 {
			s32[i] = float32(math.Sin(float64(i))) * 1e3
			s64[i] = math.Cos(float64(i)) * 1e-3
		}
		for i := range d32 {
			d32[i] = float32(i) / 7
			d64[i] = float64(i) / 7
		}
		w32, w64 := make([]float32, n), make([]float64, n)
		for i := range w32 {
			w32[i] = d32[i] + s32[i]
			w64[i] = d64[i] + s64[i]
		}
		AddF32(d32, s32)
		AddF64(d64, s64)
		for i := range n {
			require.Equal(t, math.Float32bits(w32[i]), math.Float32bits(d32[i]), "n=%d i=%d", n, i)
			require.Equal(t, math.Float64bits(w64[i]), math.Float64bits(d64[i]), "n=%d i=%d", n, i)
		}
	}
}

// TestAddSpecialValues: every offset into both slices (unaligned vector
// loads), lengths on both sides of each loop's block size, and the values
// whose sums are easy to get wrong (NaN, infinities, signed zeros,
// subnormals, overflow), against the plain sum; with the portable kernels
// too.
func TestAddSpecialValues(t *testing.T) {
	s32 := []float32{0, float32(math.Copysign(0, -1)), 1, -1, float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)),
		math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32, -math.SmallestNonzeroFloat32, 1e-38, 3.25}
	s64 := []float64{0, math.Copysign(0, -1), 1, -1, math.NaN(), math.Inf(1), math.Inf(-1),
		math.MaxFloat64, -math.MaxFloat64, math.SmallestNonzeroFloat64, -math.SmallestNonzeroFloat64, 1e-308, 3.25}
	for _, portable := range []bool{false, true} {
		if portable {
			defer forcePortable()()
		}
		for n := range 80 {
			for off := range 4 {
				d32, s32v := make([]float32, n+off), make([]float32, n+off)
				d64, s64v := make([]float64, n+off), make([]float64, n+off)
				for i := range n + off {
					d32[i], s32v[i] = s32[(i*5+n)%len(s32)], s32[(i*3+off)%len(s32)]
					d64[i], s64v[i] = s64[(i*5+n)%len(s64)], s64[(i*3+off)%len(s64)]
				}
				w32, w64 := make([]float32, n), make([]float64, n)
				for i := range n {
					w32[i] = d32[off+i] + s32v[i]
					w64[i] = d64[off+i] + s64v[i]
				}
				AddF32(d32[off:], s32v[:n])
				AddF64(d64[off:], s64v[:n])
				for i := range n {
					require.Equal(t, math.Float32bits(w32[i]), math.Float32bits(d32[off+i]), "portable=%v n=%d off=%d i=%d", portable, n, off, i)
					require.Equal(t, math.Float64bits(w64[i]), math.Float64bits(d64[off+i]), "portable=%v n=%d off=%d i=%d", portable, n, off, i)
				}
			}
		}
	}
}

// TestAddShortSource: a source shorter than dst panics before anything is
// written.
func TestAddShortSource(t *testing.T) {
	d := []float32{1, 2, 3}
	require.Panics(t, func() { AddF32(d, []float32{1, 2}) })
	require.Equal(t, []float32{1, 2, 3}, d)
	d64 := []float64{1, 2, 3}
	require.Panics(t, func() { AddF64(d64, []float64{1}) })
	require.Equal(t, []float64{1, 2, 3}, d64)
}

// BenchmarkAddF32 times AddF32 with the kernel this machine selects and
// with the portable one (gonum's axpy), from data in L1 to data beyond L2.
func BenchmarkAddF32(b *testing.B) {
	for _, kernel := range []string{"selected", "portable"} {
		for _, n := range []int{1 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20} {
			d, s := make([]float32, n), make([]float32, n)
			b.Run(fmt.Sprintf("%s/%dKiB", kernel, 4*n>>10), func(b *testing.B) {
				if kernel == "portable" {
					defer forcePortable()()
				}
				b.SetBytes(int64(4 * n))
				for b.Loop() {
					AddF32(d, s)
				}
			})
		}
	}
}

// TestAxpyMatchesGonum: AxpyF32 gives the bits of gonum's Saxpy, the
// kernel of its Sgemm, for every offset and length up to 80, a long
// vector, and alphas and values that round, overflow, underflow or are
// not numbers; with the portable kernel too.
func TestAxpyMatchesGonum(t *testing.T) {
	vals := []float32{0, float32(math.Copysign(0, -1)), 1, -1, 1.0 / 3, float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)),
		math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32, 1e-38, 3.25, -7.1e7, 0.1}
	alphas := []float32{1, -1, 0.1, 3.7e-3, 1e30, 1e-30, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.NaN())}
	for _, portable := range []bool{false, true} {
		if portable {
			defer forcePortable()()
		}
		for _, n := range append(rangeInts(80), 1000, 4099) {
			for off := range 3 {
				for ai, alpha := range alphas {
					x, y := make([]float32, n+off), make([]float32, n+off)
					for i := range x {
						x[i] = vals[(i*7+ai)%len(vals)] * float32(1+i%5)
						y[i] = vals[(i*3+n)%len(vals)]
					}
					want := append([]float32(nil), y[off:]...)
					gonum.Implementation{}.Saxpy(n, alpha, x[:n], 1, want, 1)
					AxpyF32(alpha, x[:n], y[off:])
					for i := range n {
						require.Equal(t, math.Float32bits(want[i]), math.Float32bits(y[off+i]),
							"portable=%v n=%d off=%d alpha=%v i=%d", portable, n, off, alpha, i)
					}
				}
			}
		}
	}
	require.Panics(t, func() { AxpyF32(1, []float32{1}, []float32{1, 2}) })
}

func rangeInts(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}
