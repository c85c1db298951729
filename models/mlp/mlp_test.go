package mlp

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// net is a model with inputs, loss and gradients in one graph.
type net struct {
	g    *gorgonia.ExprGraph
	m    *Model
	x, y *gorgonia.Node
	out  *gorgonia.Node
	loss *gorgonia.Node
	vm   gorgonia.VM
}

func build(t testing.TB, cfg Config) *net {
	t.Helper()
	g := gorgonia.NewGraph()
	m, err := New(g, cfg)
	require.NoError(t, err)
	x, y := m.NewInputs()
	out, err := m.Forward(x)
	require.NoError(t, err)
	loss, err := Loss(out, y)
	require.NoError(t, err)
	_, err = gorgonia.Grad(loss, m.Learnables()...)
	require.NoError(t, err)
	vm := gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(m.Learnables()...))
	t.Cleanup(func() { vm.Close() })
	return &net{g: g, m: m, x: x, y: y, out: out, loss: loss, vm: vm}
}

// run binds x and y, runs forward and backward, and returns the loss.
func (n *net) run(t testing.TB, x, y tensor.Tensor) float64 {
	t.Helper()
	require.NoError(t, gorgonia.Let(n.x, x))
	require.NoError(t, gorgonia.Let(n.y, y))
	n.vm.Reset()
	require.NoError(t, n.vm.RunAll())
	switch v := n.loss.Value().(type) {
	case *gorgonia.F32:
		return float64(*v)
	case *gorgonia.F64:
		return float64(*v)
	}
	t.Fatalf("loss is %T", n.loss.Value())
	return 0
}

// blobs returns a separable classification problem: class c's points are
// centred on a fixed random point, with noise.
func blobs[T float32 | float64](rng *rand.Rand, batch, dims, classes int) (x, y []T, labels []uint8) {
	centres := rand.New(rand.NewPCG(99, 0))
	c := make([]float64, classes*dims)
	for i := range c {
		c[i] = 2 * centres.NormFloat64()
	}
	x = make([]T, batch*dims)
	y = make([]T, batch*classes)
	labels = make([]uint8, batch)
	for r := range batch {
		l := rng.IntN(classes)
		labels[r] = uint8(l)
		y[r*classes+l] = 1
		for d := range dims {
			x[r*dims+d] = T(c[l*dims+d] + 0.3*rng.NormFloat64())
		}
	}
	return x, y, labels
}

func TestNewDeterministic(t *testing.T) {
	cfg := Config{Sizes: []int{6, 5, 3}, Batch: 2, Seed: 11}
	a, err := New(gorgonia.NewGraph(), cfg)
	require.NoError(t, err)
	b, err := New(gorgonia.NewGraph(), cfg)
	require.NoError(t, err)
	cfg.Seed = 12
	c, err := New(gorgonia.NewGraph(), cfg)
	require.NoError(t, err)
	cfg.Seed, cfg.Dtype = 11, tensor.Float64
	d, err := New(gorgonia.NewGraph(), cfg)
	require.NoError(t, err)

	assert.Equal(t, tensor.Float32, a.Config().Dtype, "zero Dtype means Float32")
	la, lb, lc, ld := a.Learnables(), b.Learnables(), c.Learnables(), d.Learnables()
	require.Len(t, la, 4)
	names := []string{"w0", "b0", "w1", "b1"}
	shapes := []tensor.Shape{{6, 5}, {5}, {5, 3}, {3}}
	for k := range la {
		assert.Equal(t, names[k], la[k].Name())
		assert.Equal(t, shapes[k], la[k].Shape())
		va := la[k].Value().Data().([]float32)
		assert.Equal(t, va, lb[k].Value().Data().([]float32), "same seed, same values")
		vd := ld[k].Value().Data().([]float64)
		for i := range va {
			assert.Equal(t, va[i], float32(vd[i]), "float32 is float64 rounded")
		}
		if k%2 == 0 {
			assert.NotEqual(t, va, lc[k].Value().Data().([]float32), "seed matters")
			limit := float32(math.Sqrt(6.0 / float64(shapes[k][0])))
			if k == 2 {
				limit = float32(math.Sqrt(6.0 / 8))
			}
			for _, v := range va {
				assert.LessOrEqual(t, float32(math.Abs(float64(v))), limit)
			}
		} else {
			assert.Equal(t, make([]float32, len(va)), va, "zero biases")
		}
	}
}

