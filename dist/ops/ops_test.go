package ops_test

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
	"github.com/gdist/gdist/dist/ops"
	"github.com/gdist/gdist/dist/transport/transporttest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// buildMu serialises Gorgonia graph construction and differentiation, which
// touch package globals, across the rank goroutines of one test.
var buildMu sync.Mutex

// runRanks runs fn on n in-process ranks, one goroutine each, and fails t
// with every rank's error. A rank's group is closed when its fn returns, so a
// failing rank makes its peers fail instead of hang.
func runRanks(t *testing.T, n int, fn func(pg *dist.ProcessGroup) error) {
	t.Helper()
	disttest.Check(t, n, fn, dist.WithTimeout(20*time.Second))
}

// valueOf returns rank r's deterministic input element i.
func valueOf(r, i int) float64 {
	return 0.5*float64(r+1) + 0.25*float64(i) - 1 + 0.1*math.Sin(float64(7*r+i))
}

// weightOf returns rank r's deterministic loss weight for output element i.
func weightOf(r, i int) float64 { return math.Cos(float64(3*r+i)) + 0.1*float64(r) }

func seq(n int, f func(i int) float64) []float64 {
	s := make([]float64, n)
	for i := range s {
		s[i] = f(i)
	}
	return s
}

// makeTensor returns a tensor of dt holding vals (over a backing slice,
// never nil, so that tensors without elements work too).
func makeTensor(dt tensor.Dtype, shape tensor.Shape, vals []float64) tensor.Tensor {
	if dt == tensor.Float32 {
		f := make([]float32, len(vals))
		for i, v := range vals {
			f[i] = float32(v)
		}
		return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(f))
	}
	f := make([]float64, len(vals))
	copy(f, vals)
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(f))
}

// floats copies a Float32 or Float64 value to []float64. A tensor without
// elements gives an empty slice (the tensor package panics on its Data).
func floats(t testing.TB, v gorgonia.Value) []float64 {
	if s := v.Shape(); len(s) > 0 && s.TotalSize() == 0 {
		return []float64{}
	}
	switch d := v.Data().(type) {
	case []float64:
		return append([]float64(nil), d...)
	case []float32:
		out := make([]float64, len(d))
		for i, x := range d {
			out[i] = float64(x)
		}
		return out
	case float64:
		return []float64{d}
	case float32:
		return []float64{float64(d)}
	}
	t.Fatalf("unexpected data %T", v.Data())
	return nil
}

// closeTo reports whether got is within tol of want, relative to max(1, |want|).
func closeTo(want, got, tol float64) bool {
	return math.Abs(want-got) <= tol*math.Max(1, math.Abs(want))
}

func assertClose(t *testing.T, want, got []float64, tol float64, msg string, args ...any) {
	t.Helper()
	if !assert.Len(t, got, len(want), msg) {
		return
	}
	for i := range want {
		if !closeTo(want[i], got[i], tol) {
			assert.Failf(t, "mismatch", "%s: element %d: want %v, got %v (tol %g)", fmt.Sprintf(msg, args...), i, want[i], got[i], tol)
			return
		}
	}
}

// collectiveCase describes one collective and its single-process reference.
type collectiveCase struct {
	name  string
	build func(pg *dist.ProcessGroup, x *gorgonia.Node) (*gorgonia.Node, error)
	// outRows is the output's first dimension for an input of rows rows.
	outRows func(rows, n int) int
	// ref computes every rank's output and input gradient from every rank's
	// input xs and loss weights ws (loss = Σ_r Σ_i y_r[i]·w_r[i]).
	ref func(n int, xs, ws [][]float64) (ys, gs [][]float64)
}

func sumOf(vs [][]float64) []float64 {
	out := make([]float64, len(vs[0]))
	for _, v := range vs {
		for i, x := range v {
			out[i] += x
		}
	}
	return out
}

func scale(v []float64, s float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = x * s
	}
	return out
}

func repeat(n int, v []float64) [][]float64 {
	out := make([][]float64, n)
	for i := range out {
		out[i] = append([]float64(nil), v...)
	}
	return out
}

