//go:build !amd64 || purego

package vec

func addF32(dst, src []float32) { addF32Generic(dst, src) }

func addF64(dst, src []float64) { addF64Generic(dst, src) }

func axpyF32(alpha float32, x, y []float32) { axpyF32Generic(alpha, x, y) }
