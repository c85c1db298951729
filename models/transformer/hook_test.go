package transformer_test

import (
	"context"
	"errors"
	"fmt"
	"hash"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/chewxy/hm"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/models/transformer"
	"github.com/gdist/gdist/train/checkpoint"
)

// recorder is a test hook in the manner of dist/ddp's: hook(p) is an
// identity op whose gradient op is an identity that records when p's
// gradient arrives.
type recorder struct {
	memo bool // return the same hook node for the same parameter (as DDP.Hook does)

	mu      sync.Mutex
	calls   []string // parameter names, in hook-call order
	hooks   map[*gorgonia.Node]*gorgonia.Node
	created []*gorgonia.Node // hook nodes, in creation order
	arrived []string         // parameter names, in gradient-arrival order (per run)
}

func newRecorder(memo bool) *recorder {
	return &recorder{memo: memo, hooks: map[*gorgonia.Node]*gorgonia.Node{}}
}

func (r *recorder) hook(p *gorgonia.Node) (*gorgonia.Node, error) {
	r.calls = append(r.calls, p.Name())
	if h, ok := r.hooks[p]; ok && r.memo {
		return h, nil
	}
	h, err := gorgonia.ApplyOp(&identOp{r: r, name: p.Name(), id: len(r.created)}, p)
	if err != nil {
		return nil, err
	}
	r.hooks[p] = h
	r.created = append(r.created, h)
	return h, nil
}

func (r *recorder) arrive(name string) {
	r.mu.Lock()
	r.arrived = append(r.arrived, name)
	r.mu.Unlock()
}

func (r *recorder) takeArrived() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := r.arrived
	r.arrived = nil
	return a
}

// identOp is the identity on values; grad marks its gradient op.
type identOp struct {
	r    *recorder
	name string
	id   int
	grad bool
}

func (op *identOp) Arity() int { return 1 }
func (op *identOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	return hm.NewFnType(a, a)
}
func (op *identOp) InferShape(in ...gorgonia.DimSizer) (tensor.Shape, error) {
	return in[0].(tensor.Shape).Clone(), nil
}
func (op *identOp) Do(in ...gorgonia.Value) (gorgonia.Value, error) {
	if op.grad {
		op.r.arrive(op.name)
	}
	t, ok := in[0].(tensor.Tensor)
	if !ok {
		return nil, fmt.Errorf("identOp: %T", in[0])
	}
	return t.Clone().(tensor.Tensor), nil
}
func (op *identOp) ReturnsPtr() bool     { return false }
func (op *identOp) CallsExtern() bool    { return false }
func (op *identOp) OverwritesInput() int { return -1 }
func (op *identOp) WriteHash(h hash.Hash) {
	fmt.Fprintf(h, "test.ident(%p,%s,%d,%v)", op.r, op.name, op.id, op.grad)
}
func (op *identOp) Hashcode() uint32 {
	h := fnv.New32a()
	op.WriteHash(h)
	return h.Sum32()
}
func (op *identOp) String() string            { return fmt.Sprintf("ident(%s,%v)", op.name, op.grad) }
func (op *identOp) DiffWRT(inputs int) []bool { return []bool{true} }
func (op *identOp) SymDiff(_ gorgonia.Nodes, _, grad *gorgonia.Node) (gorgonia.Nodes, error) {
	g, err := gorgonia.ApplyOp(&identOp{r: op.r, name: op.name, id: op.id, grad: true}, grad)
	if err != nil {
		return nil, err
	}
	return gorgonia.Nodes{g}, nil
}

