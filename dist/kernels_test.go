package dist

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSumKernelsBitwise: the vectorised Sum kernels give exactly dst[i] +
// src[i] (the float64 sum rounded once, for Float32) for every length and
// alignment, including zeros of both signs, subnormals and infinities.
func TestSumKernelsBitwise(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 11))
	special := []float64{0, math.Copysign(0, -1), 1e-40, -1e-40, 5e-324, math.Inf(1), math.Inf(-1), 3.4e38, -3.4e38, 1}
	val := func() float64 {
		if rng.IntN(8) == 0 {
			return special[rng.IntN(len(special))]
		}
		return rng.NormFloat64() * math.Pow(2, float64(rng.IntN(80)-40))
	}
	for n := range 70 {
		for off := range 4 {
			so := 3 - off // src starts elsewhere in its buffer than dst in its own
			d32, s32 := make([]float32, n+4), make([]float32, n+4)
			d64, s64 := make([]float64, n+4), make([]float64, n+4)
			for i := range d32 {
				d32[i], s32[i] = float32(val()), float32(val())
				d64[i], s64[i] = val(), val()
			}
			w32, w64 := make([]float32, n), make([]float64, n)
			for i := range n {
				w32[i] = float32(float64(d32[off+i]) + float64(s32[so+i]))
				w64[i] = d64[off+i] + s64[so+i]
			}
			sumF32(d32[off:off+n], s32[so:so+n])
			sumF64(d64[off:off+n], s64[so:so+n])
			for i := range n {
				if math.IsNaN(float64(w32[i])) {
					require.True(t, math.IsNaN(float64(d32[off+i])))
				} else {
					require.Equal(t, math.Float32bits(w32[i]), math.Float32bits(d32[off+i]), "f32 n=%d off=%d i=%d", n, off, i)
				}
				if math.IsNaN(w64[i]) {
					require.True(t, math.IsNaN(d64[off+i]))
				} else {
					require.Equal(t, math.Float64bits(w64[i]), math.Float64bits(d64[off+i]), "f64 n=%d off=%d i=%d", n, off, i)
				}
			}
		}
	}
}
