// Package vec holds the vectorised element-wise kernels gdist's hot loops
// share: the sum at the heart of every large all-reduce, the merge of
// micro-batch gradients in a pipeline stage, DDP's gradient accumulation.
//
// # Usage
//
//	vec.AddF32(dst, src) // dst[i] += src[i]
package vec

import (
	"gonum.org/v1/gonum/blas/gonum"
	"gonum.org/v1/gonum/floats"
)

// AddF32 sets dst[i] += src[i] for i < len(dst); src must be at least as
// long. On amd64 with AVX2 it adds 32 floats per loop turn (about 2.5x
// gonum's axpy on data in cache); elsewhere it is gonum's axpy with alpha
// 1, dst = 1*src + dst. Both round exactly like dst + src: IEEE addition,
// and multiplying by one is exact, with or without a fused multiply-add.
func AddF32(dst, src []float32) {
	src = src[:len(dst)] // panics, as documented, on a shorter src
	addF32(dst, src)
}

// AddF64 sets dst[i] += src[i] for i < len(dst), like AddF32.
func AddF64(dst, src []float64) {
	src = src[:len(dst)]
	addF64(dst, src)
}

// AxpyF32 sets y[i] += alpha*x[i] for i < len(y); x must be at least as
// long. It rounds as gonum's float32 axpy (Saxpy, and the kernel of its
// Sgemm) does, the product and then the sum, without a fused multiply-add,
// so its results are bitwise gonum's; on amd64 with AVX2 it runs 32 floats
// per loop turn, elsewhere it is gonum's. As Saxpy, it leaves y alone when
// alpha is zero (even where x holds infinities or NaNs).
func AxpyF32(alpha float32, x, y []float32) {
	x = x[:len(y)] // panics, as documented, on a shorter x
	if alpha == 0 {
		return
	}
	axpyF32(alpha, x, y)
}

func axpyF32Generic(alpha float32, x, y []float32) {
	gonum.Implementation{}.Saxpy(len(y), alpha, x, 1, y, 1)
}

func addF32Generic(dst, src []float32) {
	gonum.Implementation{}.Saxpy(len(dst), 1, src, 1, dst, 1)
}

func addF64Generic(dst, src []float64) { floats.Add(dst, src) }