// fullRun builds the full model (with hook, if not nil), runs forward and
// backward once and returns the logits, the loss and the gradients by name.
func fullRun(t *testing.T, cfg transformer.Config, hook transformer.Hook, ids, tgts []int) (logits []float64, loss float64, grads map[string][]float64, g *gorgonia.ExprGraph) {
	t.Helper()
	graphMu.Lock()
	g = gorgonia.NewGraph()
	st, err := transformer.NewStage(g, cfg, 0, cfg.HeadLayer(), 2)
	require.NoError(t, err)
	in, tg := st.NewInput("in"), st.NewTargets("targets")
	out, err := st.ForwardHooked(in, hook)
	require.NoError(t, err)
	lossN, err := transformer.CrossEntropy(out, tg)
	require.NoError(t, err)
	_, err = gorgonia.Grad(lossN, st.Learnables()...)
	require.NoError(t, err)
	graphMu.Unlock()
	vm := gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(st.Learnables()...))
	defer vm.Close()
	require.NoError(t, transformer.FillOneHot(in.Value().(*tensor.Dense), ids))
	require.NoError(t, transformer.FillOneHot(tg.Value().(*tensor.Dense), tgts))
	require.NoError(t, vm.RunAll())
	defer vm.Reset()
	logits = values(t, out)
	loss, err = transformer.ScalarValue(lossN)
	require.NoError(t, err)
	grads = map[string][]float64{}
	for _, n := range st.Learnables() {
		gv, err := n.Grad()
		require.NoError(t, err)
		grads[n.Name()] = toF64(gv.Data())
	}
	return logits, loss, grads, g
}

// TestForwardHookedBitwise checks that identity hooks, one node per use or
// memoised per parameter, change neither the logits nor the gradients by a
// bit; that the hook is called once per use, right before the op that
// consumes it; and that the gradients reach untied parameters' hooks in
// exactly the reverse of the canonical (forward) order.
func TestForwardHookedBitwise(t *testing.T) {
	for _, dt := range []transformer.Dtype{transformer.Float32, transformer.Float64} {
		for _, tied := range []bool{false, true} {
			cfg := tinyConfig(dt)
			cfg.TiedHead = tied
			rng := rand.New(rand.NewPCG(5, 6))
			ids := randomIDs(rng, 2*cfg.Ctx, cfg.Vocab)
			tgts := randomIDs(rng, 2*cfg.Ctx, cfg.Vocab)
			wantLogits, wantLoss, wantGrads, _ := fullRun(t, cfg, nil, ids, tgts)
			names := transformer.ParamNames(cfg, 0, cfg.HeadLayer())

			passThrough := 0
			logits, loss, grads, _ := fullRun(t, cfg, func(p *gorgonia.Node) (*gorgonia.Node, error) {
				passThrough++
				return p, nil
			}, ids, tgts)
			require.Equal(t, wantLogits, logits)
			require.Equal(t, wantLoss, loss)
			require.Equal(t, wantGrads, grads)
			uses := len(names)
			if tied {
				uses++
			}
			assert.Equal(t, uses, passThrough, "one call per use")

			for _, memo := range []bool{false, true} {
				what := fmt.Sprintf("%v tied=%v memo=%v", dt, tied, memo)
				r := newRecorder(memo)
				logits, loss, grads, g := fullRun(t, cfg, r.hook, ids, tgts)
				require.Equal(t, wantLogits, logits, what)
				require.Equal(t, wantLoss, loss, what)
				require.Equal(t, wantGrads, grads, what)

				// Called once per use, in forward order.
				wantCalls := slices.Clone(names)
				if tied {
					i := slices.Index(wantCalls, "layer"+fmt.Sprintf("%02d", cfg.HeadLayer())+".head.b")
					wantCalls = slices.Insert(wantCalls, i, "layer00.tok_emb")
				}
				assert.Equal(t, wantCalls, r.calls, what)

				// Each hook node is created immediately before the op
				// that consumes it.
				all := g.AllNodes()
				for _, h := range r.created {
					i := slices.Index(all, h)
					require.True(t, i >= 0 && i+1 < len(all), what)
					consumer := all[i+1]
					found := false
					it := g.From(consumer.ID())
					for it.Next() {
						if it.Node() == h {
							found = true
						}
					}
					assert.True(t, found, "%s: node after hook %v is %v, which does not consume it", what, h, consumer)
				}

				// Gradient arrival: the reverse of the forward uses. A
				// memoised hook of the tied embedding gets the summed
				// gradient of both uses once, after its first use's, which
				// is last anyway.
				want := slices.Clone(wantCalls)
				if memo {
					want = slices.Clone(names)
				}
				slices.Reverse(want)
				assert.Equal(t, want, r.takeArrived(), what)
			}
		}
	}
}