func cases() []collectiveCase {
	same := func(rows, n int) int { return rows }
	allReduce := func(op dist.ReduceOp) collectiveCase {
		return collectiveCase{
			name: "AllReduce/" + op.String(),
			build: func(pg *dist.ProcessGroup, x *gorgonia.Node) (*gorgonia.Node, error) {
				return ops.AllReduce(pg, x, op)
			},
			outRows: same,
			ref: func(n int, xs, ws [][]float64) ([][]float64, [][]float64) {
				s := 1.0
				if op == dist.Mean {
					s = 1 / float64(n)
				}
				return repeat(n, scale(sumOf(xs), s)), repeat(n, scale(sumOf(ws), s))
			},
		}
	}
	reduceScatter := func(op dist.ReduceOp) collectiveCase {
		return collectiveCase{
			name: "ReduceScatter/" + op.String(),
			build: func(pg *dist.ProcessGroup, x *gorgonia.Node) (*gorgonia.Node, error) {
				return ops.ReduceScatter(pg, x, op)
			},
			outRows: func(rows, n int) int { return rows / n },
			ref: func(n int, xs, ws [][]float64) ([][]float64, [][]float64) {
				s := 1.0
				if op == dist.Mean {
					s = 1 / float64(n)
				}
				sum := scale(sumOf(xs), s)
				blk := len(sum) / n
				ys := make([][]float64, n)
				var g []float64
				for r := range n {
					ys[r] = sum[r*blk : (r+1)*blk]
					g = append(g, scale(ws[r], s)...)
				}
				return ys, repeat(n, g)
			},
		}
	}
	reduce := func(op dist.ReduceOp, root func(n int) int) collectiveCase {
		return collectiveCase{
			name: "Reduce/" + op.String(),
			build: func(pg *dist.ProcessGroup, x *gorgonia.Node) (*gorgonia.Node, error) {
				return ops.Reduce(pg, x, op, root(pg.WorldSize()))
			},
			outRows: same,
			ref: func(n int, xs, ws [][]float64) ([][]float64, [][]float64) {
				s := 1.0
				if op == dist.Mean {
					s = 1 / float64(n)
				}
				ys := make([][]float64, n)
				for r := range n {
					ys[r] = make([]float64, len(xs[r]))
				}
				ys[root(n)] = scale(sumOf(xs), s)
				return ys, repeat(n, scale(ws[root(n)], s))
			},
		}
	}
	last := func(n int) int { return n - 1 }
	first := func(int) int { return 0 }
	return []collectiveCase{
		allReduce(dist.Sum),
		allReduce(dist.Mean),
		{
			name:    "AllGather",
			build:   func(pg *dist.ProcessGroup, x *gorgonia.Node) (*gorgonia.Node, error) { return ops.AllGather(pg, x) },
			outRows: func(rows, n int) int { return rows * n },
			ref: func(n int, xs, ws [][]float64) ([][]float64, [][]float64) {
				var cat []float64
				for _, x := range xs {
					cat = append(cat, x...)
				}
				sw := sumOf(ws)
				blk := len(xs[0])
				gs := make([][]float64, n)
				for r := range n {
					gs[r] = sw[r*blk : (r+1)*blk]
				}
				return repeat(n, cat), gs
			},
		},
		reduceScatter(dist.Sum),
		reduceScatter(dist.Mean),
		{
			name: "Broadcast",
			build: func(pg *dist.ProcessGroup, x *gorgonia.Node) (*gorgonia.Node, error) {
				return ops.Broadcast(pg, x, pg.WorldSize()-1)
			},
			outRows: same,
			ref: func(n int, xs, ws [][]float64) ([][]float64, [][]float64) {
				gs := make([][]float64, n)
				for r := range n {
					gs[r] = make([]float64, len(xs[r]))
				}
				gs[n-1] = sumOf(ws)
				return repeat(n, xs[n-1]), gs
			},
		},
		reduce(dist.Sum, first),
		reduce(dist.Mean, last),
	}
}

