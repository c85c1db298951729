package ddp

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/disttest"
	"github.com/gdist/gdist/dist/internal/shard"
	"github.com/gdist/gdist/dist/pipeline/pipelinetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// buildMu serialises Gorgonia graph construction across the rank goroutines
// of a test (it touches package globals).
var buildMu sync.Mutex

// runRanks runs fn on n in-process ranks, one goroutine each. A rank's group
// is closed when its fn returns, so a failing rank makes its peers fail
// rather than hang.
func runRanks(t *testing.T, n int, fn func(pg *dist.ProcessGroup) error) {
	t.Helper()
	groups := disttest.Cluster(t, n, dist.WithTimeout(30*time.Second))
	errs := disttest.Run(t, groups, func(_ int, pg *dist.ProcessGroup) error { return fn(pg) })
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
}

// Deterministic data: batch s, row, column.
func xval(s, row, col int) float64 {
	return math.Sin(0.7*float64(s) + 1.3*float64(row) + 0.37*float64(col))
}
func yval(s, row, j int) float64 { return math.Cos(0.5*float64(s) + 0.9*float64(row) + 1.1*float64(j)) }

// batch returns rows [lo, hi) of step s's inputs and targets.
func batch(dt tensor.Dtype, s, lo, hi, in, out int) (x, y tensor.Tensor) {
	xs := make([]float64, 0, (hi-lo)*in)
	ys := make([]float64, 0, (hi-lo)*out)
	for r := lo; r < hi; r++ {
		for c := range in {
			xs = append(xs, xval(s, r, c))
		}
		for j := range out {
			ys = append(ys, yval(s, r, j))
		}
	}
	return dense(dt, []int{hi - lo, in}, xs), dense(dt, []int{hi - lo, out}, ys)
}

func dense(dt tensor.Dtype, shape []int, vals []float64) tensor.Tensor {
	if dt == tensor.Float32 {
		f := make([]float32, len(vals))
		for i, v := range vals {
			f[i] = float32(v)
		}
		return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(f))
	}
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(vals))
}

// toFloat64 copies a Float32/Float64 value.
func toFloat64(v gorgonia.Value) []float64 {
	f32, f64, err := shard.Floats(v)
	if err != nil {
		panic(err)
	}
	if f64 != nil {
		return append([]float64(nil), f64...)
	}
	out := make([]float64, len(f32))
	for i, x := range f32 {
		out[i] = float64(x)
	}
	return out
}

// newParams adds the parameters of a tanh MLP with the given layer sizes:
// w0, b0, w1, b1, ... with deterministic values, shifted by perturb (so that
// ranks can start from different values and rely on Wrap's broadcast).
func newParams(g *gorgonia.ExprGraph, dt tensor.Dtype, sizes []int, perturb float64) gorgonia.Nodes {
	var ps gorgonia.Nodes
	for l := 0; l+1 < len(sizes); l++ {
		in, out := sizes[l], sizes[l+1]
		w := make([]float64, in*out)
		for k := range w {
			w[k] = math.Sin(1.7*float64(l)+0.31*float64(k)+0.1)/math.Sqrt(float64(in)) + perturb
		}
		b := make([]float64, out)
		for k := range b {
			b[k] = 0.1*math.Cos(float64(l+k)) + perturb
		}
		ps = append(ps,
			gorgonia.NewMatrix(g, dt, gorgonia.WithShape(in, out), gorgonia.WithName(fmt.Sprintf("w%d", l)),
				gorgonia.WithValue(dense(dt, []int{in, out}, w))),
			gorgonia.NewVector(g, dt, gorgonia.WithShape(out), gorgonia.WithName(fmt.Sprintf("b%d", l)),
				gorgonia.WithValue(dense(dt, []int{out}, b))))
	}
	return ps
}

// forward builds the MLP on x. use(i) returns the node standing for
// parameter i; it is called right before the parameter's first use.
func forward(x *gorgonia.Node, nParams int, use func(i int) (*gorgonia.Node, error), probe func(*gorgonia.Node) *gorgonia.Node) (*gorgonia.Node, error) {
	h := x
	for l := 0; 2*l < nParams; l++ {
		w, err := use(2 * l)
		if err != nil {
			return nil, err
		}
		z, err := gorgonia.Mul(h, w)
		if err != nil {
			return nil, err
		}
		b, err := use(2*l + 1)
		if err != nil {
			return nil, err
		}
		if z, err = gorgonia.BroadcastAdd(z, b, nil, []byte{0}); err != nil {
			return nil, err
		}
		if 2*l+2 < nParams {
			if z, err = gorgonia.Tanh(z); err != nil {
				return nil, err
			}
			if probe != nil {
				z = probe(z)
			}
		}
		h = z
	}
	return h, nil
}