func TestForwardHookedErrors(t *testing.T) {
	cfg := tinyConfig(transformer.Float32)
	graphMu.Lock()
	defer graphMu.Unlock()
	g := gorgonia.NewGraph()
	st, err := transformer.NewStage(g, cfg, 0, 1, 1)
	require.NoError(t, err)
	in := st.NewInput("in")

	boom := errors.New("boom")
	_, err = st.ForwardHooked(in, func(p *gorgonia.Node) (*gorgonia.Node, error) { return nil, boom })
	require.ErrorIs(t, err, boom)
	assert.Contains(t, err.Error(), "layer00.tok_emb")

	_, err = st.ForwardHooked(in, func(p *gorgonia.Node) (*gorgonia.Node, error) { return nil, nil })
	assert.ErrorIs(t, err, transformer.ErrHook)

	other := gorgonia.NewGraph()
	_, err = st.ForwardHooked(in, func(p *gorgonia.Node) (*gorgonia.Node, error) {
		return gorgonia.NewTensor(other, p.Dtype(), p.Dims(), gorgonia.WithShape(p.Shape()...)), nil
	})
	assert.ErrorIs(t, err, transformer.ErrHook)

	_, err = st.ForwardHooked(in, func(p *gorgonia.Node) (*gorgonia.Node, error) {
		return gorgonia.NewMatrix(g, p.Dtype(), gorgonia.WithShape(1, 1)), nil
	})
	assert.ErrorIs(t, err, transformer.ErrHook)

	_, err = st.ForwardHooked(in, func(p *gorgonia.Node) (*gorgonia.Node, error) {
		return gorgonia.NewTensor(g, tensor.Float64, p.Dims(), gorgonia.WithShape(p.Shape()...)), nil
	})
	assert.ErrorIs(t, err, transformer.ErrHook)

	_, err = st.ForwardHooked(nil, nil)
	assert.ErrorIs(t, err, transformer.ErrShape)

	// The stage still builds afterwards, without the failed hook.
	_, err = st.Forward(in)
	require.NoError(t, err)
}

// TestTrainerWithHook trains with NewTrainerFor and a memoising identity
// hook: bitwise the same losses and weights as NewTrainer.
func TestTrainerWithHook(t *testing.T) {
	for _, tied := range []bool{false, true} {
		cfg := tinyConfig(transformer.Float32)
		cfg.TiedHead = tied
		plain, err := transformer.NewTrainer(cfg, 2, transformer.WithLearnRate(1e-2))
		require.NoError(t, err)
		defer plain.Close()

		r := newRecorder(true)
		graphMu.Lock()
		st, err := transformer.NewStage(gorgonia.NewGraph(), cfg, 0, cfg.HeadLayer(), 2)
		graphMu.Unlock()
		require.NoError(t, err)
		hooked, err := transformer.NewTrainerFor(st, transformer.WithHook(r.hook), transformer.WithLearnRate(1e-2))
		require.NoError(t, err)
		defer hooked.Close()
		assert.Same(t, st, hooked.Stage)

		data := []int{0, 1, 2, 3, 4, 5, 6, 0, 2, 4, 6, 1, 3, 5, 0, 1, 2, 3, 4, 5, 6}
		rng := rand.New(rand.NewPCG(1, 1))
		for range 5 {
			in, tg, err := transformer.SampleBatch(rng, data, 2, cfg.Ctx)
			require.NoError(t, err)
			l1, err := plain.Step(context.Background(), in, tg)
			require.NoError(t, err)
			l2, err := hooked.Step(context.Background(), in, tg)
			require.NoError(t, err)
			require.Equal(t, l1, l2, "tied=%v", tied)
			assert.Len(t, r.takeArrived(), len(st.Names()), "one gradient per parameter and step")
		}
		assert.Equal(t, plain.Weights(), hooked.Weights(), "tied=%v", tied)
	}

	cfg := tinyConfig(transformer.Float32)
	_, err := transformer.NewTrainerFor(nil)
	assert.ErrorIs(t, err, transformer.ErrLayerRange)
	st, err := transformer.NewStage(gorgonia.NewGraph(), cfg, 0, 1, 2)
	require.NoError(t, err)
	_, err = transformer.NewTrainerFor(st)
	assert.ErrorIs(t, err, transformer.ErrLayerRange)
}

