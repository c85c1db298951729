package transformer

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// TestFusedBitwise: a Decoder's fused layer norm, GELU and row bias give
// bitwise what the training graph's Gorgonia operations give, in both
// precisions, on rows of very different scales.
func TestFusedBitwise(t *testing.T) {
	for _, dt := range []Dtype{Float32, Float64} {
		for _, rows := range []int{1, 3, 64} {
			t.Run(fmt.Sprintf("%v/rows%d", dt, rows), func(t *testing.T) {
				cfg := Config{Vocab: 8, Ctx: 64, Dim: 96, Heads: 2, Layers: 1, MLPHidden: 32, Dtype: dt, Seed: 7}
				rng := rand.New(rand.NewPCG(uint64(rows), uint64(dt)))
				x := make([]float64, rows*cfg.Dim)
				for i := range x {
					x[i] = rng.NormFloat64() * math.Pow(10, float64(i/cfg.Dim%7-3)) // a scale per row
				}
				params := make(map[string][]float64)
				for _, name := range []string{"ln1.g", "ln1.b", "attn.bo"} {
					v := make([]float64, cfg.Dim)
					for i := range v {
						v[i] = rng.NormFloat64()
					}
					params[name] = v
				}
				for _, kind := range []fusedKind{fusedLayerNorm, fusedGELU, fusedAddRow} {
					want := runBlockPiece(t, cfg, rows, x, params, kind, false)
					got := runBlockPiece(t, cfg, rows, x, params, kind, true)
					for i := range want {
						if math.Float64bits(want[i]) != math.Float64bits(got[i]) {
							t.Fatalf("%v: element %d is %v, the unfused graph gives %v", kind, i, got[i], want[i])
						}
					}
				}
			})
		}
	}
}

// runBlockPiece runs one of a layer-1 stage's layer norm, GELU or output
// bias on x, fused (as in a Decoder) or not, and returns the result.
func runBlockPiece(t *testing.T, cfg Config, rows int, x []float64, params map[string][]float64, kind fusedKind, fuse bool) []float64 {
	g := gorgonia.NewGraph()
	st, err := NewStage(g, cfg, 1, 1, rows)
	require.NoError(t, err)
	if fuse {
		st.kv = newKVCache(cfg, 1, rows, cfg.Heads)
	}
	for name, v := range params {
		require.NoError(t, copyInto(st.Param(LayerName(1)+"."+name).Value().(*tensor.Dense),
			tensor.New(tensor.WithShape(len(v)), tensor.WithBacking(v))))
	}
	in := st.newMatrix("x", tensor.Shape{rows, cfg.Dim})
	require.NoError(t, copyInto(in.Value().(*tensor.Dense), tensor.New(tensor.WithShape(rows, cfg.Dim), tensor.WithBacking(x))))
	var out *gorgonia.Node
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("building: %v", r)
			}
		}()
		switch kind {
		case fusedLayerNorm:
			out = st.layerNorm(in, 1, "ln1")
		case fusedGELU:
			out = st.gelu(in)
		case fusedAddRow:
			out = st.addBias(in, 1, "attn.bo")
		}
	}()
	var v gorgonia.Value
	gorgonia.Read(out, &v)
	vm := gorgonia.NewTapeMachine(g)
	defer vm.Close()
	require.NoError(t, vm.RunAll())
	r, err := denseFloat64s(v.(*tensor.Dense))
	require.NoError(t, err)
	return r
}