// mseLoss is the mean over all elements of (out - y)²: a mean over the local
// batch, so that averaging gradients over ranks gives the full-batch gradient.
var mseLoss = pipelinetest.MSE

// trainSetup describes a data-parallel training run and its reference.
type trainSetup struct {
	n      int // ranks
	steps  int // optimiser steps
	micro  int // backward passes per step (gradient accumulation); 1 = none
	batch  int // global batch per step; divisible by n*micro
	sizes  []int
	dt     tensor.Dtype
	solver func() gorgonia.Solver
	opts   []Option
	// noSync accumulates with SetSync(false) instead of WithAccumulation:
	// gradients are summed over the micro passes.
	noSync bool
	// upfront creates every hook before the forward pass (Hooked).
	upfront bool
}

// trainReference trains the same model in one process on the whole batch.
func trainReference(t *testing.T, s trainSetup, solver gorgonia.Solver) [][]float64 {
	t.Helper()
	buildMu.Lock()
	g := gorgonia.NewGraph()
	ps := newParams(g, s.dt, s.sizes, 0)
	in, out := s.sizes[0], s.sizes[len(s.sizes)-1]
	x := gorgonia.NewMatrix(g, s.dt, gorgonia.WithShape(s.batch, in), gorgonia.WithName("x"))
	y := gorgonia.NewMatrix(g, s.dt, gorgonia.WithShape(s.batch, out), gorgonia.WithName("y"))
	logits, err := forward(x, len(ps), func(i int) (*gorgonia.Node, error) { return ps[i], nil }, nil)
	var loss *gorgonia.Node
	if err == nil {
		loss, err = mseLoss(logits, y)
	}
	if err == nil {
		_, err = gorgonia.Grad(loss, ps...)
	}
	buildMu.Unlock()
	require.NoError(t, err)
	vm := gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(ps...))
	defer vm.Close()
	for step := range s.steps {
		xv, yv := batch(s.dt, step, 0, s.batch, in, out)
		require.NoError(t, gorgonia.Let(x, xv))
		require.NoError(t, gorgonia.Let(y, yv))
		require.NoError(t, vm.RunAll())
		require.NoError(t, solver.Step(gorgonia.NodesToValueGrads(ps)))
		vm.Reset()
	}
	res := make([][]float64, len(ps))
	for i, p := range ps {
		res[i] = toFloat64(p.Value())
	}
	return res
}

// rankResult is what one rank reports after training.
type rankResult struct {
	params [][]float64
	stats  []Stats
	d      *DDP
}

// trainDDP trains on s.n ranks; rank r uses rows [r·B/n, (r+1)·B/n) of every
// step's batch, split into s.micro passes.
func trainDDP(t *testing.T, s trainSetup) []rankResult {
	t.Helper()
	res := make([]rankResult, s.n)
	in, out := s.sizes[0], s.sizes[len(s.sizes)-1]
	local := s.batch / s.n
	mb := local / s.micro
	require.Equal(t, s.batch, mb*s.micro*s.n, "batch must split evenly")
	runRanks(t, s.n, func(pg *dist.ProcessGroup) error {
		r := pg.Rank()
		buildMu.Lock()
		g := gorgonia.NewGraph()
		ps := newParams(g, s.dt, s.sizes, 0.25*float64(r)) // Wrap must broadcast rank 0's values
		buildMu.Unlock()

		opts := append([]Option(nil), s.opts...)
		if s.micro > 1 && !s.noSync {
			opts = append(opts, WithAccumulation(s.micro))
		}
		d, err := Wrap(context.Background(), pg, ps, opts...)
		if err != nil {
			return err
		}

		buildMu.Lock()
		x := gorgonia.NewMatrix(g, s.dt, gorgonia.WithShape(mb, in), gorgonia.WithName("x"))
		y := gorgonia.NewMatrix(g, s.dt, gorgonia.WithShape(mb, out), gorgonia.WithName("y"))
		use := func(i int) (*gorgonia.Node, error) { return d.Hook(ps[i]) }
		if s.upfront {
			hs, err := d.Hooked()
			if err != nil {
				buildMu.Unlock()
				return err
			}
			use = func(i int) (*gorgonia.Node, error) { return hs[i], nil }
		}
		logits, err := forward(x, len(ps), use, nil)
		var loss *gorgonia.Node
		if err == nil {
			loss, err = mseLoss(logits, y)
		}
		if err == nil {
			_, err = gorgonia.Grad(loss, ps...)
		}
		buildMu.Unlock()
		if err != nil {
			return err
		}
		vm := gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(ps...))
		defer vm.Close()
		solver := d.Solver(s.solver())
		for step := range s.steps {
			for j := range s.micro {
				lo := r*local + j*mb
				xv, yv := batch(s.dt, step, lo, lo+mb, in, out)
				if err := gorgonia.Let(x, xv); err != nil {
					return err
				}
				if err := gorgonia.Let(y, yv); err != nil {
					return err
				}
				if s.noSync {
					d.SetSync(j == s.micro-1)
				}
				if err := vm.RunAll(); err != nil {
					return fmt.Errorf("step %d pass %d: %w (ddp: %v)", step, j, err, d.Err())
				}
				if !s.noSync || j == s.micro-1 {
					if err := solver.Step(gorgonia.NodesToValueGrads(ps)); err != nil {
						return fmt.Errorf("step %d pass %d: %w", step, j, err)
					}
				}
				vm.Reset()
			}
			res[r].stats = append(res[r].stats, d.Stats())
		}
		res[r].d = d
		for _, p := range ps {
			res[r].params = append(res[r].params, toFloat64(p.Value()))
		}
		return nil
	})
	return res
}