// TestCollectiveValuesAndGradients runs each collective op in a real graph on
// 1, 2 and 3 ranks and compares every rank's output and input gradient with a
// single-process computation of loss = Σ_r Σ_i y_r[i]·w_r[i].
func TestCollectiveValuesAndGradients(t *testing.T) {
	for _, n := range []int{1, 2, 3} {
		for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			for _, c := range cases() {
				t.Run(fmt.Sprintf("n=%d/%v/%s", n, dt, c.name), func(t *testing.T) {
					tol := 1e-12
					if dt == tensor.Float32 {
						tol = 1e-5
					}
					rows, cols := 2*n, 3
					outRows := c.outRows(rows, n)
					xs := make([][]float64, n)
					ws := make([][]float64, n)
					for r := range n {
						xs[r] = seq(rows*cols, func(i int) float64 { return valueOf(r, i) })
						ws[r] = seq(outRows*cols, func(i int) float64 { return weightOf(r, i) })
					}
					wantY, wantG := c.ref(n, xs, ws)
					gotY := make([][]float64, n)
					gotG := make([][]float64, n)
					runRanks(t, n, func(pg *dist.ProcessGroup) error {
						r := pg.Rank()
						var err error
						gotY[r], gotG[r], err = runGraph(t, pg, dt, c.build, tensor.Shape{rows, cols}, xs[r], tensor.Shape{outRows, cols}, ws[r])
						return err
					})
					for r := range n {
						assertClose(t, wantY[r], gotY[r], tol, "rank %d output", r)
						assertClose(t, wantG[r], gotG[r], tol, "rank %d gradient", r)
					}
				})
			}
		}
	}
}

// TestScalarAllReduce all-reduces a scalar loss inside the graph (the usual
// way to compute a global mean loss) and differentiates through it.
func TestScalarAllReduce(t *testing.T) {
	const n = 3
	runRanks(t, n, func(pg *dist.ProcessGroup) error {
		r := float64(pg.Rank())
		buildMu.Lock()
		g := gorgonia.NewGraph()
		x := gorgonia.NewScalar(g, tensor.Float64, gorgonia.WithName("x"), gorgonia.WithValue(r+1))
		sq := gorgonia.Must(gorgonia.Square(x))
		mean, err := ops.AllReduce(pg, sq, dist.Mean)
		if err == nil {
			_, err = gorgonia.Grad(mean, x)
		}
		var mv gorgonia.Value
		gorgonia.Read(mean, &mv)
		buildMu.Unlock()
		if err != nil {
			return err
		}
		vm := gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(x))
		defer vm.Close()
		if err := vm.RunAll(); err != nil {
			return err
		}
		// mean = (1+4+9)/3; d(Σ_r mean_r)/dx_r = n · (2x_r/n) = 2x_r.
		assert.InDelta(t, 14.0/3, mv.Data().(float64), 1e-12)
		gx, err := x.Grad()
		if err != nil {
			return err
		}
		assert.InDelta(t, 2*(r+1), gx.Data().(float64), 1e-12)
		return nil
	})
}

// TestNumericGradient checks the gradient of a chain of every collective
// against central finite differences of the global loss Σ_r loss_r.
func TestNumericGradient(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			rows, cols := n, 2
			size := rows * cols
			runRanks(t, n, func(pg *dist.ProcessGroup) error {
				r := pg.Rank()
				xs := seq(size, func(i int) float64 { return valueOf(r, i) })
				return checkGraphGradient(t, pg, tensor.Shape{rows, cols}, xs, func(x *gorgonia.Node) (*gorgonia.Node, error) {
					a := gorgonia.NewConstant(makeTensor(tensor.Float64, tensor.Shape{rows * n, cols},
						seq(size*n, func(i int) float64 { return 1 + 0.5*weightOf(r, i) })))
					w := gorgonia.NewConstant(makeTensor(tensor.Float64, tensor.Shape{rows, cols},
						seq(size, func(i int) float64 { return weightOf(r+5, i) })))
					y, err := ops.AllGather(pg, gorgonia.Must(gorgonia.Tanh(x))) // (n·rows, cols)
					if err != nil {
						return nil, err
					}
					if y, err = ops.ReduceScatter(pg, gorgonia.Must(gorgonia.HadamardProd(y, a)), dist.Sum); err != nil {
						return nil, err
					}
					if y, err = ops.AllReduce(pg, gorgonia.Must(gorgonia.Square(y)), dist.Mean); err != nil {
						return nil, err
					}
					if y, err = ops.Broadcast(pg, y, n-1); err != nil {
						return nil, err
					}
					if y, err = ops.Reduce(pg, gorgonia.Must(gorgonia.HadamardProd(y, w)), dist.Sum, 0); err != nil {
						return nil, err
					}
					return gorgonia.Sum(gorgonia.Must(gorgonia.Square(y)))
				})
			})
		})
	}
}

