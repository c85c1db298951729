package transformer

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/nlpodyssey/safetensors"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/train/checkpoint"
)

// Safetensors metadata keys.
const (
	stFormat = "gdist.format"
	stConfig = "gdist.config"
	stVocab  = "gdist.vocab"
	stStep   = "gdist.step"
)

// WriteSafetensors writes ck, a whole model (every parameter of
// ParamNames(ck.Config, 0, ck.Config.HeadLayer()), else an error matching
// checkpoint.ErrMissingTensor), to w in the safetensors format with the
// names above, in the model's dtype (F32 or F64).
func WriteSafetensors(w io.Writer, ck *Checkpoint) error {
	h, err := ck.header()
	if err != nil {
		return err
	}
	views, err := safetensorViews(ck)
	if err != nil {
		return err
	}
	meta := map[string]string{"format": "pt", stFormat: FormatName, stStep: strconv.FormatInt(h.Step, 10)}
	b, err := json.Marshal(h.Model)
	if err != nil {
		return fmt.Errorf("transformer: safetensors: %w", err)
	}
	meta[stConfig] = string(b)
	if h.Vocab != nil {
		if b, err = json.Marshal(h.Vocab); err != nil {
			return fmt.Errorf("transformer: safetensors: %w", err)
		}
		meta[stVocab] = string(b)
	}
	if err := safetensors.SerializeToWriter(views, meta, w); err != nil {
		return fmt.Errorf("transformer: safetensors: %w", err)
	}
	return nil
}

// SaveSafetensors writes ck to path in the safetensors format
// (WriteSafetensors), atomically (checkpoint.WriteFileAtomic).
func SaveSafetensors(path string, ck *Checkpoint) error {
	return checkpoint.WriteFileAtomic(path, func(w io.Writer) error { return WriteSafetensors(w, ck) })
}

// safetensorViews returns the tensors of ck under their safetensors names.
func safetensorViews(ck *Checkpoint) (map[string]safetensors.TensorView, error) {
	cfg := ck.Config
	byName := make(map[string]*tensor.Dense, len(ck.Tensors))
	for _, t := range ck.Tensors {
		d, ok := t.Tensor.(*tensor.Dense)
		if !ok {
			return nil, fmt.Errorf("%w: %q is a %T", ErrShape, t.Name, t.Tensor)
		}
		byName[t.Name] = d
	}
	values := func(name string) ([]float64, error) {
		d, ok := byName[name]
		if !ok {
			return nil, fmt.Errorf("%w: %q", checkpoint.ErrMissingTensor, name)
		}
		want, _ := ParamShape(cfg, name)
		if !d.Shape().Eq(want) {
			return nil, fmt.Errorf("%w: %q is %v, want %v", ErrShape, name, d.Shape(), want)
		}
		return denseFloat64s(d)
	}
	views := make(map[string]safetensors.TensorView)
	add := func(name string, shape []int, v []float64) error {
		tv, err := encodeView(cfg.Dtype, shape, v)
		if err != nil {
			return fmt.Errorf("transformer: safetensors: %q: %w", name, err)
		}
		views[name] = tv
		return nil
	}
	for _, name := range ParamNames(cfg, 0, cfg.HeadLayer()) {
		v, err := values(name)
		if err != nil {
			return nil, err
		}
		shape, _ := ParamShape(cfg, name)
		st, transpose := safetensorName(cfg, name)
		switch {
		case st == "":
			continue // q, k and v go into c_attn below
		case transpose:
			v = transposed(v, shape[0], shape[1])
			shape = tensor.Shape{shape[1], shape[0]}
		}
		if err := add(st, shape, v); err != nil {
			return nil, err
		}
	}
	d := cfg.Dim
	for l := 1; l <= cfg.Layers; l++ {
		qkv := make([]float64, d*3*d)
		for part, s := range []string{"attn.wq", "attn.wk", "attn.wv"} {
			v, err := values(LayerName(l) + "." + s)
			if err != nil {
				return nil, err
			}
			pastePart(qkv, v, d, 3*d, 1, part*d, (part+1)*d)
		}
		p := "h." + strconv.Itoa(l-1) + ".attn.c_attn."
		if err := add(p+"weight", []int{d, 3 * d}, qkv); err != nil {
			return nil, err
		}
		if err := add(p+"bias", []int{3 * d}, make([]float64, 3*d)); err != nil {
			return nil, err
		}
	}
	return views, nil
}

