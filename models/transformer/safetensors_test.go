package transformer

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/train/checkpoint"
)

// handBuiltHeader is the JSON header of a GPT-2-like file of a model with
// vocabulary 3, context 2, width 2, one block and MLP width 2, as
// GPT2LMHeadModel's state dict names it, written out by hand: the
// tensors in order, F32 but for ln_f (F16 weight, BF16 bias), the causal
// mask buffer h.0.attn.bias, no lm_head.bias and no __metadata__.
const handBuiltHeader = `{` +
	`"transformer.wte.weight":{"dtype":"F32","shape":[3,2],"data_offsets":[0,24]},` +
	`"transformer.wpe.weight":{"dtype":"F32","shape":[2,2],"data_offsets":[24,40]},` +
	`"transformer.h.0.ln_1.weight":{"dtype":"F32","shape":[2],"data_offsets":[40,48]},` +
	`"transformer.h.0.ln_1.bias":{"dtype":"F32","shape":[2],"data_offsets":[48,56]},` +
	`"transformer.h.0.attn.c_attn.weight":{"dtype":"F32","shape":[2,6],"data_offsets":[56,104]},` +
	`"transformer.h.0.attn.c_attn.bias":{"dtype":"F32","shape":[6],"data_offsets":[104,128]},` +
	`"transformer.h.0.attn.c_proj.weight":{"dtype":"F32","shape":[2,2],"data_offsets":[128,144]},` +
	`"transformer.h.0.attn.c_proj.bias":{"dtype":"F32","shape":[2],"data_offsets":[144,152]},` +
	`"transformer.h.0.ln_2.weight":{"dtype":"F32","shape":[2],"data_offsets":[152,160]},` +
	`"transformer.h.0.ln_2.bias":{"dtype":"F32","shape":[2],"data_offsets":[160,168]},` +
	`"transformer.h.0.mlp.c_fc.weight":{"dtype":"F32","shape":[2,2],"data_offsets":[168,184]},` +
	`"transformer.h.0.mlp.c_fc.bias":{"dtype":"F32","shape":[2],"data_offsets":[184,192]},` +
	`"transformer.h.0.mlp.c_proj.weight":{"dtype":"F32","shape":[2,2],"data_offsets":[192,208]},` +
	`"transformer.h.0.mlp.c_proj.bias":{"dtype":"F32","shape":[2],"data_offsets":[208,216]},` +
	`"transformer.h.0.attn.bias":{"dtype":"F32","shape":[1,1,2,2],"data_offsets":[216,232]},` +
	`"transformer.ln_f.weight":{"dtype":"F16","shape":[2],"data_offsets":[232,236]},` +
	`"transformer.ln_f.bias":{"dtype":"BF16","shape":[2],"data_offsets":[236,240]},` +
	`"lm_head.weight":{"dtype":"F32","shape":[3,2],"data_offsets":[240,264]}` +
	`}`

// handBuiltFile returns the bytes of the file: the header's length as 8
// little-endian bytes, the header, then the data. F32 tensor number k
// (counting from 1 in header order) holds k + j/8 at element j, except
// c_attn.bias (zeros); ln_f.weight is F16 1 and -2, ln_f.bias BF16 1 and 3.
func handBuiltFile() []byte {
	var b []byte
	b = binary.LittleEndian.AppendUint64(b, uint64(len(handBuiltHeader)))
	b = append(b, handBuiltHeader...)
	f32 := func(k, n int) {
		for j := range n {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(k)+float32(j)/8))
		}
	}
	for k, n := range []int{6, 4, 2, 2, 12} { // wte .. c_attn.weight
		f32(k+1, n)
	}
	b = append(b, make([]byte, 24)...)                   // c_attn.bias: zeros
	for k, n := range []int{4, 2, 2, 2, 4, 2, 4, 2, 4} { // c_proj.weight .. attn.bias
		f32(k+7, n)
	}
	b = binary.LittleEndian.AppendUint16(b, 0x3C00) // F16 1
	b = binary.LittleEndian.AppendUint16(b, 0xC000) // F16 -2
	b = binary.LittleEndian.AppendUint16(b, 0x3F80) // BF16 1
	b = binary.LittleEndian.AppendUint16(b, 0x4040) // BF16 3
	f32(18, 6)                                      // lm_head.weight
	return b
}