// runGraph builds, on pg's rank, y = build(pg, x) for an input x of shape
// in holding xs and, unless w is nil, loss = Σ_i y[i]·w[i] (w of y's shape
// out) and its gradient; it runs the graph and returns y's value and, with
// w, x's gradient. y must have shape out.
func runGraph(t testing.TB, pg *dist.ProcessGroup, dt tensor.Dtype, build func(*dist.ProcessGroup, *gorgonia.Node) (*gorgonia.Node, error),
	in tensor.Shape, xs []float64, out tensor.Shape, w []float64) (y, gx []float64, err error) {
	buildMu.Lock()
	g := gorgonia.NewGraph()
	x := gorgonia.NewTensor(g, dt, len(in), gorgonia.WithShape(in...), gorgonia.WithName("x"),
		gorgonia.WithValue(makeTensor(dt, in, xs)))
	yn, err := build(pg, x)
	if err == nil && !yn.Shape().Eq(out) {
		err = fmt.Errorf("output shape %v, want %v", yn.Shape(), out)
	}
	if err == nil && w != nil {
		wn := gorgonia.NewConstant(makeTensor(dt, out, w), gorgonia.WithName("w"))
		loss := gorgonia.Must(gorgonia.Sum(gorgonia.Must(gorgonia.HadamardProd(yn, wn))))
		_, err = gorgonia.Grad(loss, x)
	}
	var yv gorgonia.Value
	if err == nil {
		gorgonia.Read(yn, &yv)
	}
	buildMu.Unlock()
	if err != nil {
		return nil, nil, err
	}
	var opts []gorgonia.VMOpt
	if w != nil {
		opts = append(opts, gorgonia.BindDualValues(x))
	}
	vm := gorgonia.NewTapeMachine(g, opts...)
	defer vm.Close()
	if err := vm.RunAll(); err != nil {
		return nil, nil, err
	}
	if w != nil {
		gv, err := x.Grad()
		if err != nil {
			return nil, nil, err
		}
		gx = floats(t, gv)
	}
	return floats(t, yv), gx, nil
}

// checkGraphGradient builds, on pg's rank, a Float64 graph with an input x
// of shape in holding xs and the scalar loss that lossOf adds (called under
// buildMu), and compares
// the gradient of the global loss Σ_r loss_r with respect to x with central
// finite differences. Every rank of pg calls it: the ranks perturb their x
// in turn, element by element, every run all-reducing the loss. Mismatches
// are reported on t; the error is that of building, a run or a collective.
func checkGraphGradient(t *testing.T, pg *dist.ProcessGroup, in tensor.Shape, xs []float64, lossOf func(x *gorgonia.Node) (*gorgonia.Node, error)) error {
	t.Helper()
	buildMu.Lock()
	g := gorgonia.NewGraph()
	xv := makeTensor(tensor.Float64, in, xs)
	x := gorgonia.NewTensor(g, tensor.Float64, len(in), gorgonia.WithShape(in...), gorgonia.WithName("x"), gorgonia.WithValue(xv))
	loss, err := lossOf(x)
	if err == nil {
		_, err = gorgonia.Grad(loss, x)
	}
	var lv gorgonia.Value
	if err == nil {
		gorgonia.Read(loss, &lv)
	}
	buildMu.Unlock()
	if err != nil {
		return err
	}
	vm := gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(x))
	defer vm.Close()
	data := xv.Data().([]float64)
	ctx := context.Background()
	total := func() (float64, error) {
		vm.Reset()
		if err := vm.RunAll(); err != nil {
			return 0, err
		}
		l := []float64{lv.Data().(float64)}
		err := pg.AllReduce(ctx, dist.F64(l), dist.Sum)
		return l[0], err
	}
	if _, err := total(); err != nil {
		return err
	}
	gv, err := x.Grad()
	if err != nil {
		return err
	}
	return disttest.CheckGradients(t, pg, total, []disttest.Gradient{{Name: "x", Data: data, Grad: floats(t, gv)}}, 1e-6, 1e-6)
}