// blockNames maps a block parameter's suffix to its GPT-2 name within h.i;
// q, k and v map to "" (they are joined into c_attn).
var blockNames = map[string]string{
	"ln1.g": "ln_1.weight", "ln1.b": "ln_1.bias",
	"attn.wq": "", "attn.wk": "", "attn.wv": "",
	"attn.wo": "attn.c_proj.weight", "attn.bo": "attn.c_proj.bias",
	"ln2.g": "ln_2.weight", "ln2.b": "ln_2.bias",
	"mlp.w1": "mlp.c_fc.weight", "mlp.b1": "mlp.c_fc.bias",
	"mlp.w2": "mlp.c_proj.weight", "mlp.b2": "mlp.c_proj.bias",
}

// outerNames maps the embedding's and the head's suffixes to GPT-2 names.
var outerNames = map[string]string{
	"tok_emb": "wte.weight", "pos_emb": "wpe.weight",
	"ln.g": "ln_f.weight", "ln.b": "ln_f.bias",
	"head.w": "lm_head.weight", "head.b": "lm_head.bias",
}

// safetensorName returns the safetensors name of parameter name of cfg
// ("" for q, k and v) and whether it is stored transposed.
func safetensorName(cfg Config, name string) (string, bool) {
	l, _ := LayerOf(name)
	_, suffix, _ := strings.Cut(name, ".")
	if l >= 1 && l <= cfg.Layers {
		st := blockNames[suffix]
		if st == "" {
			return "", false
		}
		return "h." + strconv.Itoa(l-1) + "." + st, false
	}
	return outerNames[suffix], suffix == "head.w"
}

// ReadSafetensors reads a model from the bytes of a safetensors file:
// one WriteSafetensors wrote, or another with the names above (a GPT-2-like
// model; a "transformer." prefix, as GPT2LMHeadModel's state dict has, is
// accepted, and the causal-mask buffers attn.bias and attn.masked_bias are
// skipped). The configuration comes from the file's gdist.config; a file
// without it must be given heads (the number of attention heads, which no
// shape tells), and the rest is inferred from the shapes: TiedHead when there
// is no lm_head.weight, zeros for an absent lm_head.bias, Float64 for F64
// data and Float32 for F32, F16 and BF16 (converted). A tensor this model
// cannot hold — a c_attn.bias that is not zero (GPT-2's own), an unknown
// name, a wrong shape — is an error naming it (ErrFormat or ErrShape). The
// result's tensors are new, in ParamNames order.
func ReadSafetensors(data []byte, heads int) (*Checkpoint, error) {
	st, err := safetensors.Deserialize(data)
	if err != nil {
		return nil, fmt.Errorf("%w: safetensors: %w", ErrFormat, err)
	}
	_, header, err := safetensors.ReadMetadata(data) // for __metadata__, which st does not expose
	if err != nil {
		return nil, fmt.Errorf("%w: safetensors: %w", ErrFormat, err)
	}
	views := make(map[string]safetensors.TensorView)
	for _, nv := range st.Tensors() {
		name := strings.TrimPrefix(nv.Name, "transformer.")
		if strings.HasSuffix(name, ".attn.bias") || strings.HasSuffix(name, ".attn.masked_bias") {
			continue // GPT-2's causal-mask buffers
		}
		if _, dup := views[name]; dup {
			return nil, fmt.Errorf("%w: safetensors: %q twice", ErrFormat, name)
		}
		views[name] = nv.TensorView
	}
	meta := header.Metadata()
	ck := &Checkpoint{}
	if js, ok := meta[stConfig]; ok {
		if err := json.Unmarshal([]byte(js), &ck.Config); err != nil {
			return nil, fmt.Errorf("%w: safetensors: %s: %w", ErrFormat, stConfig, err)
		}
	} else if ck.Config, err = inferConfig(views, heads); err != nil {
		return nil, err
	}
	if js, ok := meta[stVocab]; ok {
		ck.Vocab = new(Vocab)
		if err := json.Unmarshal([]byte(js), ck.Vocab); err != nil {
			return nil, fmt.Errorf("%w: safetensors: %s: %w", ErrFormat, stVocab, err)
		}
	}
	if s, ok := meta[stStep]; ok {
		if ck.Step, err = strconv.ParseInt(s, 10, 64); err != nil {
			return nil, fmt.Errorf("%w: safetensors: %s: %w", ErrFormat, stStep, err)
		}
	}
	if _, err := ck.header(); err != nil {
		return nil, err
	}
	if ck.Tensors, err = tensorsFromViews(ck.Config, views); err != nil {
		return nil, err
	}
	return ck, nil
}