func TestNewInvalid(t *testing.T) {
	for _, cfg := range []Config{
		{Sizes: []int{3}},
		{Sizes: []int{3, 0, 2}},
		{Sizes: []int{3, 2}, Batch: -1},
		{Sizes: []int{3, 2}, Dtype: tensor.Int},
	} {
		_, err := New(gorgonia.NewGraph(), cfg)
		assert.ErrorIs(t, err, ErrInvalidArgument, "%+v", cfg)
	}
	_, err := New(nil, Config{Sizes: []int{2, 2}})
	assert.ErrorIs(t, err, ErrInvalidArgument)
}

func TestForwardShapes(t *testing.T) {
	g := gorgonia.NewGraph()
	m, err := New(g, Config{Sizes: []int{4, 3, 2}, Batch: 5})
	require.NoError(t, err)
	x, y := m.NewInputs()
	assert.Equal(t, tensor.Shape{5, 4}, x.Shape())
	assert.Equal(t, tensor.Shape{5, 2}, y.Shape())
	out, err := m.Forward(x)
	require.NoError(t, err)
	assert.Equal(t, tensor.Shape{5, 2}, out.Shape())

	bad := gorgonia.NewMatrix(g, tensor.Float32, gorgonia.WithShape(5, 3), gorgonia.WithName("bad"))
	_, err = m.Forward(bad)
	assert.ErrorIs(t, err, ErrShape)
	_, err = m.ForwardWith(x, m.Learnables()[:3])
	assert.ErrorIs(t, err, ErrShape)
	swapped := m.Learnables()
	swapped[0], swapped[2] = swapped[2], swapped[0]
	_, err = m.ForwardWith(x, swapped)
	assert.ErrorIs(t, err, ErrShape)
	_, err = Loss(out, x)
	assert.ErrorIs(t, err, ErrShape)
}

// TestLossMatchesReference checks the fused loss and its gradient against
// a direct computation, including logits far outside exp's range.
func TestLossMatchesReference(t *testing.T) {
	logits := []float64{
		1, 2, 3,
		-1e4, 0, 1e4, // would overflow a naive softmax
		0.5, 0.5, 0.5,
		-800, -801, -799, // would underflow a naive softmax
	}
	y := []float64{0, 0, 1, 1, 0, 0, 0, 1, 0, 0.5, 0.5, 0}
	for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
		g := gorgonia.NewGraph()
		lx := gorgonia.NewMatrix(g, dt, gorgonia.WithShape(4, 3), gorgonia.WithName("logits"))
		ly := gorgonia.NewMatrix(g, dt, gorgonia.WithShape(4, 3), gorgonia.WithName("y"))
		loss, err := Loss(lx, ly)
		require.NoError(t, err)
		grads, err := gorgonia.Grad(loss, lx)
		require.NoError(t, err)
		var gradVal gorgonia.Value
		gorgonia.Read(grads[0], &gradVal)
		vm := gorgonia.NewTapeMachine(g)
		defer vm.Close()
		require.NoError(t, gorgonia.Let(lx, dense(dt, []int{4, 3}, logits)))
		require.NoError(t, gorgonia.Let(ly, dense(dt, []int{4, 3}, y)))
		for range 2 { // twice: the second run reuses preallocated values
			vm.Reset()
			require.NoError(t, vm.RunAll())
		}

		var want float64
		wantGrad := make([]float64, 12)
		for r := range 4 {
			row := logits[r*3 : r*3+3]
			m := max(row[0], row[1], row[2])
			lse := m + math.Log(math.Exp(row[0]-m)+math.Exp(row[1]-m)+math.Exp(row[2]-m))
			var ysum float64
			for j := range 3 {
				want += y[r*3+j] * (lse - row[j]) / 4
				ysum += y[r*3+j]
			}
			for j := range 3 {
				wantGrad[r*3+j] = (math.Exp(row[j]-lse)*ysum - y[r*3+j]) / 4
			}
		}
		tol := 1e-12
		if dt == tensor.Float32 {
			tol = 1e-3
		}
		assert.InDelta(t, want, toF64(loss.Value().Data()), tol*max(1, want), "%v", dt)
		got := toF64s(gradVal.Data())
		for i := range wantGrad {
			assert.InDelta(t, wantGrad[i], got[i], tol, "%v grad %d", dt, i)
		}
	}
}

