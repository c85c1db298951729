package vec

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAddIsExact: the vectorised add gives the bits of a plain dst + src,
// whatever the length (vector body and scalar tail).
func TestAddIsExact(t *testing.T) {
	for _, n := range []int{0, 1, 3, 7, 8, 9, 31, 33, 1000} {
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
