package transformer_test

import (
	"context"
	"encoding/json"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/models/transformer"
	"github.com/gdist/gdist/train/checkpoint"
)

// graphMu serialises graph construction in tests (Gorgonia's graph building
// is not goroutine-safe).
var graphMu sync.Mutex

func tinyConfig(dt transformer.Dtype) transformer.Config {
	return transformer.Config{Vocab: 7, Ctx: 6, Dim: 8, Heads: 2, Layers: 2, MLPHidden: 12, Dtype: dt, Seed: 42}
}

func randomIDs(rng *rand.Rand, n, vocab int) []int {
	ids := make([]int, n)
	for i := range ids {
		ids[i] = rng.IntN(vocab)
	}
	return ids
}

// runner is a forward (optionally backward) graph over one stage.
type runner struct {
	st     *transformer.Stage
	in     *gorgonia.Node
	out    *gorgonia.Node
	tgt    *gorgonia.Node
	loss   *gorgonia.Node
	inGrad *gorgonia.Node // d loss / d in (when requested)
	vm     gorgonia.VM
}

type runnerOpts struct {
	loss      bool // last stage: add cross-entropy (needs targets)
	surrogate bool // non-last stage: add Surrogate(out, outGrad) as the loss
	inGrad    bool // also differentiate with respect to the input
}

func newRunner(t *testing.T, cfg transformer.Config, from, to, batch int, o runnerOpts) (*runner, *gorgonia.Node) {
	t.Helper()
	graphMu.Lock()
	defer graphMu.Unlock()
	g := gorgonia.NewGraph()
	st, err := transformer.NewStage(g, cfg, from, to, batch)
	require.NoError(t, err)
	r := &runner{st: st, in: st.NewInput("in")}
	r.out, err = st.Forward(r.in)
	require.NoError(t, err)
	var outGrad *gorgonia.Node
	switch {
	case o.loss:
		r.tgt = st.NewTargets("targets")
		r.loss, err = transformer.CrossEntropy(r.out, r.tgt)
		require.NoError(t, err)
	case o.surrogate:
		outGrad = gorgonia.NewMatrix(g, cfg.Dtype.Tensor(), gorgonia.WithShape(st.OutputShape()...), gorgonia.WithName("out_grad"),
			gorgonia.WithValue(tensor.New(tensor.Of(cfg.Dtype.Tensor()), tensor.WithShape(st.OutputShape()...))))
		r.loss, err = transformer.Surrogate(r.out, outGrad)
		require.NoError(t, err)
	}
	var opts []gorgonia.VMOpt
	if r.loss != nil {
		wrt := st.Learnables()
		if o.inGrad {
			wrt = append(wrt, r.in)
		}
		grads, err := gorgonia.Grad(r.loss, wrt...)
		require.NoError(t, err)
		if o.inGrad {
			r.inGrad = grads[len(grads)-1]
		}
		opts = append(opts, gorgonia.BindDualValues(st.Learnables()...))
	}
	r.vm = gorgonia.NewTapeMachine(g, opts...)
	t.Cleanup(func() { r.vm.Close() })
	return r, outGrad
}

func (r *runner) setInputIDs(t *testing.T, ids []int) {
	t.Helper()
	require.NoError(t, transformer.FillOneHot(r.in.Value().(*tensor.Dense), ids))
}

func (r *runner) setTargets(t *testing.T, ids []int) {
	t.Helper()
	require.NoError(t, transformer.FillOneHot(r.tgt.Value().(*tensor.Dense), ids))
}

func setValue(t *testing.T, n *gorgonia.Node, vals []float64) {
	t.Helper()
	switch d := n.Value().Data().(type) {
	case []float32:
		require.Len(t, vals, len(d))
		for i, v := range vals {
			d[i] = float32(v)
		}
	case []float64:
		require.Len(t, vals, len(d))
		copy(d, vals)
	}
}

func values(t *testing.T, n *gorgonia.Node) []float64 {
	t.Helper()
	v, err := transformer.Float64s(n)
	require.NoError(t, err)
	return v
}

// run executes the machine once and returns copies of the requested nodes.
func (r *runner) run(t *testing.T, nodes ...*gorgonia.Node) [][]float64 {
	t.Helper()
	require.NoError(t, r.vm.RunAll())
	defer r.vm.Reset()
	out := make([][]float64, len(nodes))
	for i, n := range nodes {
		out[i] = values(t, n)
	}
	return out
}

