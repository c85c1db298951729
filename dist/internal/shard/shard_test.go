package shard

import (
	"testing"

	"github.com/stretchr/testify/require"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// TestSegmentsCover checks, for many layouts and rank counts, that the
// ranks' segments cover every element of every parameter exactly once and
// that each segment lies inside its piece and its parameter.
func TestSegmentsCover(t *testing.T) {
	layouts := [][]int{{1}, {5}, {3, 4}, {1, 1, 1, 1, 1}, {7, 0, 9, 2}, {100, 3, 64, 1, 17}}
	for _, lens := range layouts {
		var spans []Span
		off := 0
		for i, n := range lens {
			if n > 0 {
				spans = append(spans, Span{Param: i, Off: off, Len: n})
			}
			off += n
		}
		for size := 1; size <= 7; size++ {
			piece := Piece(off, size)
			require.GreaterOrEqual(t, piece*size, off)
			seen := make([][]int, len(lens))
			for i, n := range lens {
				seen[i] = make([]int, n)
			}
			for r := range size {
				prevEnd := 0
				for _, s := range Segments(spans, piece, r) {
					require.Greater(t, s.Len, 0)
					require.GreaterOrEqual(t, s.Off, prevEnd, "segments in order")
					require.LessOrEqual(t, s.Off+s.Len, piece)
					require.LessOrEqual(t, s.ParamOff+s.Len, lens[s.Param])
					prevEnd = s.Off + s.Len
					for k := range s.Len {
						seen[s.Param][s.ParamOff+k]++
					}
				}
			}
			for i := range seen {
				for k, c := range seen[i] {
					require.Equal(t, 1, c, "lens %v size %d: param %d element %d", lens, size, i, k)
				}
			}
		}
	}
}

func TestViews(t *testing.T) {
	val, grad := []float32{1, 2, 3}, []float32{4, 5, 6}
	v, err := NewView("w[0:3]", val, grad, []int{3})
	require.NoError(t, err)
	require.Equal(t, "w[0:3]", v.Name())
	require.Equal(t, tensor.Shape{3}, v.Value().Shape())
	v.Value().(*tensor.Dense).Float32s()[1] = 20
	require.Equal(t, float32(20), val[1], "the view is over val")
	g, err := v.Grad()
	require.NoError(t, err)
	require.Equal(t, []float32{4, 5, 6}, g.Data())

	s, err := NewView("s[0:1]", []float64{2}, []float64{3}, nil)
	require.NoError(t, err)
	require.IsType(t, (*gorgonia.F64)(nil), s.Value())
	_, err = NewView("bad", []float64{1, 2}, []float64{3}, []int{2})
	require.Error(t, err)
	_, err = NewView("bad", []float64{1, 2}, []float64{3, 4}, nil)
	require.Error(t, err)
}

func TestMulInto(t *testing.T) {
	for _, n := range []int{0, 1, 7, 8, 9, 17, 1000} {
		src := make([]float32, n)
		for i := range src {
			src[i] = float32(i)*1.5 - 3
		}
		dst := make([]float32, n+3)
		MulInto(dst, src, 0.25)
		for i, v := range src {
			require.Equal(t, v*0.25, dst[i], "n=%d i=%d", n, i)
		}
		for _, v := range dst[n:] {
			require.Zero(t, v, "past the end untouched")
		}
	}
}

func TestScaleInto(t *testing.T) {
	src := []float64{1, 3, -7, 0.1}
	dst := make([]float64, 4)
	ScaleInto(dst, src, 3)
	for i, v := range src {
		require.Equal(t, v/3, dst[i])
	}
	ScaleInto(dst, src, 4)
	for i, v := range src {
		require.Equal(t, v/4, dst[i])
	}
}

func TestClipCoef(t *testing.T) {
	require.Equal(t, 1.0, ClipCoef(0.5, 1))
	require.InDelta(t, 0.5, ClipCoef(2, 1), 1e-6)
	require.Equal(t, 25.0, SumSquares([]float32{3, 4}))
}