func seq(k float64, n int) []float64 {
	out := make([]float64, n)
	for j := range out {
		out[j] = k + float64(j)/8
	}
	return out
}

// TestReadHandBuiltSafetensors: a file written byte by byte in the test
// reads into the model's parameters: the configuration inferred from the
// shapes (heads given), c_attn split into q, k and v, lm_head transposed,
// F16 and BF16 converted, the mask buffer skipped, the head bias zero.
func TestReadHandBuiltSafetensors(t *testing.T) {
	ck, err := ReadSafetensors(handBuiltFile(), 1)
	require.NoError(t, err)
	assert.Equal(t, Config{Vocab: 3, Ctx: 2, Dim: 2, Heads: 1, Layers: 1, MLPHidden: 2, Dtype: Float32, Seed: 1}, ck.Config)
	assert.Nil(t, ck.Vocab)
	want := map[string][]float64{
		"layer00.tok_emb": seq(1, 6), "layer00.pos_emb": seq(2, 4),
		"layer01.ln1.g": seq(3, 2), "layer01.ln1.b": seq(4, 2),
		"layer01.attn.wq": {5, 5.125, 5.75, 5.875}, "layer01.attn.wk": {5.25, 5.375, 6, 6.125},
		"layer01.attn.wv": {5.5, 5.625, 6.25, 6.375},
		"layer01.attn.wo": seq(7, 4), "layer01.attn.bo": seq(8, 2),
		"layer01.ln2.g": seq(9, 2), "layer01.ln2.b": seq(10, 2),
		"layer01.mlp.w1": seq(11, 4), "layer01.mlp.b1": seq(12, 2),
		"layer01.mlp.w2": seq(13, 4), "layer01.mlp.b2": seq(14, 2),
		"layer02.ln.g": {1, -2}, "layer02.ln.b": {1, 3},
		"layer02.head.w": {18, 18.25, 18.5, 18.125, 18.375, 18.625}, "layer02.head.b": {0, 0, 0},
	}
	require.Equal(t, ParamNames(ck.Config, 0, 2), names(ck.Tensors))
	for _, nt := range ck.Tensors {
		shape, _ := ParamShape(ck.Config, nt.Name)
		assert.Equal(t, shape, nt.Tensor.Shape(), nt.Name)
		got, err := denseFloat64s(nt.Tensor.(*tensor.Dense))
		require.NoError(t, err)
		assert.Equal(t, want[nt.Name], got, nt.Name)
	}
	// The same file needs the number of heads: no shape tells it.
	_, err = ReadSafetensors(handBuiltFile(), 0)
	assert.ErrorIs(t, err, ErrFormat)
}

func names(ts []checkpoint.Named) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.Name
	}
	return out
}

// TestHalfToFloat: binary16 values, subnormals and specials included.
func TestHalfToFloat(t *testing.T) {
	for bits, want := range map[uint16]float64{
		0x0000: 0, 0x3C00: 1, 0xC000: -2, 0x3555: 0.333251953125, 0x7BFF: 65504,
		0x0001: math.Ldexp(1, -24), 0x03FF: math.Ldexp(1023, -24), 0x0400: math.Ldexp(1, -14),
		0x7C00: math.Inf(1), 0xFC00: math.Inf(-1),
	} {
		assert.Equal(t, want, halfToFloat(bits), "%#04x", bits)
	}
	assert.True(t, math.Signbit(halfToFloat(0x8000)))
	assert.True(t, math.IsNaN(halfToFloat(0x7E00)))
}

// randomCheckpoint is cfg's initial model with every tensor perturbed (so
// that no bias or gain keeps its zero or one), a vocabulary and a step.
func randomCheckpoint(t *testing.T, cfg Config) *Checkpoint {
	ck := &Checkpoint{Config: cfg, Step: 42}
	for l := range cfg.NumLayers() {
		for i, p := range paramSpecs(cfg, l) {
			d := initTensor(cfg, p)
			switch x := d.Data().(type) {
			case []float32:
				for j := range x {
					x[j] += float32(i+1) * 0.01 * float32(j%5)
				}
			case []float64:
				for j := range x {
					x[j] += float64(i+1) * 0.01 * float64(j%5)
				}
			}
			ck.Tensors = append(ck.Tensors, checkpoint.Named{Name: p.name, Tensor: d})
		}
	}
	runes := make([]rune, cfg.Vocab)
	for i := range runes {
		runes[i] = rune('a' + i)
	}
	var err error
	ck.Vocab, err = VocabFromRunes(runes)
	require.NoError(t, err)
	return ck
}

