package dist

import (
	"testing"

	"gonum.org/v1/gonum/blas/blas32"
)

func sumUnroll[T float](dst, src []T) {
	src = src[:len(dst)]
	i := 0
	for ; i+8 <= len(dst); i += 8 {
		d := (*[8]T)(dst[i:])
		s := (*[8]T)(src[i:])
		d[0] += s[0]
		d[1] += s[1]
		d[2] += s[2]
		d[3] += s[3]
		d[4] += s[4]
		d[5] += s[5]
		d[6] += s[6]
		d[7] += s[7]
	}
	for ; i < len(dst); i++ {
		dst[i] += src[i]
	}
}

func BenchmarkZZSum(b *testing.B) {
	const n = 1 << 18 // 1 MiB of float32
	d, s := make([]float32, n), make([]float32, n)
	b.Run("plain", func(b *testing.B) {
		b.SetBytes(4 * n)
		for b.Loop() {
			sumInto(d, s)
		}
	})
	b.Run("unroll8", func(b *testing.B) {
		b.SetBytes(4 * n)
		for b.Loop() {
			sumUnroll(d, s)
		}
	})
	b.Run("gonum", func(b *testing.B) {
		b.SetBytes(4 * n)
		x := blas32.Vector{N: n, Inc: 1, Data: s}
		y := blas32.Vector{N: n, Inc: 1, Data: d}
		for b.Loop() {
			blas32.Axpy(1, x, y)
		}
	})
	b.Run("copy", func(b *testing.B) {
		b.SetBytes(4 * n)
		for b.Loop() {
			copy(d, s)
		}
	})
}