// LoadSafetensors reads the safetensors file at path (ReadSafetensors).
func LoadSafetensors(path string, heads int) (*Checkpoint, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("transformer: %w", err)
	}
	return ReadSafetensors(b, heads)
}

var blockRe = regexp.MustCompile(`^h\.(0|[1-9][0-9]*)\.`)

// inferConfig infers a model's configuration from the shapes of a GPT-2-like
// file's tensors.
func inferConfig(views map[string]safetensors.TensorView, heads int) (Config, error) {
	if heads < 1 {
		return Config{}, fmt.Errorf("%w: safetensors: no %s in the file: the number of attention heads must be given", ErrFormat, stConfig)
	}
	shape := func(name string, dims int) ([]int, error) {
		v, ok := views[name]
		if !ok {
			return nil, fmt.Errorf("%w: safetensors: no %q", checkpoint.ErrMissingTensor, name)
		}
		if len(v.Shape()) != dims {
			return nil, fmt.Errorf("%w: safetensors: %q has shape %v", ErrShape, name, v.Shape())
		}
		s := make([]int, dims)
		for i, d := range v.Shape() {
			s[i] = int(d)
		}
		return s, nil
	}
	wte, err := shape("wte.weight", 2)
	if err != nil {
		return Config{}, err
	}
	wpe, err := shape("wpe.weight", 2)
	if err != nil {
		return Config{}, err
	}
	cfg := Config{Vocab: wte[0], Dim: wte[1], Ctx: wpe[0], Heads: heads, MLPHidden: 1, Seed: 1}
	blocks := map[int]bool{}
	for name := range views {
		if m := blockRe.FindStringSubmatch(name); m != nil {
			i, _ := strconv.Atoi(m[1])
			blocks[i] = true
		}
	}
	cfg.Layers = len(blocks)
	for i := range cfg.Layers {
		if !blocks[i] {
			return Config{}, fmt.Errorf("%w: safetensors: blocks %v are not numbered 0..%d", ErrFormat, sortedKeys(blocks), cfg.Layers-1)
		}
	}
	if cfg.Layers > 0 {
		fc, err := shape("h.0.mlp.c_fc.weight", 2)
		if err != nil {
			return Config{}, err
		}
		cfg.MLPHidden = fc[1]
	}
	_, cfg.TiedHead = views["lm_head.weight"]
	cfg.TiedHead = !cfg.TiedHead
	switch views["wte.weight"].DType() {
	case safetensors.F64:
		cfg.Dtype = Float64
	case safetensors.F32, safetensors.F16, safetensors.BF16:
		cfg.Dtype = Float32
	default:
		return Config{}, fmt.Errorf("%w: safetensors: wte.weight is %v", ErrFormat, views["wte.weight"].DType())
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

func sortedKeys(m map[int]bool) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}

// tensorsFromViews returns cfg's parameters from the file's tensors, which
// must be exactly those WriteSafetensors writes for cfg (lm_head.bias may be
// absent).
func tensorsFromViews(cfg Config, views map[string]safetensors.TensorView) ([]checkpoint.Named, error) {
	used := map[string]bool{}
	get := func(name string, shape ...int) ([]float64, error) {
		v, ok := views[name]
		if !ok {
			return nil, fmt.Errorf("%w: safetensors: no %q", checkpoint.ErrMissingTensor, name)
		}
		used[name] = true
		if len(v.Shape()) != len(shape) {
			return nil, fmt.Errorf("%w: safetensors: %q is %v, want %v", ErrShape, name, v.Shape(), shape)
		}
		for i, d := range v.Shape() {
			if int(d) != shape[i] {
				return nil, fmt.Errorf("%w: safetensors: %q is %v, want %v", ErrShape, name, v.Shape(), shape)
			}
		}
		vals, err := decodeView(v)
		if err != nil {
			return nil, fmt.Errorf("%w: safetensors: %q: %w", ErrFormat, name, err)
		}
		return vals, nil
	}
	d := cfg.Dim
	var out []checkpoint.Named
	for _, name := range ParamNames(cfg, 0, cfg.HeadLayer()) {
		shape, _ := ParamShape(cfg, name)
		st, transpose := safetensorName(cfg, name)
		var v []float64
		var err error
		switch {
		case st == "":
			// attn.wq, wk or wv: a third of c_attn's columns.
			l, _ := LayerOf(name)
			var qkv []float64
			if qkv, err = get("h."+strconv.Itoa(l-1)+".attn.c_attn.weight", d, 3*d); err != nil {
				return nil, err
			}
			part := strings.Index("qkv", name[len(name)-1:])
			v = make([]float64, d*d)
			copyPart(v, qkv, d, 3*d, 1, part*d, (part+1)*d)
		case transpose:
			if v, err = get(st, shape[1], shape[0]); err == nil {
				v = transposed(v, shape[1], shape[0])
			}
		case st == "lm_head.bias" && !hasView(views, st):
			v = make([]float64, shape[0])
		default:
			v, err = get(st, shape...)
		}
		if err != nil {
			return nil, err
		}
		out = append(out, checkpoint.Named{Name: name, Tensor: newDense(cfg.Dtype, shape, v)})
	}
	for l := 1; l <= cfg.Layers; l++ {
		name := "h." + strconv.Itoa(l-1) + ".attn.c_attn.bias"
		b, err := get(name, 3*d)
		if err != nil {
			return nil, err
		}
		for i, x := range b {
			if x != 0 {
				return nil, fmt.Errorf("%w: safetensors: %q[%d] is %v: this model's q, k and v have no bias", ErrFormat, name, i, x)
			}
		}
	}
	var extra []string
	for name := range views {
		if !used[name] {
			extra = append(extra, name)
		}
	}
	if len(extra) > 0 {
		sort.Strings(extra)
		return nil, fmt.Errorf("%w: safetensors: tensors %q have no place in this model", ErrFormat, extra)
	}
	return out, nil
}

func hasView(views map[string]safetensors.TensorView, name string) bool {
	_, ok := views[name]
	return ok
}

// newDense returns a tensor of dt holding v.
func newDense(dt Dtype, shape tensor.Shape, v []float64) *tensor.Dense {
	var back any = v
	if dt == Float32 {
		f := make([]float32, len(v))
		for i, x := range v {
			f[i] = float32(x)
		}
		back = f
	}
	return tensor.New(tensor.WithShape(shape.Clone()...), tensor.WithBacking(back))
}

// denseFloat64s returns the values of a float32 or float64 tensor.
func denseFloat64s(d *tensor.Dense) ([]float64, error) {
	if d.IsView() {
		d = d.Materialize().(*tensor.Dense)
	}
	switch x := d.Data().(type) {
	case []float32:
		out := make([]float64, len(x))
		for i, f := range x {
			out[i] = float64(f)
		}
		return out, nil
	case []float64:
		return append([]float64(nil), x...), nil
	}
	return nil, fmt.Errorf("%w: data of type %T", ErrShape, d.Data())
}

// transposed returns the transpose of the rows x cols matrix v.
func transposed(v []float64, rows, cols int) []float64 {
	out := make([]float64, len(v))
	for r := range rows {
		for c := range cols {
			out[c*rows+r] = v[r*cols+c]
		}
	}
	return out
}

// encodeView returns v as a little-endian F32 or F64 tensor view.
func encodeView(dt Dtype, shape []int, v []float64) (safetensors.TensorView, error) {
	dims := make([]uint64, len(shape))
	for i, d := range shape {
		dims[i] = uint64(d)
	}
	if dt == Float64 {
		b := make([]byte, 8*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(x))
		}
		return safetensors.NewTensorView(safetensors.F64, dims, b)
	}
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(x)))
	}
	return safetensors.NewTensorView(safetensors.F32, dims, b)
}