// TestSafetensorsRoundTrip: a model written and read back is bitwise the
// same model (configuration, vocabulary, step, every tensor), in both
// precisions, with a separate and a tied head; through a file too.
func TestSafetensorsRoundTrip(t *testing.T) {
	for _, dt := range []Dtype{Float32, Float64} {
		for _, tied := range []bool{false, true} {
			cfg := Config{Vocab: 11, Ctx: 8, Dim: 12, Heads: 3, Layers: 2, MLPHidden: 20, Dtype: dt, Seed: 5, TiedHead: tied}
			ck := randomCheckpoint(t, cfg)
			var buf bytes.Buffer
			require.NoError(t, WriteSafetensors(&buf, ck))
			got, err := ReadSafetensors(buf.Bytes(), 0)
			require.NoError(t, err, "%v tied=%v", dt, tied)
			assert.Equal(t, ck.Config, got.Config)
			assert.Equal(t, ck.Step, got.Step)
			assert.Equal(t, ck.Vocab.Decode(seqIDs(cfg.Vocab)), got.Vocab.Decode(seqIDs(cfg.Vocab)))
			require.Equal(t, names(ck.Tensors), names(got.Tensors))
			for i := range ck.Tensors {
				a, b := ck.Tensors[i].Tensor.(*tensor.Dense), got.Tensors[i].Tensor.(*tensor.Dense)
				assert.Equal(t, a.Shape(), b.Shape(), ck.Tensors[i].Name)
				assert.Equal(t, a.Data(), b.Data(), ck.Tensors[i].Name)
			}
			path := filepath.Join(t.TempDir(), "m.safetensors")
			require.NoError(t, SaveSafetensors(path, ck))
			fromFile, err := LoadSafetensors(path, 0)
			require.NoError(t, err)
			assert.Equal(t, got.Tensors, fromFile.Tensors)
		}
	}
}