// TestGradCheck compares backprop through the whole MLP with central
// differences on a tiny float64 model.
func TestGradCheck(t *testing.T) {
	n := build(t, Config{Sizes: []int{5, 4, 3}, Batch: 3, Dtype: tensor.Float64, Seed: 3})
	// Non-zero biases so no ReLU sits exactly at its kink.
	rng := rand.New(rand.NewPCG(5, 5))
	for _, p := range n.m.Learnables() {
		for i, d := 0, p.Value().Data().([]float64); i < len(d); i++ {
			d[i] += 0.1 * rng.NormFloat64()
		}
	}
	xs, ys, _ := blobs[float64](rng, 3, 5, 3)
	x := dense(tensor.Float64, []int{3, 5}, xs)
	y := dense(tensor.Float64, []int{3, 3}, ys)

	n.run(t, x, y)
	var analytic [][]float64
	for _, p := range n.m.Learnables() {
		gv, err := p.Grad()
		require.NoError(t, err)
		analytic = append(analytic, append([]float64(nil), gv.Data().([]float64)...))
	}
	const h = 1e-6
	for k, p := range n.m.Learnables() {
		d := p.Value().Data().([]float64)
		for i := range d {
			orig := d[i]
			d[i] = orig + h
			up := n.run(t, x, y)
			d[i] = orig - h
			down := n.run(t, x, y)
			d[i] = orig
			num := (up - down) / (2 * h)
			assert.InDelta(t, num, analytic[k][i], 1e-6, "%s[%d]", p.Name(), i)
		}
	}
}

// TestTrainReducesLoss runs SGD steps on separable blobs, in both dtypes.
func TestTrainReducesLoss(t *testing.T) {
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		n := build(t, Config{Sizes: []int{8, 16, 4}, Batch: 32, Dtype: dt, Seed: 1})
		solver := gorgonia.NewVanillaSolver(gorgonia.WithLearnRate(0.1))
		rng := rand.New(rand.NewPCG(2, 2))
		var first, last float64
		for step := range 60 {
			var x, y tensor.Tensor
			if dt == tensor.Float32 {
				xs, ys, _ := blobs[float32](rng, 32, 8, 4)
				x, y = dense(dt, []int{32, 8}, toF64s(xs)), dense(dt, []int{32, 4}, toF64s(ys))
			} else {
				xs, ys, _ := blobs[float64](rng, 32, 8, 4)
				x, y = dense(dt, []int{32, 8}, xs), dense(dt, []int{32, 4}, ys)
			}
			l := n.run(t, x, y)
			require.False(t, math.IsNaN(l))
			if step == 0 {
				first = l
			}
			last = l
			require.NoError(t, solver.Step(gorgonia.NodesToValueGrads(n.m.Learnables())))
		}
		t.Logf("%v: loss %.4f -> %.4f", dt, first, last)
		assert.Less(t, last, first/5, "%v", dt)

		// The trained model classifies fresh points.
		xs, ys, labels := blobs[float64](rng, 32, 8, 4)
		n.run(t, dense(dt, []int{32, 8}, xs), dense(dt, []int{32, 4}, ys))
		acc := Accuracy(toF64s(n.out.Value().Data()), 4, labels)
		assert.GreaterOrEqual(t, acc, 0.9, "%v", dt)
	}
}