// assertSameAcrossRanks checks that every rank holds bit-identical parameters.
func assertSameAcrossRanks(t *testing.T, res []rankResult) {
	t.Helper()
	for r := 1; r < len(res); r++ {
		assert.Equal(t, res[0].params, res[r].params, "rank %d's parameters differ from rank 0's", r)
	}
}

// maxRelErr is max over elements of |a-b| / max(1, |a|): an absolute error
// for values below 1 and a relative one above.
func maxRelErr(want, got [][]float64) float64 {
	var m float64
	for i := range want {
		for k := range want[i] {
			e := math.Abs(want[i][k]-got[i][k]) / math.Max(1, math.Abs(want[i][k]))
			m = math.Max(m, e)
		}
	}
	return m
}

// maxChange is the largest parameter change from init: to check that
// training moved the parameters (a no-op would match any reference...).
func maxDiff(a, b [][]float64) float64 {
	var m float64
	for i := range a {
		for k := range a[i] {
			m = math.Max(m, math.Abs(a[i][k]-b[i][k]))
		}
	}
	return m
}

// initialParams returns the values newParams gives with no perturbation.
func initialParams(dt tensor.Dtype, sizes []int) [][]float64 {
	buildMu.Lock()
	defer buildMu.Unlock()
	g := gorgonia.NewGraph()
	var out [][]float64
	for _, p := range newParams(g, dt, sizes, 0) {
		out = append(out, toFloat64(p.Value()))
	}
	return out
}

// smallModel builds a (3, 4, 2) f64 tanh MLP wrapped on pg, one bucket per
// parameter, with its data bound, and its machine (the caller closes it).
// Parameter direct (if >= 0) is used without its hook.
func smallModel(t *testing.T, pg *dist.ProcessGroup, direct int) (*DDP, gorgonia.Nodes, *gorgonia.Node, *gorgonia.Node, gorgonia.VM) {
	t.Helper()
	buildMu.Lock()
	g := gorgonia.NewGraph()
	ps := newParams(g, tensor.Float64, []int{3, 4, 2}, 0)
	buildMu.Unlock()
	d, err := Wrap(t.Context(), pg, ps, WithBucketCap(1))
	require.NoError(t, err)
	buildMu.Lock()
	defer buildMu.Unlock()
	x := gorgonia.NewMatrix(g, tensor.Float64, gorgonia.WithShape(2, 3), gorgonia.WithName("x"))
	y := gorgonia.NewMatrix(g, tensor.Float64, gorgonia.WithShape(2, 2), gorgonia.WithName("y"))
	out, err := forward(x, len(ps), func(i int) (*gorgonia.Node, error) {
		if i == direct {
			return ps[i], nil
		}
		return d.Hook(ps[i])
	}, nil)
	require.NoError(t, err)
	loss, err := mseLoss(out, y)
	require.NoError(t, err)
	_, err = gorgonia.Grad(loss, ps...)
	require.NoError(t, err)
	xv, yv := batch(tensor.Float64, 0, 0, 2, 3, 2)
	require.NoError(t, gorgonia.Let(x, xv))
	require.NoError(t, gorgonia.Let(y, yv))
	return d, ps, x, y, gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(ps...))
}