func seqIDs(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// TestWriteSafetensorsFormat reads what WriteSafetensors wrote with the
// published format alone: 8 little-endian bytes of header length, a JSON
// object of tensors (dtype, shape, data_offsets, contiguous from 0 to the
// end of the file) and __metadata__, then little-endian data — and finds
// GPT-2's names, c_attn = q | k | v with a zero bias, lm_head the
// transposed head.
func TestWriteSafetensorsFormat(t *testing.T) {
	cfg := Config{Vocab: 5, Ctx: 4, Dim: 4, Heads: 2, Layers: 1, MLPHidden: 6, Dtype: Float32, Seed: 3}
	ck := randomCheckpoint(t, cfg)
	var buf bytes.Buffer
	require.NoError(t, WriteSafetensors(&buf, ck))
	b := buf.Bytes()
	n := binary.LittleEndian.Uint64(b[:8])
	require.LessOrEqual(t, 8+n, uint64(len(b)))
	var header map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(b[8:8+n], &header))
	data := b[8+n:]
	var meta map[string]string
	require.NoError(t, json.Unmarshal(header["__metadata__"], &meta))
	assert.Equal(t, "pt", meta["format"])
	assert.Equal(t, FormatName, meta["gdist.format"])
	assert.Equal(t, "42", meta["gdist.step"])
	var mc Config
	require.NoError(t, json.Unmarshal([]byte(meta["gdist.config"]), &mc))
	assert.Equal(t, cfg, mc)
	type entry struct {
		DType   string   `json:"dtype"`
		Shape   []int    `json:"shape"`
		Offsets [2]int64 `json:"data_offsets"`
	}
	tensors := map[string]entry{}
	var spans [][2]int64
	for name, raw := range header {
		if name == "__metadata__" {
			continue
		}
		var e entry
		require.NoError(t, json.Unmarshal(raw, &e), name)
		assert.Equal(t, "F32", e.DType, name)
		size := int64(4)
		for _, d := range e.Shape {
			size *= int64(d)
		}
		assert.Equal(t, size, e.Offsets[1]-e.Offsets[0], name)
		tensors[name] = e
		spans = append(spans, e.Offsets)
	}
	slices.SortFunc(spans, func(a, b [2]int64) int { return int(a[0] - b[0]) })
	at := int64(0)
	for _, s := range spans {
		require.Equal(t, at, s[0], "data ranges are contiguous")
		at = s[1]
	}
	require.Equal(t, int64(len(data)), at, "the data ends the file")
	read := func(name string) []float64 {
		e, ok := tensors[name]
		require.True(t, ok, name)
		var out []float64
		for o := e.Offsets[0]; o < e.Offsets[1]; o += 4 {
			out = append(out, float64(math.Float32frombits(binary.LittleEndian.Uint32(data[o:]))))
		}
		return out
	}
	param := func(name string) []float64 {
		for _, nt := range ck.Tensors {
			if nt.Name == name {
				v, err := denseFloat64s(nt.Tensor.(*tensor.Dense))
				require.NoError(t, err)
				return v
			}
		}
		t.Fatalf("no %s", name)
		return nil
	}
	assert.Len(t, tensors, 2+12+4) // wte, wpe; 12 per block (c_attn weight and bias for q, k, v); ln_f and lm_head, weight and bias
	assert.Equal(t, param("layer00.tok_emb"), read("wte.weight"))
	assert.Equal(t, []int{4, 12}, tensors["h.0.attn.c_attn.weight"].Shape)
	qkv := read("h.0.attn.c_attn.weight")
	for r := range 4 {
		for part, s := range []string{"wq", "wk", "wv"} {
			assert.Equal(t, param("layer01.attn." + s)[r*4:r*4+4], qkv[r*12+part*4:r*12+part*4+4], "row %d of %s", r, s)
		}
	}
	assert.Equal(t, make([]float64, 12), read("h.0.attn.c_attn.bias"))
	assert.Equal(t, param("layer01.mlp.w1"), read("h.0.mlp.c_fc.weight"))
	assert.Equal(t, param("layer02.ln.b"), read("ln_f.bias"))
	assert.Equal(t, []int{5, 4}, tensors["lm_head.weight"].Shape)
	assert.Equal(t, transposed(param("layer02.head.w"), 4, 5), read("lm_head.weight"))
	assert.Equal(t, param("layer02.head.b"), read("lm_head.bias"))
}

// TestReadSafetensorsRefuses: what the model cannot hold is an error
// naming the tensor, and a damaged file is ErrFormat.
func TestReadSafetensorsRefuses(t *testing.T) {
	good := handBuiltFile()
	n := 8 + int(binary.LittleEndian.Uint64(good[:8]))
	withData := func(at int, v float32) []byte {
		b := slices.Clone(good)
		binary.LittleEndian.PutUint32(b[n+at:], math.Float32bits(v))
		return b
	}
	// GPT-2's own attention has biases for q, k and v.
	_, err := ReadSafetensors(withData(104+8, 0.5), 1)
	assert.ErrorIs(t, err, ErrFormat)
	assert.ErrorContains(t, err, "c_attn.bias")
	// A tensor of another model.
	extra := bytes.Replace(good, []byte(`"lm_head.weight"`), []byte(`"lm_head.weigh2"`), 1)
	_, err = ReadSafetensors(extra, 1)
	assert.True(t, errors.Is(err, ErrFormat) || errors.Is(err, checkpoint.ErrMissingTensor), "%v", err)
	// Truncated, or not safetensors at all.
	_, err = ReadSafetensors(good[:len(good)-3], 1)
	assert.ErrorIs(t, err, ErrFormat)
	_, err = ReadSafetensors([]byte("not a safetensors file"), 1)
	assert.ErrorIs(t, err, ErrFormat)
	// A shape that does not fit the rest.
	bad := bytes.Replace(good, []byte(`"transformer.h.0.attn.c_proj.weight":{"dtype":"F32","shape":[2,2]`),
		[]byte(`"transformer.h.0.attn.c_proj.weight":{"dtype":"F32","shape":[1,4]`), 1)
	_, err = ReadSafetensors(bad, 1)
	assert.ErrorIs(t, err, ErrShape)
}