func TestLoadConfig(t *testing.T) {
	vocab := transformer.NewVocab("abcdefg")
	cfg := tinyConfig(transformer.Float32)
	cfg.Vocab = vocab.Size()
	st, err := transformer.NewStage(gorgonia.NewGraph(), cfg, 0, cfg.HeadLayer(), 1)
	require.NoError(t, err)
	dir := t.TempDir()
	path := filepath.Join(dir, "m.ckpt")
	require.NoError(t, transformer.Save(path, &transformer.Checkpoint{Config: cfg, Vocab: vocab, Step: 17, Tensors: st.Weights()}))

	got, v, step, err := transformer.LoadConfig(path)
	require.NoError(t, err)
	assert.Equal(t, cfg, got)
	assert.Equal(t, vocab.Runes(), v.Runes())
	assert.Equal(t, int64(17), step)

	// Only the header is read: a file whose tensor data is damaged still
	// yields its config (Load fails on it).
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	raw[len(raw)-24-16] ^= 0xff // inside the last tensor's data, before the 24-byte trailer
	bad := filepath.Join(dir, "bad.ckpt")
	require.NoError(t, os.WriteFile(bad, raw, 0o644))
	_, _, _, err = transformer.LoadConfig(bad)
	require.NoError(t, err)
	_, err = transformer.Load(bad)
	assert.ErrorIs(t, err, checkpoint.ErrCorrupt)

	// No vocabulary.
	noVocab := filepath.Join(dir, "novocab.ckpt")
	require.NoError(t, transformer.Save(noVocab, &transformer.Checkpoint{Config: cfg, Tensors: st.Weights()}))
	_, v, _, err = transformer.LoadConfig(noVocab)
	require.NoError(t, err)
	assert.Nil(t, v)

	other := filepath.Join(dir, "other.ckpt")
	require.NoError(t, checkpoint.Save(other, map[string]string{"format": "mlp"}, nil))
	_, _, _, err = transformer.LoadConfig(other)
	assert.ErrorIs(t, err, transformer.ErrFormat)

	// A vocabulary that does not match the config.
	mismatch := filepath.Join(dir, "mismatch.ckpt")
	require.NoError(t, checkpoint.Save(mismatch, map[string]any{"format": transformer.FormatName, "model": cfg, "vocab": "ab"}, nil))
	_, _, _, err = transformer.LoadConfig(mismatch)
	assert.ErrorIs(t, err, transformer.ErrInvalidArgument)

	_, _, _, err = transformer.LoadConfig(filepath.Join(dir, "missing.ckpt"))
	assert.ErrorIs(t, err, os.ErrNotExist)

	raw[0] ^= 0xff
	require.NoError(t, os.WriteFile(bad, raw, 0o644))
	_, _, _, err = transformer.LoadConfig(bad)
	assert.ErrorIs(t, err, checkpoint.ErrBadMagic)
}