// errDType is the error of a tensor of a dtype that is not a float.
var errDType = errors.New("not a floating-point dtype")

// decodeView returns the values of a F64, F32, F16 or BF16 tensor.
func decodeView(v safetensors.TensorView) ([]float64, error) {
	b := v.Data()
	switch v.DType() {
	case safetensors.F64:
		out := make([]float64, len(b)/8)
		for i := range out {
			out[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
		}
		return out, nil
	case safetensors.F32:
		out := make([]float64, len(b)/4)
		for i := range out {
			out[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
		}
		return out, nil
	case safetensors.F16, safetensors.BF16:
		out := make([]float64, len(b)/2)
		for i := range out {
			h := binary.LittleEndian.Uint16(b[2*i:])
			if v.DType() == safetensors.BF16 {
				out[i] = float64(math.Float32frombits(uint32(h) << 16))
			} else {
				out[i] = halfToFloat(h)
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("%w: %v", errDType, v.DType())
}

// halfToFloat returns the value of an IEEE 754 binary16 number.
func halfToFloat(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp, mant := int(h>>10)&0x1f, float64(h&0x3ff)
	switch exp {
	case 0: // zero or subnormal: mant · 2^-24
		return sign * math.Ldexp(mant, -24)
	case 0x1f:
		if mant != 0 {
			return math.NaN()
		}
		return sign * math.Inf(1)
	}
	return sign * math.Ldexp(1024+mant, exp-25)
}