// TestEachOpIsUnique checks that two identical collectives over the same
// input stay two nodes (Gorgonia merges nodes with equal hashes).
func TestEachOpIsUnique(t *testing.T) {
	pg := buildingGroup(t, 1)
	buildMu.Lock()
	defer buildMu.Unlock()
	g := gorgonia.NewGraph()
	x := gorgonia.NewVector(g, tensor.Float64, gorgonia.WithShape(4), gorgonia.WithName("x"))
	a, err := ops.AllReduce(pg, x, dist.Sum)
	require.NoError(t, err)
	b, err := ops.AllReduce(pg, x, dist.Sum)
	require.NoError(t, err)
	assert.NotSame(t, a, b)
	assert.NotEqual(t, a.ID(), b.ID())
	assert.NotEqual(t, a.Op().Hashcode(), b.Op().Hashcode())
}

// buildingGroup returns rank 0 of a group of n whose other ranks never
// run, for tests that only build graphs: the ops check their arguments
// before anything is sent. It is closed in t.Cleanup.
func buildingGroup(t *testing.T, n int) *dist.ProcessGroup {
	t.Helper()
	ts := transporttest.NewLocal(t, n)
	pg, err := dist.New(ts[0])
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, tr := range ts[1:] {
			tr.Close()
		}
		pg.Close()
	})
	return pg
}

func TestInvalidArguments(t *testing.T) {
	pg := buildingGroup(t, 2)
	buildMu.Lock()
	defer buildMu.Unlock()
	g := gorgonia.NewGraph()
	v := gorgonia.NewVector(g, tensor.Float64, gorgonia.WithShape(3), gorgonia.WithName("v"))
	s := gorgonia.NewScalar(g, tensor.Float64, gorgonia.WithName("s"))
	i := gorgonia.NewVector(g, tensor.Int, gorgonia.WithShape(4), gorgonia.WithName("i"))

	_, err := ops.AllReduce(pg, i, dist.Sum)
	assert.ErrorIs(t, err, dist.ErrUnsupportedDType)
	_, err = ops.AllGather(pg, s)
	assert.ErrorIs(t, err, dist.ErrInvalidArgument)
	_, err = ops.ReduceScatter(pg, v, dist.Sum) // 3 rows over 2 ranks
	assert.ErrorIs(t, err, dist.ErrInvalidArgument)
	_, err = ops.Broadcast(pg, v, 2)
	assert.ErrorIs(t, err, dist.ErrInvalidRank)
	_, err = ops.Reduce(pg, v, dist.Sum, -1)
	assert.ErrorIs(t, err, dist.ErrInvalidRank)
	_, err = ops.AllReduce(nil, v, dist.Sum)
	assert.ErrorIs(t, err, dist.ErrInvalidArgument)
	_, err = ops.AllReduce(pg, nil, dist.Sum)
	assert.ErrorIs(t, err, dist.ErrInvalidArgument)
}

// TestNotDifferentiable checks that Max runs forward, that its SymDiff fails
// with ErrNotDifferentiable and that the error of the real gorgonia.Grad
// path, a SymDiffError that does not unwrap, is recognised by
// IsNotDifferentiable.
func TestNotDifferentiable(t *testing.T) {
	runRanks(t, 2, func(pg *dist.ProcessGroup) error {
		buildMu.Lock()
		g := gorgonia.NewGraph()
		x := gorgonia.NewVector(g, tensor.Float64, gorgonia.WithShape(2), gorgonia.WithName("x"),
			gorgonia.WithValue(tensor.New(tensor.WithBacking([]float64{float64(pg.Rank()), 5 - float64(pg.Rank())}))))
		y, err := ops.AllReduce(pg, x, dist.Max)
		if err != nil {
			buildMu.Unlock()
			return err
		}
		loss := gorgonia.Must(gorgonia.Sum(y))
		_, gradErr := gorgonia.Grad(loss, x)
		_, symErr := y.Op().(gorgonia.SDOp).SymDiff(gorgonia.Nodes{x}, y, loss)
		var yv gorgonia.Value
		gorgonia.Read(y, &yv)
		buildMu.Unlock()
		require.Error(t, gradErr)
		assert.True(t, ops.IsNotDifferentiable(gradErr), "%v", gradErr)
		assert.True(t, ops.IsNotDifferentiable(fmt.Errorf("train: %w", gradErr)), "wrapped")
		assert.NotErrorIs(t, gradErr, ops.ErrNotDifferentiable, "Gorgonia's error does not unwrap (if it ever does, IsNotDifferentiable is still right)")
		assert.ErrorIs(t, symErr, ops.ErrNotDifferentiable)
		assert.True(t, ops.IsNotDifferentiable(symErr))
		// Other errors are not taken for it.
		assert.False(t, ops.IsNotDifferentiable(nil))
		_, otherErr := gorgonia.Grad(y, x) // the cost is not a scalar
		require.Error(t, otherErr)
		assert.False(t, ops.IsNotDifferentiable(otherErr))
		vm := gorgonia.NewTapeMachine(g)
		defer vm.Close()
		if err := vm.RunAll(); err != nil {
			return err
		}
		assert.Equal(t, []float64{1, 5}, floats(t, yv))
		return nil
	})
}

