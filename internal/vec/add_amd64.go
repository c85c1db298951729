//go:build !purego

package vec

import "golang.org/x/sys/cpu"

// hasAVX2 selects the AVX2 kernels; without AVX2 the portable ones run.
var hasAVX2 = cpu.X86.HasAVX2

// addF32AVX2 sets dst[i] += src[i] for i < len(dst), 32 floats per loop
// turn; src is at least as long as dst.
//
//go:noescape
func addF32AVX2(dst, src []float32)

// addF64AVX2 is addF32AVX2 for float64, 16 per loop turn.
//
//go:noescape
func addF64AVX2(dst, src []float64)

// axpyF32AVX2 sets y[i] += alpha*x[i] for i < len(y), rounding the
// product and then the sum (no fused multiply-add); x is at least as long
// as y.
//
//go:noescape
func axpyF32AVX2(alpha float32, x, y []float32)

func axpyF32(alpha float32, x, y []float32) {
	if hasAVX2 {
		axpyF32AVX2(alpha, x, y)
		return
	}
	axpyF32Generic(alpha, x, y)
}

func addF32(dst, src []float32) {
	if hasAVX2 {
		addF32AVX2(dst, src)
		return
	}
	addF32Generic(dst, src)
}

func addF64(dst, src []float64) {
	if hasAVX2 {
		addF64AVX2(dst, src)
		return
	}
	addF64Generic(dst, src)
}