func TestConfig(t *testing.T) {
	cfg := transformer.DefaultConfig(80)
	require.NoError(t, cfg.Validate())
	assert.Equal(t, 4, cfg.NumLayers())
	assert.Equal(t, 3, cfg.HeadLayer())
	assert.Equal(t, 16, cfg.HeadDim())

	b, err := json.Marshal(cfg)
	require.NoError(t, err)
	assert.Contains(t, string(b), `"dtype":"float32"`)
	var back transformer.Config
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Equal(t, cfg, back)

	bad := []func(c *transformer.Config){
		func(c *transformer.Config) { c.Vocab = 1 },
		func(c *transformer.Config) { c.Ctx = 1 },
		func(c *transformer.Config) { c.Heads = 3 },
		func(c *transformer.Config) { c.Layers = -1 },
		func(c *transformer.Config) { c.MLPHidden = 0 },
		func(c *transformer.Config) { c.Dtype = 7 },
	}
	for i, f := range bad {
		c := cfg
		f(&c)
		assert.ErrorIs(t, c.Validate(), transformer.ErrInvalidArgument, "case %d", i)
	}
	assert.Error(t, json.Unmarshal([]byte(`{"dtype":"float16"}`), &back))
}

func TestVocab(t *testing.T) {
	v := transformer.NewVocab("hello, wörld")
	assert.Equal(t, []rune(" ,dehlorw\u00f6"), v.Runes())
	assert.Equal(t, 10, v.Size())
	ids, err := v.Encode("wörld hello")
	require.NoError(t, err)
	assert.Equal(t, "wörld hello", v.Decode(ids))
	_, err = v.Encode("hello!")
	assert.ErrorIs(t, err, transformer.ErrUnknownRune)
	assert.Equal(t, "\uFFFD", v.Decode([]int{99}))

	b, err := json.Marshal(v)
	require.NoError(t, err)
	var back transformer.Vocab
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Equal(t, v.Runes(), back.Runes())
	id, ok := back.ID('ö')
	assert.True(t, ok)
	assert.Equal(t, 9, id)

	_, err = transformer.VocabFromRunes([]rune("aba"))
	assert.ErrorIs(t, err, transformer.ErrInvalidArgument)
}

func TestNames(t *testing.T) {
	cfg := tinyConfig(transformer.Float32)
	names := transformer.ParamNames(cfg, 0, cfg.HeadLayer())
	assert.Equal(t, []string{"layer00.tok_emb", "layer00.pos_emb"}, names[:2])
	assert.Contains(t, names, "layer01.attn.wq")
	assert.Contains(t, names, "layer02.mlp.w2")
	assert.Equal(t, []string{"layer03.ln.g", "layer03.ln.b", "layer03.head.w", "layer03.head.b"}, names[len(names)-4:])
	for _, n := range names {
		l, ok := transformer.LayerOf(n)
		require.True(t, ok, n)
		assert.True(t, strings.HasPrefix(n, transformer.LayerName(l)+"."))
	}
	for _, bad := range []string{"foo", "layer", "layerx.a", "layer1.a", "layer01", "layer-1.x"} {
		_, ok := transformer.LayerOf(bad)
		assert.False(t, ok, bad)
	}
	l, ok := transformer.LayerOf("layer123.mlp.w1")
	assert.True(t, ok)
	assert.Equal(t, 123, l)

	cfg.TiedHead = true
	names = transformer.ParamNames(cfg, cfg.HeadLayer(), cfg.HeadLayer())
	assert.Equal(t, []string{"layer03.ln.g", "layer03.ln.b", "layer03.head.b"}, names)
}

func TestShapes(t *testing.T) {
	cfg := tinyConfig(transformer.Float32)
	const batch = 3
	rows := batch * cfg.Ctx
	total := 0
	for _, rg := range [][2]int{{0, 3}, {0, 0}, {1, 2}, {2, 3}, {3, 3}, {0, 1}} {
		r, _ := newRunner(t, cfg, rg[0], rg[1], batch, runnerOpts{})
		st := r.st
		wantIn := tensor.Shape{rows, cfg.Dim}
		if rg[0] == 0 {
			wantIn = tensor.Shape{rows, cfg.Vocab}
		}
		wantOut := tensor.Shape{rows, cfg.Dim}
		if rg[1] == 3 {
			wantOut = tensor.Shape{rows, cfg.Vocab}
		}
		assert.Equal(t, wantIn, st.InputShape(), "%v", rg)
		assert.Equal(t, wantOut, st.OutputShape(), "%v", rg)
		assert.Equal(t, wantOut, r.out.Shape(), "%v", rg)
		assert.Equal(t, rg[0] == 0, st.IsFirst())
		assert.Equal(t, rg[1] == 3, st.IsLast())
		assert.Equal(t, transformer.ParamNames(cfg, rg[0], rg[1]), st.Names())
		for _, n := range st.Learnables() {
			l, ok := transformer.LayerOf(n.Name())
			require.True(t, ok)
			assert.True(t, l >= rg[0] && l <= rg[1], n.Name())
		}
		if rg == [2]int{0, 3} {
			for _, n := range st.Learnables() {
				total += n.Shape().TotalSize()
			}
		}
		if rg[0] == 0 {
			r.setInputIDs(t, randomIDs(rand.New(rand.NewPCG(1, 1)), rows, cfg.Vocab))
		}
		out := r.run(t, r.out)[0]
		assert.Len(t, out, wantOut.TotalSize())
		for _, v := range out {
			require.False(t, math.IsNaN(v) || math.IsInf(v, 0))
		}
	}
	assert.Equal(t, cfg.NumParams(), total)
	d, v, c, h, m := 8, 7, 6, 12, 12
	_ = h
	want := v*d + c*d + 2*(2*d+4*d*d+d+2*d+d*m+m+m*d+d) + 2*d + d*v + v
	assert.Equal(t, want, total)
}

