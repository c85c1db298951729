package transformer_test

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/models/transformer"
)

// TestDecoderMatchesFullForward: the logits of every position, computed one
// position at a time through the KV cache, are bitwise the full forward
// pass's, in float32 and float64, with a block of at most 64 positions and
// with one above (where the full pass multiplies in blocks along the head
// dimension), and for a prompt run as one pass.
func TestDecoderMatchesFullForward(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		cfg  transformer.Config
	}{
		{"f64 ctx6", tinyConfig(transformer.Float64)},
		{"f32 ctx6", tinyConfig(transformer.Float32)},
		{"f64 ctx80", transformer.Config{Vocab: 11, Ctx: 80, Dim: 16, Heads: 2, Layers: 2, MLPHidden: 24, Dtype: transformer.Float64, Seed: 3}},
		{"f32 ctx80 tied", transformer.Config{Vocab: 11, Ctx: 80, Dim: 16, Heads: 4, Layers: 1, MLPHidden: 24, Dtype: transformer.Float32, Seed: 3, TiedHead: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			pred, err := transformer.NewPredictor(cfg, nil)
			require.NoError(t, err)
			defer pred.Close()
			dec, err := transformer.NewDecoder(cfg, 0, cfg.HeadLayer(), 2)
			require.NoError(t, err)
			defer dec.Close()
			rng := rand.New(rand.NewPCG(1, 2))
			ids := randomIDs(rng, cfg.Ctx, cfg.Vocab)
			full, err := pred.Forward(ctx, ids)
			require.NoError(t, err)
			V := cfg.Vocab
			// Slot 1: one position per pass. Slot 0: a prompt of 3 in one pass, then one at a time.
			for p := range cfg.Ctx {
				out, err := dec.Forward(ctx, []transformer.Row{{Slot: 1, Pos: p}}, ids[p:p+1], nil)
				require.NoError(t, err)
				got := floats(out.Data())
				require.Equal(t, bits(full[p*V:(p+1)*V]), bits(got), "position %d", p)
			}
			rows := []transformer.Row{{Slot: 0, Pos: 0}, {Slot: 0, Pos: 1}, {Slot: 0, Pos: 2}}
			out, err := dec.Forward(ctx, rows, ids[:3], nil)
			require.NoError(t, err)
			assert.Equal(t, bits(full[:3*V]), bits(floats(out.Data())))
		})
	}
}

func floats(data any) []float64 {
	switch d := data.(type) {
	case []float32:
		out := make([]float64, len(d))
		for i, v := range d {
			out[i] = float64(v)
		}
		return out
	case []float64:
		return append([]float64(nil), d...)
	}
	panic("not floats")
}

func bits(x []float64) []uint64 {
	out := make([]uint64, len(x))
	for i, v := range x {
		out[i] = math.Float64bits(v)
	}
	return out
}

// TestDecoderGenerateSameTokens: Generate with a Decoder gives the tokens it
// gives with a Predictor, greedy and sampled, past the block size (where the
// window slides and the decoder recomputes it); GenerateBatch gives each of
// several requests of different lengths those tokens too.
func TestDecoderGenerateSameTokens(t *testing.T) {
	ctx := context.Background()
	cfg := tinyConfig(transformer.Float64)
	cfg.Ctx = 12
	pred, err := transformer.NewPredictor(cfg, nil)
	require.NoError(t, err)
	defer pred.Close()
	dec, err := transformer.NewDecoder(cfg, 0, cfg.HeadLayer(), 3)
	require.NoError(t, err)
	defer dec.Close()
	reqs := []transformer.Request{
		{Prompt: []int{1, 2, 3}, N: 20, Temperature: 0, Seed: 1},
		{Prompt: []int{4}, N: 15, Temperature: 0.9, Seed: 7},
		{Prompt: []int{5, 6, 0, 1, 2, 3, 4}, N: 9, Temperature: 1.3, Seed: 2},
	}
	want := make([][]int, len(reqs))
	for i, r := range reqs {
		want[i], err = transformer.Generate(ctx, pred, r.Prompt, r.N, r.Temperature, r.Seed)
		require.NoError(t, err)
		got, err := transformer.Generate(ctx, dec, r.Prompt, r.N, r.Temperature, r.Seed)
		require.NoError(t, err)
		assert.Equal(t, want[i], got, "request %d alone", i)
	}
	dec2, err := transformer.NewDecoder(cfg, 0, cfg.HeadLayer(), 4)
	require.NoError(t, err)
	defer dec2.Close()
	got, err := transformer.GenerateBatch(ctx, dec2, reqs)
	require.NoError(t, err)
	assert.Equal(t, want, got)
}

func TestDecoderBadArguments(t *testing.T) {
	cfg := tinyConfig(transformer.Float64)
	_, err := transformer.NewDecoder(cfg, 0, cfg.HeadLayer(), 0)
	assert.ErrorIs(t, err, transformer.ErrInvalidArgument)
	_, err = transformer.NewDecoder(cfg, 2, 1, 1)
	assert.ErrorIs(t, err, transformer.ErrLayerRange)
	dec, err := transformer.NewDecoder(cfg, 0, cfg.HeadLayer(), 1)
	require.NoError(t, err)
	defer dec.Close()
	_, err = dec.Forward(context.Background(), []transformer.Row{{Slot: 1, Pos: 0}}, []int{0}, nil)
	assert.ErrorIs(t, err, transformer.ErrShape)
	_, err = dec.Forward(context.Background(), []transformer.Row{{Slot: 0, Pos: cfg.Ctx}}, []int{0}, nil)
	assert.ErrorIs(t, err, transformer.ErrShape)
	_, err = dec.Forward(context.Background(), []transformer.Row{{Slot: 0, Pos: 0}}, []int{cfg.Vocab}, nil)
	assert.ErrorIs(t, err, transformer.ErrToken)
	_, err = transformer.GenerateBatch(context.Background(), dec, []transformer.Request{{Prompt: []int{1}, N: 1}, {Prompt: []int{1}, N: 1}})
	assert.ErrorIs(t, err, transformer.ErrInvalidArgument)
}
