package pipeline

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/models/transformer"
)

// lossGraph is a model's graph for one batch: input and target bound to
// tensors, the loss, and the gradients of the learnables and the input.
type lossGraph struct {
	g         *gorgonia.ExprGraph
	params    gorgonia.Nodes
	inV, tgtV *tensor.Dense
	loss      *gorgonia.Node
	grads     gorgonia.Nodes // params' then the input's
	fill      func(step int)
}

// newLossGraph builds tm's whole model for batches of n samples.
func newLossGraph(t *testing.T, tm testModel, n int) *lossGraph {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	lg := &lossGraph{g: gorgonia.NewGraph()}
	st, err := tm.Build(0, tm.Layers, n)(lg.g)
	require.NoError(t, err)
	dt, err := stageDtype(st)
	require.NoError(t, err)
	lg.inV = tensor.New(tensor.Of(dt), tensor.WithShape(st.InputShape()...))
	in := gorgonia.NewTensor(lg.g, dt, lg.inV.Dims(), gorgonia.WithShape(lg.inV.Shape()...), gorgonia.WithName("x"), gorgonia.WithValue(lg.inV))
	out, err := st.Forward(in)
	require.NoError(t, err)
	lg.tgtV = tensor.New(tensor.Of(out.Dtype()), tensor.WithShape(out.Shape()...))
	tgt := gorgonia.NewTensor(lg.g, out.Dtype(), lg.tgtV.Dims(), gorgonia.WithShape(lg.tgtV.Shape()...), gorgonia.WithName("y"), gorgonia.WithValue(lg.tgtV))
	lg.loss, err = tm.Loss(out, tgt)
	require.NoError(t, err)
	lg.params = st.Learnables()
	lg.grads, err = gorgonia.Grad(lg.loss, append(lg.params[:len(lg.params):len(lg.params)], in)...)
	require.NoError(t, err)
	lg.fill = func(step int) {
		d := tm.Data(step, n, nil)
		require.NoError(t, d.Input(0, lg.inV))
		require.NoError(t, d.Target(0, lg.tgtV))
	}
	return lg
}

// flat returns v's data as float64s.
func flat(t *testing.T, v gorgonia.Value) []float64 {
	t.Helper()
	if x, err := scalarOf(v); err == nil && v.Shape().IsScalar() {
		return []float64{x}
	}
	d, err := denseData(v)
	require.NoError(t, err)
	switch x := d.(type) {
	case []float64:
		return append([]float64(nil), x...)
	case []float32:
		out := make([]float64, len(x))
		for i, f := range x {
			out[i] = float64(f)
		}
		return out
	}
	return nil
}

// TestExecutorMatchesTapeMachine: the pipeline's executor computes the
// loss and every gradient of a graph bitwise as a gorgonia.TapeMachine
// does, run after run (the executor writing into last run's tensors), for
// an MLP and a transformer, and the same split into passes.
func TestExecutorMatchesTapeMachine(t *testing.T) {
	cfg := transformer.Config{Vocab: 7, Ctx: 5, Dim: 8, Heads: 2, Layers: 2, MLPHidden: 16, Dtype: transformer.Float64, Seed: 3}
	for name, c := range map[string]struct {
		tm testModel
		n  int
	}{
		"mlp64":       {mlpModel(testSizes, tensor.Float64), 6},
		"mlp32":       {mlpModel(testSizes, tensor.Float32), 6},
		"transformer": {transformerModel(cfg), 3},
	} {
		t.Run(name, func(t *testing.T) {
			ref := newLossGraph(t, c.tm, c.n)
			var lossV gorgonia.Value
			gorgonia.Read(ref.loss, &lossV)
			vals := make([]gorgonia.Value, len(ref.grads))
			for i, g := range ref.grads {
				gorgonia.Read(g, &vals[i])
			}
			vm := gorgonia.NewTapeMachine(ref.g)
			defer vm.Close()

			one := newLossGraph(t, c.tm, c.n) // one pass
			p1, err := compile(one.g, append(gorgonia.Nodes{one.loss}, one.grads...))
			require.NoError(t, err)
			two := newLossGraph(t, c.tm, c.n) // loss and input gradient, then weight gradients
			in := len(two.grads) - 1
			p2, err := compile(two.g, gorgonia.Nodes{two.loss, two.grads[in]}, two.grads[:in])
			require.NoError(t, err)
			assert.NotEmpty(t, p2.passes[1], "the weight gradients have a pass of their own")
			var prevData []uintptr
			for step := range 3 {
				ref.fill(step)
				one.fill(step)
				two.fill(step)
				require.NoError(t, vm.RunAll())
				vm.Reset()
				p1.load()
				require.NoError(t, p1.run(0))
				p2.load()
				require.NoError(t, p2.run(0))
				lossAfterB := flat(t, p2.value(two.loss))
				require.NoError(t, p2.run(1))
				want := flat(t, lossV)
				assert.Equal(t, want, flat(t, p1.value(one.loss)), "step %d loss", step)
				assert.Equal(t, want, lossAfterB, "step %d loss, split", step)
				var data []uintptr
				for i := range ref.grads {
					w := flat(t, vals[i])
					assert.Equal(t, w, flat(t, p1.value(one.grads[i])), "step %d gradient %d", step, i)
					assert.Equal(t, w, flat(t, p2.value(two.grads[i])), "step %d gradient %d, split", step, i)
					data = append(data, p1.value(one.grads[i]).(tensor.Tensor).Uintptr())
				}
				if prevData != nil {
					same := 0
					for i := range data {
						if data[i] == prevData[i] {
							same++
						}
					}
					assert.Positive(t, same, "step %d: some gradients are written into last run's tensors", step)
				}
				prevData = data
			}
		})
	}
}

// TestExecutorSkipsUnneededNodes: nodes no output depends on never run,
// and a pass runs only what earlier passes did not.
func TestExecutorSkipsUnneededNodes(t *testing.T) {
	g := gorgonia.NewGraph()
	x := gorgonia.NewScalar(g, tensor.Float64, gorgonia.WithName("x"), gorgonia.WithValue(2.0))
	y := gorgonia.NewScalar(g, tensor.Float64, gorgonia.WithName("y"), gorgonia.WithValue(3.0))
	sum := gorgonia.Must(gorgonia.Add(x, y))
	prod := gorgonia.Must(gorgonia.Mul(sum, y))
	unused := gorgonia.Must(gorgonia.Sub(x, y))
	p, err := compile(g, gorgonia.Nodes{sum}, gorgonia.Nodes{prod})
	require.NoError(t, err)
	assert.Len(t, p.passes[0], 1)
	assert.Len(t, p.passes[1], 1)
	assert.False(t, p.has(unused))
	p.load()
	require.NoError(t, p.run(0))
	assert.Nil(t, p.value(prod), "not run yet")
	require.NoError(t, p.run(1))
	assert.Equal(t, "15", fmt.Sprint(p.value(prod)))
	assert.Nil(t, p.value(unused))
}