func TestStageErrors(t *testing.T) {
	cfg := tinyConfig(transformer.Float32)
	g := gorgonia.NewGraph()
	graphMu.Lock()
	defer graphMu.Unlock()
	_, err := transformer.NewStage(g, cfg, 2, 1, 1)
	assert.ErrorIs(t, err, transformer.ErrLayerRange)
	_, err = transformer.NewStage(g, cfg, 0, 4, 1)
	assert.ErrorIs(t, err, transformer.ErrLayerRange)
	_, err = transformer.NewStage(g, cfg, 0, 1, 0)
	assert.ErrorIs(t, err, transformer.ErrShape)
	bad := cfg
	bad.Heads = 3
	_, err = transformer.NewStage(g, bad, 0, 1, 1)
	assert.ErrorIs(t, err, transformer.ErrInvalidArgument)

	st, err := transformer.NewStage(g, cfg, 1, 2, 2)
	require.NoError(t, err)
	wrong := gorgonia.NewMatrix(g, tensor.Float32, gorgonia.WithShape(12, 7), gorgonia.WithName("wrong"))
	_, err = st.Forward(wrong)
	assert.ErrorIs(t, err, transformer.ErrShape)

	tied := cfg
	tied.TiedHead = true
	for _, rg := range [][2]int{{0, 2}, {1, 3}, {3, 3}, {0, 0}} {
		_, err = transformer.NewStage(gorgonia.NewGraph(), tied, rg[0], rg[1], 1)
		assert.ErrorIs(t, err, transformer.ErrTiedSplit, "%v", rg)
	}
	for _, rg := range [][2]int{{0, 3}, {1, 2}, {2, 2}} {
		_, err = transformer.NewStage(gorgonia.NewGraph(), tied, rg[0], rg[1], 1)
		assert.NoError(t, err, "%v", rg)
	}
}

func TestDeterministicInit(t *testing.T) {
	// A stage's parameters equal the full model's, whatever the range.
	cfg := tinyConfig(transformer.Float32)
	full, _ := newRunner(t, cfg, 0, 3, 1, runnerOpts{})
	part, _ := newRunner(t, cfg, 2, 2, 4, runnerOpts{})
	for _, n := range part.st.Learnables() {
		assert.Equal(t, full.st.Param(n.Name()).Value().Data(), n.Value().Data(), n.Name())
	}
	other := cfg
	other.Seed++
	diff, _ := newRunner(t, other, 2, 2, 1, runnerOpts{})
	assert.NotEqual(t, part.st.Param("layer02.attn.wq").Value().Data(), diff.st.Param("layer02.attn.wq").Value().Data())
}

func TestCausal(t *testing.T) {
	for _, dt := range []transformer.Dtype{transformer.Float32, transformer.Float64} {
		cfg := tinyConfig(dt)
		const batch = 2
		r, _ := newRunner(t, cfg, 0, cfg.HeadLayer(), batch, runnerOpts{})
		rng := rand.New(rand.NewPCG(7, 7))
		ids := randomIDs(rng, batch*cfg.Ctx, cfg.Vocab)
		r.setInputIDs(t, ids)
		base := r.run(t, r.out)[0]
		V := cfg.Vocab
		for pos := 0; pos < cfg.Ctx; pos++ {
			changed := append([]int(nil), ids...)
			changed[pos] = (changed[pos] + 1) % V // sequence 0, position pos
			r.setInputIDs(t, changed)
			got := r.run(t, r.out)[0]
			for row := 0; row < batch*cfg.Ctx; row++ {
				a, b := base[row*V:(row+1)*V], got[row*V:(row+1)*V]
				switch {
				case row < pos || row >= cfg.Ctx: // earlier positions, or the other sequence
					require.Equal(t, a, b, "%v: changing position %d changed row %d", dt, pos, row)
				case row == pos:
					require.NotEqual(t, a, b, "%v: changing position %d did not change its own row", dt, pos)
				}
			}
		}
	}
}

