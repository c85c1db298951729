package secagg

import (
	"fmt"
	"math"
)

// checkInput refuses an input the quantization cannot represent.
func checkInput[T float32 | float64](p *params, x []T, weight uint64) error {
	if len(x) != p.Dim {
		return fmt.Errorf("secagg: %w: input of %d values, Dim is %d", ErrInvalidArgument, len(x), p.Dim)
	}
	if weight < 1 || weight > p.MaxWeight {
		return fmt.Errorf("secagg: %w: weight %d: want between 1 and MaxWeight %d", ErrInvalidArgument, weight, p.MaxWeight)
	}
	for i, v := range x {
		if math.IsNaN(float64(v)) {
			return fmt.Errorf("secagg: %w: input[%d] is NaN", ErrInvalidArgument, i)
		}
	}
	return nil
}

// quantize writes x's fixed-point ring elements into dst[:Dim] and the
// weight into dst[Dim]. Each value is clipped to [-Clip, Clip], weighted by
// weight/MaxWeight and rounded to the nearest multiple of 1/Scale; the
// product is formed as ((x·w)·Scale)/MaxWeight so that inputs on the
// fixed-point grid stay exact. The clamp to ±q only catches an ulp of
// rounding at the edge of the range.
func quantize[T float32 | float64](p *params, dst []uint64, x []T, weight uint64) {
	c, s := p.Clip, p.Scale
	w, m := float64(weight), float64(p.MaxWeight)
	for i, v := range x {
		f := min(max(float64(v), -c), c)
		q := int64(math.Round(f * w * s / m))
		dst[i] = uint64(min(max(q, -p.q), p.q))
	}
	dst[p.Dim] = weight
}

// dequantize reads a sum of quantized inputs: the weighted sum of the
// values, and the total weight.
func (p *params) dequantize(sum []uint64) ([]float64, uint64) {
	out := make([]float64, p.Dim)
	m := float64(p.MaxWeight)
	for i := range out {
		var v int64
		if p.Bits == 32 {
			v = int64(int32(uint32(sum[i])))
		} else {
			v = int64(sum[i])
		}
		out[i] = float64(v) / p.Scale * m
	}
	return out, sum[p.Dim] & p.mask
}