// TestDoDoesNotWriteInput checks that a collective leaves its input register
// untouched (it works on a copy).
func TestDoDoesNotWriteInput(t *testing.T) {
	runRanks(t, 2, func(pg *dist.ProcessGroup) error {
		buildMu.Lock()
		g := gorgonia.NewGraph()
		in := tensor.New(tensor.WithBacking([]float32{1, 2, 3, 4}))
		x := gorgonia.NewVector(g, tensor.Float32, gorgonia.WithShape(4), gorgonia.WithName("x"), gorgonia.WithValue(in))
		y, err := ops.AllReduce(pg, x, dist.Sum)
		var yv gorgonia.Value
		if err == nil {
			gorgonia.Read(y, &yv)
		}
		buildMu.Unlock()
		if err != nil {
			return err
		}
		vm := gorgonia.NewTapeMachine(g)
		defer vm.Close()
		if err := vm.RunAll(); err != nil {
			return err
		}
		assert.Equal(t, []float32{1, 2, 3, 4}, in.Data())
		assert.Equal(t, []float32{2, 4, 6, 8}, yv.Data())
		return nil
	})
}

func TestErrorsSurface(t *testing.T) {
	// A collective whose peer is gone fails the run instead of hanging.
	ts := transporttest.NewLocal(t, 2)
	pg, err := dist.New(ts[0], dist.WithTimeout(5*time.Second))
	require.NoError(t, err)
	defer pg.Close()
	ts[1].Kill()
	buildMu.Lock()
	g := gorgonia.NewGraph()
	x := gorgonia.NewVector(g, tensor.Float64, gorgonia.WithShape(2), gorgonia.WithName("x"),
		gorgonia.WithValue(tensor.New(tensor.WithBacking([]float64{1, 2}))))
	_, err = ops.AllReduce(pg, x, dist.Sum)
	buildMu.Unlock()
	require.NoError(t, err)
	vm := gorgonia.NewTapeMachine(g)
	defer vm.Close()
	err = vm.RunAll()
	require.Error(t, err)
}

// TestMismatchedGraphsFail builds different collectives on the two ranks:
// both runs fail (the group detects the desync) instead of hanging.
func TestMismatchedGraphsFail(t *testing.T) {
	ts := transporttest.NewLocal(t, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		pg, err := dist.New(ts[r], dist.WithTimeout(10*time.Second))
		require.NoError(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer pg.Close()
			buildMu.Lock()
			g := gorgonia.NewGraph()
			x := gorgonia.NewVector(g, tensor.Float64, gorgonia.WithShape(2), gorgonia.WithName("x"),
				gorgonia.WithValue(tensor.New(tensor.WithBacking([]float64{1, 2}))))
			if r == 0 {
				_, err = ops.AllReduce(pg, x, dist.Sum)
			} else {
				_, err = ops.AllGather(pg, x)
			}
			buildMu.Unlock()
			if err != nil {
				errs[r] = err
				return
			}
			vm := gorgonia.NewTapeMachine(g)
			defer vm.Close()
			errs[r] = vm.RunAll()
		}()
	}
	wg.Wait()
	for r, err := range errs {
		assert.Error(t, err, "rank %d", r)
	}
}