// TestGradCheck compares the analytic gradient of every parameter (and of
// the input of a later stage) with central differences on a tiny float64
// model.
func TestGradCheck(t *testing.T) {
	cfg := transformer.Config{Vocab: 5, Ctx: 4, Dim: 4, Heads: 2, Layers: 1, MLPHidden: 6, Dtype: transformer.Float64, Seed: 5}
	// Larger weights than the default init so every path matters.
	const batch = 2
	r, _ := newRunner(t, cfg, 0, cfg.HeadLayer(), batch, runnerOpts{loss: true})
	rng := rand.New(rand.NewPCG(3, 3))
	for _, n := range r.st.Learnables() {
		d := n.Value().Data().([]float64)
		for i := range d {
			d[i] += rng.NormFloat64() * 0.5
		}
	}
	r.setInputIDs(t, randomIDs(rng, batch*cfg.Ctx, cfg.Vocab))
	r.setTargets(t, randomIDs(rng, batch*cfg.Ctx, cfg.Vocab))

	lossOf := func() float64 {
		require.NoError(t, r.vm.RunAll())
		defer r.vm.Reset()
		l, err := transformer.ScalarValue(r.loss)
		require.NoError(t, err)
		return l
	}
	require.NoError(t, r.vm.RunAll())
	analytic := map[string][]float64{}
	for _, n := range r.st.Learnables() {
		g, err := n.Grad()
		require.NoError(t, err, n.Name())
		analytic[n.Name()] = append([]float64(nil), g.Data().([]float64)...)
	}
	r.vm.Reset()

	const eps = 1e-6
	checked := 0
	for _, n := range r.st.Learnables() {
		d := n.Value().Data().([]float64)
		for i := range d {
			orig := d[i]
			d[i] = orig + eps
			up := lossOf()
			d[i] = orig - eps
			down := lossOf()
			d[i] = orig
			num := (up - down) / (2 * eps)
			an := analytic[n.Name()][i]
			require.InDelta(t, num, an, 1e-6+1e-4*math.Abs(num), "%s[%d]: numeric %g analytic %g", n.Name(), i, num, an)
			checked++
		}
	}
	assert.Equal(t, cfg.NumParams(), checked)
}

// TestStageSplitBitwise runs layers 0..k and k+1..L+1 as separate graphs,
// copying the hidden states between them, and requires the exact logits of
// the full model; it also checks that the gradients are bitwise equal when
// the second stage sends d loss / d hidden back to the first through
// Surrogate.
func TestStageSplitBitwise(t *testing.T) {
	for _, dt := range []transformer.Dtype{transformer.Float32, transformer.Float64} {
		cfg := tinyConfig(dt)
		cfg.Layers = 3
		const batch = 2
		rng := rand.New(rand.NewPCG(11, 11))
		ids := randomIDs(rng, batch*cfg.Ctx, cfg.Vocab)
		tgts := randomIDs(rng, batch*cfg.Ctx, cfg.Vocab)

		full, _ := newRunner(t, cfg, 0, cfg.HeadLayer(), batch, runnerOpts{loss: true})
		full.setInputIDs(t, ids)
		full.setTargets(t, tgts)
		require.NoError(t, full.vm.RunAll())
		wantLogits := values(t, full.out)
		wantLoss, err := transformer.ScalarValue(full.loss)
		require.NoError(t, err)
		wantGrads := map[string][]float64{}
		for _, n := range full.st.Learnables() {
			g, err := n.Grad()
			require.NoError(t, err)
			wantGrads[n.Name()] = toF64(g.Data())
		}
		full.vm.Reset()

		for k := 0; k < cfg.HeadLayer(); k++ {
			a, aGrad := newRunner(t, cfg, 0, k, batch, runnerOpts{surrogate: true})
			b, _ := newRunner(t, cfg, k+1, cfg.HeadLayer(), batch, runnerOpts{loss: true, inGrad: true})
			// Forward: stage a, copy hidden states, stage b.
			a.setInputIDs(t, ids)
			require.NoError(t, a.vm.RunAll())
			hidden := values(t, a.out)
			setValue(t, b.in, hidden)
			b.setTargets(t, tgts)
			require.NoError(t, b.vm.RunAll())
			gotLogits := values(t, b.out)
			require.Equal(t, wantLogits, gotLogits, "%v split after layer %d: logits differ", dt, k)
			gotLoss, err := transformer.ScalarValue(b.loss)
			require.NoError(t, err)
			require.Equal(t, wantLoss, gotLoss)

			// Backward: b's input gradient drives a's surrogate. Stage a's
			// forward values are recomputed on the second run.
			dHidden := values(t, b.inGrad)
			for _, n := range b.st.Learnables() {
				g, err := n.Grad()
				require.NoError(t, err)
				require.Equal(t, wantGrads[n.Name()], toF64(g.Data()), "%v k=%d %s", dt, k, n.Name())
			}
			b.vm.Reset()
			a.vm.Reset()
			setValue(t, aGrad, dHidden)
			require.NoError(t, a.vm.RunAll())
			for _, n := range a.st.Learnables() {
				g, err := n.Grad()
				require.NoError(t, err)
				// Surrogate's gradient with respect to out is exactly
				// dHidden, so the gradients are bitwise equal too.
				require.Equal(t, wantGrads[n.Name()], toF64(g.Data()), "%v k=%d %s", dt, k, n.Name())
			}
			a.vm.Reset()
		}
	}
}