// TestForwardWithHook substitutes an op for each parameter, as DDP does,
// and checks values and gradients are unchanged.
func TestForwardWithHook(t *testing.T) {
	cfg := Config{Sizes: []int{5, 4, 3}, Batch: 3, Dtype: tensor.Float64, Seed: 9}
	rng := rand.New(rand.NewPCG(1, 1))
	xs, ys, _ := blobs[float64](rng, 3, 5, 3)

	type result struct {
		loss  float64
		grads [][]float64
	}
	runOnce := func(hook bool) result {
		g := gorgonia.NewGraph()
		m, err := New(g, cfg)
		require.NoError(t, err)
		x, y := m.NewInputs()
		params := m.Learnables()
		if hook {
			for k, p := range params {
				params[k], err = gorgonia.Mul(p, gorgonia.NewConstant(1.0))
				require.NoError(t, err)
			}
		}
		out, err := m.ForwardWith(x, params)
		require.NoError(t, err)
		loss, err := Loss(out, y)
		require.NoError(t, err)
		_, err = gorgonia.Grad(loss, m.Learnables()...)
		require.NoError(t, err)
		vm := gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(m.Learnables()...))
		defer vm.Close()
		require.NoError(t, gorgonia.Let(x, dense(tensor.Float64, []int{3, 5}, xs)))
		require.NoError(t, gorgonia.Let(y, dense(tensor.Float64, []int{3, 3}, ys)))
		require.NoError(t, vm.RunAll())
		r := result{loss: toF64(loss.Value().Data())}
		for _, p := range m.Learnables() {
			gv, err := p.Grad()
			require.NoError(t, err)
			r.grads = append(r.grads, append([]float64(nil), gv.Data().([]float64)...))
		}
		return r
	}
	plain, hooked := runOnce(false), runOnce(true)
	assert.Equal(t, plain.loss, hooked.loss)
	for k := range plain.grads {
		assert.InDeltaSlice(t, plain.grads[k], hooked.grads[k], 1e-15, "param %d", k)
	}
}

// TestForwardHookedIdentity checks that ForwardHooked with the identity
// hook computes exactly what Forward does: logits, loss and gradients.
func TestForwardHookedIdentity(t *testing.T) {
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		cfg := Config{Sizes: []int{6, 5, 4, 3}, Batch: 4, Dtype: dt, Seed: 7}
		rng := rand.New(rand.NewPCG(3, 3))
		xs, ys, _ := blobs[float64](rng, 4, 6, 3)

		type result struct {
			loss   float64
			logits []float64
			grads  [][]float64
		}
		runOnce := func(hooked bool) result {
			g := gorgonia.NewGraph()
			m, err := New(g, cfg)
			require.NoError(t, err)
			x, y := m.NewInputs()
			var out *gorgonia.Node
			if hooked {
				var seen []string
				out, err = m.ForwardHooked(x, func(p *gorgonia.Node) (*gorgonia.Node, error) {
					seen = append(seen, p.Name())
					return p, nil
				})
				assert.Equal(t, []string{"w0", "b0", "w1", "b1", "w2", "b2"}, seen, "each learnable once, in forward order")
			} else {
				out, err = m.Forward(x)
			}
			require.NoError(t, err)
			var logits gorgonia.Value
			gorgonia.Read(out, &logits)
			loss, err := Loss(out, y)
			require.NoError(t, err)
			_, err = gorgonia.Grad(loss, m.Learnables()...)
			require.NoError(t, err)
			vm := gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(m.Learnables()...))
			defer vm.Close()
			require.NoError(t, gorgonia.Let(x, dense(dt, []int{4, 6}, xs)))
			require.NoError(t, gorgonia.Let(y, dense(dt, []int{4, 3}, ys)))
			require.NoError(t, vm.RunAll())
			r := result{loss: toF64(loss.Value().Data()), logits: append([]float64(nil), toF64s(logits.Data())...)}
			for _, p := range m.Learnables() {
				gv, err := p.Grad()
				require.NoError(t, err)
				r.grads = append(r.grads, append([]float64(nil), toF64s(gv.Data())...))
			}
			return r
		}
		plain, hooked := runOnce(false), runOnce(true)
		assert.Equal(t, plain.loss, hooked.loss, "%v", dt)
		assert.Equal(t, plain.logits, hooked.logits, "%v", dt)
		assert.Equal(t, plain.grads, hooked.grads, "%v", dt)
	}
}