func toF64(data any) []float64 {
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
	return nil
}

func TestOverfit(t *testing.T) {
	text := "the quick brown fox jumps over the lazy dog. "
	vocab := transformer.NewVocab(text)
	data, err := vocab.Encode(strings.Repeat(text, 4))
	require.NoError(t, err)
	cfg := transformer.Config{Vocab: vocab.Size(), Ctx: 16, Dim: 32, Heads: 4, Layers: 1, MLPHidden: 64, Seed: 1}
	tr, err := transformer.NewTrainer(cfg, 4, transformer.WithLearnRate(1e-2))
	require.NoError(t, err)
	defer tr.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	ctx := context.Background()
	var first, last float64
	for i := range 60 {
		in, tg, err := transformer.SampleBatch(rng, data, 4, cfg.Ctx)
		require.NoError(t, err)
		loss, err := tr.Step(ctx, in, tg)
		require.NoError(t, err)
		if i == 0 {
			first = loss
		}
		last = loss
	}
	t.Logf("loss %.3f -> %.3f after %d steps", first, last, tr.Steps())
	assert.InDelta(t, math.Log(float64(cfg.Vocab)), first, 0.3, "initial loss is about ln(vocab)")
	assert.Less(t, last, first/3)

	// Greedy generation reproduces the memorised text.
	p, err := transformer.NewPredictor(cfg, tr.Weights())
	require.NoError(t, err)
	defer p.Close()
	prompt, err := vocab.Encode("the quick ")
	require.NoError(t, err)
	out, err := transformer.Generate(ctx, p, prompt, 30, 0, 0)
	require.NoError(t, err)
	t.Logf("generated %q", vocab.Decode(out))
	assert.Equal(t, "brown", vocab.Decode(out)[:5], "generated %q", vocab.Decode(out))
}

func TestSample(t *testing.T) {
	logits := []float64{1, 3, 3, -2}
	assert.Equal(t, 1, transformer.Sample(logits, 0, nil))
	assert.Equal(t, 1, transformer.Sample(logits, 0, transformer.NewRNG(1)))
	assert.Equal(t, 0, transformer.Sample([]float64{5}, 1, transformer.NewRNG(1)))

	// Same seed, same choices; frequencies follow softmax(logits/T).
	a, b := transformer.NewRNG(9), transformer.NewRNG(9)
	counts := make([]int, len(logits))
	const n = 20000
	for range n {
		x := transformer.Sample(logits, 1, a)
		require.Equal(t, x, transformer.Sample(logits, 1, b))
		counts[x]++
	}
	var z float64
	for _, l := range logits {
		z += math.Exp(l)
	}
	for i, l := range logits {
		assert.InDelta(t, math.Exp(l)/z, float64(counts[i])/n, 0.015, "token %d", i)
	}
	// Low temperature is nearly greedy.
	cold := transformer.NewRNG(1)
	for range 100 {
		x := transformer.Sample([]float64{0, 10, 1}, 0.05, cold)
		require.Equal(t, 1, x)
	}
}

// fakeRunner records the windows it sees and returns logits favouring
// (last token + 1) mod vocab.
type fakeRunner struct {
	block, vocab int
	windows      [][]int
}

func (f *fakeRunner) BlockSize() int { return f.block }
func (f *fakeRunner) Logits(_ context.Context, w []int) ([]float64, error) {
	f.windows = append(f.windows, append([]int(nil), w...))
	l := make([]float64, f.vocab)
	l[(w[len(w)-1]+1)%f.vocab] = 5
	return l, nil
}

func TestGenerate(t *testing.T) {
	ctx := context.Background()
	f := &fakeRunner{block: 3, vocab: 5}
	out, err := transformer.Generate(ctx, f, []int{0}, 6, 0, 0)
	require.NoError(t, err)
	assert.Equal(t, []int{1, 2, 3, 4, 0, 1}, out)
	assert.Equal(t, []int{0}, f.windows[0])
	assert.Equal(t, []int{0, 1, 2}, f.windows[2])
	assert.Equal(t, []int{3, 4, 0}, f.windows[5], "window slides over the last BlockSize tokens")

	_, err = transformer.Generate(ctx, f, nil, 3, 0, 0)
	assert.ErrorIs(t, err, transformer.ErrEmptyPrompt)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = transformer.Generate(cctx, f, []int{1}, 3, 0, 0)
	assert.ErrorIs(t, err, context.Canceled)

	// Real model: same seed, same text; sampling is reproducible.
	cfg := tinyConfig(transformer.Float32)
	p, err := transformer.NewPredictor(cfg, nil)
	require.NoError(t, err)
	defer p.Close()
	a, err := transformer.Generate(ctx, p, []int{1, 2}, 15, 1.0, 77)
	require.NoError(t, err)
	b, err := transformer.Generate(ctx, p, []int{1, 2}, 15, 1.0, 77)
	require.NoError(t, err)
	assert.Equal(t, a, b)
	assert.Len(t, a, 15)
	for _, id := range a {
		assert.True(t, id >= 0 && id < cfg.Vocab)
	}

	// Predictor.Logits equals the corresponding row of a batch forward pass.
	r, _ := newRunner(t, cfg, 0, cfg.HeadLayer(), 1, runnerOpts{})
	window := []int{3, 1, 4}
	padded := make([]int, cfg.Ctx)
	copy(padded, window)
	r.setInputIDs(t, padded)
	all := r.run(t, r.out)[0]
	got, err := p.Logits(ctx, window)
	require.NoError(t, err)
	assert.Equal(t, all[2*cfg.Vocab:3*cfg.Vocab], got)
	_, err = p.Logits(ctx, make([]int, cfg.Ctx+1))
	assert.ErrorIs(t, err, transformer.ErrShape)
	_, err = p.Logits(ctx, []int{cfg.Vocab})
	assert.ErrorIs(t, err, transformer.ErrToken)
}

func TestCheckpoint(t *testing.T) {
	text := "abcabcabd"
	vocab := transformer.NewVocab(text)
	cfg := tinyConfig(transformer.Float32)
	cfg.Vocab = vocab.Size()
	tr, err := transformer.NewTrainer(cfg, 2)
	require.NoError(t, err)
	defer tr.Close()
	data, err := vocab.Encode(text + text)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(1, 1))
	for range 3 {
		in, tg, err := transformer.SampleBatch(rng, data, 2, cfg.Ctx)
		require.NoError(t, err)
		_, err = tr.Step(context.Background(), in, tg)
		require.NoError(t, err)
	}
	path := filepath.Join(t.TempDir(), "m.ckpt")
	require.NoError(t, transformer.Save(path, &transformer.Checkpoint{Config: cfg, Vocab: vocab, Step: 3, Tensors: tr.Weights()}))

	ck, err := transformer.Load(path)
	require.NoError(t, err)
	assert.Equal(t, cfg, ck.Config)
	assert.Equal(t, vocab.Runes(), ck.Vocab.Runes())
	assert.Equal(t, int64(3), ck.Step)
	assert.Len(t, ck.Tensors, len(transformer.ParamNames(cfg, 0, cfg.HeadLayer())))

	// A model loaded from the checkpoint computes exactly what the trained
	// one does.
	p1, err := transformer.NewPredictor(cfg, tr.Weights())
	require.NoError(t, err)
	defer p1.Close()
	p2, err := transformer.NewPredictor(ck.Config, ck.Tensors)
	require.NoError(t, err)
	defer p2.Close()
	l1, err := p1.Forward(context.Background(), []int{0, 1, 2, 3})
	require.NoError(t, err)
	l2, err := p2.Forward(context.Background(), []int{0, 1, 2, 3})
	require.NoError(t, err)
	assert.Equal(t, l1, l2)

	// A float64 model can load float32 weights.
	c64 := cfg
	c64.Dtype = transformer.Float64
	p3, err := transformer.NewPredictor(c64, ck.Tensors)
	require.NoError(t, err)
	defer p3.Close()

	// Subset: only layers 1..2.
	sub, err := transformer.LoadLayers(path, 1, 2)
	require.NoError(t, err)
	var names []string
	for _, nt := range sub.Tensors {
		names = append(names, nt.Name)
	}
	assert.Equal(t, transformer.ParamNames(cfg, 1, 2), names)
	st, err := transformer.NewStage(gorgonia.NewGraph(), cfg, 1, 2, 1)
	require.NoError(t, err)
	require.NoError(t, st.SetWeights(sub.Tensors))
	assert.Equal(t, tr.Stage.Param("layer02.mlp.w1").Value().Data(), st.Param("layer02.mlp.w1").Value().Data())
	head, err := transformer.LoadLayers(path, cfg.HeadLayer(), -1)
	require.NoError(t, err)
	assert.Len(t, head.Tensors, 4)

	// Missing tensors are reported.
	st0, err := transformer.NewStage(gorgonia.NewGraph(), cfg, 0, 2, 1)
	require.NoError(t, err)
	assert.ErrorIs(t, st0.SetWeights(sub.Tensors), checkpoint.ErrMissingTensor)
	partial := filepath.Join(t.TempDir(), "partial.ckpt")
	require.NoError(t, transformer.Save(partial, &transformer.Checkpoint{Config: cfg, Tensors: sub.Tensors}))
	_, err = transformer.Load(partial)
	assert.ErrorIs(t, err, checkpoint.ErrMissingTensor)
	_, err = transformer.LoadLayers(partial, 1, 2)
	assert.NoError(t, err)
	_, err = transformer.LoadLayers(partial, 0, 1)
	assert.ErrorIs(t, err, checkpoint.ErrMissingTensor)
	_, err = transformer.LoadLayers(path, 2, 9)
	assert.ErrorIs(t, err, transformer.ErrLayerRange)

	// Shape mismatch.
	wrong := cfg
	wrong.Dim = 4
	wrong.Heads = 2
	_, err = transformer.NewPredictor(wrong, ck.Tensors)
	assert.ErrorIs(t, err, transformer.ErrShape)

	// Not a transformer checkpoint.
	other := filepath.Join(t.TempDir(), "other.ckpt")
	require.NoError(t, checkpoint.Save(other, map[string]string{"format": "mlp"}, nil))
	_, err = transformer.Load(other)
	assert.ErrorIs(t, err, transformer.ErrFormat)

	// Vocabulary and config must agree.
	err = transformer.Save(path, &transformer.Checkpoint{Config: cfg, Vocab: transformer.NewVocab("xy"), Tensors: tr.Weights()})
	assert.ErrorIs(t, err, transformer.ErrInvalidArgument)
}