// TestForwardHookedPointOfUse checks that every hook node is created right
// before the op that consumes it, not up front: hook(p_k) comes after every
// consumer of hook(p_{k-1}), and gradients still reach the learnables.
func TestForwardHookedPointOfUse(t *testing.T) {
	g := gorgonia.NewGraph()
	m, err := New(g, Config{Sizes: []int{5, 4, 3}, Batch: 2, Dtype: tensor.Float64, Seed: 1})
	require.NoError(t, err)
	x, y := m.NewInputs()
	var hooks gorgonia.Nodes
	out, err := m.ForwardHooked(x, func(p *gorgonia.Node) (*gorgonia.Node, error) {
		h, err := gorgonia.Mul(p, gorgonia.NewConstant(1.0))
		hooks = append(hooks, h)
		return h, err
	})
	require.NoError(t, err)
	require.Len(t, hooks, 4)

	pos := map[*gorgonia.Node]int{}
	for i, n := range g.AllNodes() {
		pos[n] = i
	}
	prevLast := -1
	for k, h := range hooks {
		assert.Greater(t, pos[h], prevLast, "hook %d created after the previous hook's consumers", k)
		users := g.To(h.ID())
		require.Positive(t, users.Len(), "hook %d is used", k)
		for users.Next() {
			u := users.Node().(*gorgonia.Node)
			assert.Greater(t, pos[u], pos[h])
			prevLast = max(prevLast, pos[u])
		}
	}

	loss, err := Loss(out, y)
	require.NoError(t, err)
	_, err = gorgonia.Grad(loss, m.Learnables()...)
	require.NoError(t, err)
	for _, p := range m.Learnables() {
		assert.NotNil(t, p.Deriv(), "%s gets a gradient", p.Name())
	}
}

func TestForwardHookedErrors(t *testing.T) {
	g := gorgonia.NewGraph()
	m, err := New(g, Config{Sizes: []int{4, 3, 2}, Batch: 2})
	require.NoError(t, err)
	x, _ := m.NewInputs()
	_, err = m.ForwardHooked(x, nil)
	assert.ErrorIs(t, err, ErrInvalidArgument)

	bad := gorgonia.NewMatrix(g, tensor.Float32, gorgonia.WithShape(2, 5), gorgonia.WithName("bad"))
	_, err = m.ForwardHooked(bad, func(p *gorgonia.Node) (*gorgonia.Node, error) { return p, nil })
	assert.ErrorIs(t, err, ErrShape)

	boom := errors.New("boom")
	_, err = m.ForwardHooked(x, func(p *gorgonia.Node) (*gorgonia.Node, error) {
		if p.Name() == "b1" {
			return nil, boom
		}
		return p, nil
	})
	assert.ErrorIs(t, err, boom)

	_, err = m.ForwardHooked(x, func(p *gorgonia.Node) (*gorgonia.Node, error) {
		return m.Learnables()[0], nil // wrong shape for all but w0
	})
	assert.ErrorIs(t, err, ErrShape)
}

func TestCorrect(t *testing.T) {
	logits := []float32{
		0.1, 0.9, 0.0, // 1
		5, 5, 1, // tie: first wins, 0
		-1, -2, -0.5, // 2
	}
	assert.Equal(t, 2, Correct(logits, 3, []uint8{1, 1, 2}))
	assert.InDelta(t, 2.0/3, Accuracy(logits, 3, []uint8{1, 1, 2}), 1e-12)
	assert.Equal(t, 3, Correct(logits, 3, []uint8{1, 0, 2}))
	assert.Zero(t, Accuracy([]float64{}, 3, nil))
	assert.Panics(t, func() { Correct(logits, 3, []uint8{1}) })
}

func dense(dt tensor.Dtype, shape []int, v []float64) *tensor.Dense {
	return denseOf(dt, shape, v)
}

func toF64(v any) float64 {
	switch v := v.(type) {
	case float32:
		return float64(v)
	case float64:
		return v
	}
	panic(v)
}

func toF64s(v any) []float64 {
	switch v := v.(type) {
	case []float32:
		out := make([]float64, len(v))
		for i, f := range v {
			out[i] = float64(f)
		}
		return out
	case []float64:
		return v
	}
	panic(v)
}