func TestTiedHead(t *testing.T) {
	cfg := tinyConfig(transformer.Float64)
	cfg.TiedHead = true
	tr, err := transformer.NewTrainer(cfg, 2, transformer.WithLearnRate(1e-2))
	require.NoError(t, err)
	defer tr.Close()
	assert.Nil(t, tr.Stage.Param("layer03.head.w"))
	data := []int{0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6}
	rng := rand.New(rand.NewPCG(1, 1))
	var first, last float64
	for i := range 30 {
		in, tg, err := transformer.SampleBatch(rng, data, 2, cfg.Ctx)
		require.NoError(t, err)
		last, err = tr.Step(context.Background(), in, tg)
		require.NoError(t, err)
		if i == 0 {
			first = last
		}
	}
	assert.Less(t, last, first/2)
}

func TestOneHotAndBatches(t *testing.T) {
	oh, err := transformer.OneHot([]int{2, 0}, 3, transformer.Float64)
	require.NoError(t, err)
	assert.Equal(t, []float64{0, 0, 1, 1, 0, 0}, oh.Data())
	_, err = transformer.OneHot([]int{3}, 3, transformer.Float32)
	assert.ErrorIs(t, err, transformer.ErrToken)
	assert.ErrorIs(t, transformer.FillOneHot(oh, []int{1}), transformer.ErrShape)

	data := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
	in, tg, err := transformer.SampleBatch(rand.New(rand.NewPCG(1, 1)), data, 3, 4)
	require.NoError(t, err)
	require.Len(t, in, 12)
	for i := range in {
		assert.Equal(t, in[i]+1, tg[i])
	}
	for b := range 3 {
		for j := 1; j < 4; j++ {
			assert.Equal(t, in[b*4]+j, in[b*4+j])
		}
	}
	_, _, err = transformer.SampleBatch(rand.New(rand.NewPCG(1, 1)), data[:4], 1, 4)
	assert.ErrorIs(t, err, transformer.ErrShape)
}

// TestForwardOnlyProgram shows that a pipeline stage can run its forward
// pass alone (no gradient ops) with a program compiled by
// gorgonia.CompileFunction on the training graph, next to the full
// forward+backward machine, and get the same values.
func TestForwardOnlyProgram(t *testing.T) {
	cfg := tinyConfig(transformer.Float32)
	r, _ := newRunner(t, cfg, 0, cfg.HeadLayer(), 2, runnerOpts{loss: true})
	ids := randomIDs(rand.New(rand.NewPCG(1, 1)), 2*cfg.Ctx, cfg.Vocab)
	r.setInputIDs(t, ids)
	r.setTargets(t, ids)
	want := r.run(t, r.out)[0]

	graphMu.Lock()
	prog, locMap, err := gorgonia.CompileFunction(r.st.Graph(), gorgonia.Nodes{r.in}, gorgonia.Nodes{r.out})
	graphMu.Unlock()
	require.NoError(t, err)
	fwd := gorgonia.NewTapeMachine(r.st.Graph(), gorgonia.WithPrecompiled(prog, locMap))
	defer fwd.Close()
	require.NoError(t, fwd.RunAll())
	got := values(t, r.out)
	fwd.Reset()
	require.Equal(t, want, got)
	require.Equal(t, want, r.run(t, r.out)[0], "the full machine still works")
}

// TestMicroBatchesBitwise checks that a batch of 4 gives bitwise the same
// logits as two micro-batches of 2 (sequences do not interact). The sizes
// exceed gonum's 64-wide GEMM blocks.
func TestMicroBatchesBitwise(t *testing.T) {
	cfg := transformer.Config{Vocab: 70, Ctx: 20, Dim: 80, Heads: 4, Layers: 1, MLPHidden: 144, Seed: 9}
	ids := randomIDs(rand.New(rand.NewPCG(2, 2)), 4*cfg.Ctx, cfg.Vocab)
	big, _ := newRunner(t, cfg, 0, cfg.HeadLayer(), 4, runnerOpts{})
	big.setInputIDs(t, ids)
	want := big.run(t, big.out)[0]
	small, _ := newRunner(t, cfg, 0, cfg.HeadLayer(), 2, runnerOpts{})
	var got []float64
	for mb := range 2 {
		small.setInputIDs(t, ids[mb*2*cfg.Ctx:(mb+1)*2*cfg.Ctx])
		got = append(got, small.run(t, small.out)[0]...)
	}
	require.Equal(t, want, got)
}

func TestMeanCrossEntropy(t *testing.T) {
	// Matches the graph loss on the same logits.
	cfg := tinyConfig(transformer.Float64)
	r, _ := newRunner(t, cfg, 0, cfg.HeadLayer(), 2, runnerOpts{loss: true})
	rng := rand.New(rand.NewPCG(4, 4))
	ids := randomIDs(rng, 2*cfg.Ctx, cfg.Vocab)
	tgts := randomIDs(rng, 2*cfg.Ctx, cfg.Vocab)
	r.setInputIDs(t, ids)
	r.setTargets(t, tgts)
	vals := r.run(t, r.out, r.loss)
	got, err := transformer.MeanCrossEntropy(vals[0], cfg.Vocab, tgts)
	require.NoError(t, err)
	assert.InDelta(t, vals[1][0], got, 1e-12)

	l, err := transformer.MeanCrossEntropy([]float64{0, 0, 0, 0}, 2, []int{0, 1})
	require.NoError(t, err)
	assert.InDelta(t, math.Ln2, l, 1e-15)
	_, err = transformer.MeanCrossEntropy([]float64{0, 0}, 2, []int{2})
	assert.ErrorIs(t, err, transformer.ErrToken)
	_, err = transformer.MeanCrossEntropy([]float64{0, 0, 0}, 2, []int{1})
	assert.ErrorIs(t, err, transformer.ErrShape)
}

// TestTrainerOptionsRefused: every invalid trainer option makes NewTrainer
// and NewTrainerFor fail with an error matching ErrInvalidArgument that
// names it.
func TestTrainerOptionsRefused(t *testing.T) {
	cfg := transformer.Config{Vocab: 8, Ctx: 4, Dim: 8, Heads: 2, Layers: 1, MLPHidden: 16, Seed: 1}
	for _, c := range []struct {
		opt  transformer.TrainerOption
		name string
	}{
		{transformer.WithLearnRate(-1), "WithLearnRate"},
		{transformer.WithLearnRate(math.NaN()), "WithLearnRate"},
		{transformer.WithClip(-0.5), "WithClip"},
		{transformer.WithClip(math.Inf(1)), "WithClip"},
		{transformer.WithSolver(nil), "WithSolver(nil)"},
		{transformer.WithWeights(nil), "WithWeights"},
		{transformer.WithHook(nil), "WithHook(nil)"},
		{nil, "option 1 is nil"},
	} {
		_, err := transformer.NewTrainer(cfg, 2, transformer.WithLearnRate(1e-2), c.opt)
		require.ErrorIs(t, err, transformer.ErrInvalidArgument, c.name)
		assert.Contains(t, err.Error(), c.name)
		st, err := transformer.NewStage(gorgonia.NewGraph(), cfg, 0, cfg.HeadLayer(), 2)
		require.NoError(t, err)
		_, err = transformer.NewTrainerFor(st, transformer.WithClip(0), c.opt)
		require.ErrorIs(t, err, transformer.ErrInvalidArgument, c.name)
	}
}
