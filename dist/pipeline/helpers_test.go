package pipeline

import (
	"context"
	"fmt"
	"math"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/internal/disttest"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(childMain(role))
	}
	goleak.VerifyTestMain(m)
}

// runRanks runs fn on n in-process ranks, one goroutine each, and returns
// their errors. A rank's group is closed when its fn returns.
func runRanks(t *testing.T, n int, fn func(pg *dist.ProcessGroup) error) []error {
	t.Helper()
	ts := transport.NewLocal(n)
	return runOn(t, ts, fn)
}

func runOn(t *testing.T, ts []*transport.Local, fn func(pg *dist.ProcessGroup) error) []error {
	t.Helper()
	return disttest.Run(t, disttest.Groups(t, ts, dist.WithTimeout(30*time.Second)), func(_ int, pg *dist.ProcessGroup) error {
		return fn(pg)
	})
}

// ---- a small MLP that splits by layers ----

// mlpStage is layers [from, to) of an MLP with the given widths: layer i is
// x·w_i + b_i, followed by tanh except for the model's last layer.
type mlpStage struct {
	sizes    []int
	from, to int
	batch    int
	dt       tensor.Dtype
	params   gorgonia.Nodes
}

// paramVal is the deterministic initial value of layer l's weight (k = 0)
// or bias (k = 1) element i.
func paramVal(l, k, i int) float64 {
	return 0.5 * math.Sin(1.7*float64(l)+0.31*float64(i)+2.3*float64(k)+0.1)
}

func newMLPStage(g *gorgonia.ExprGraph, sizes []int, from, to, batch int, dt tensor.Dtype) *mlpStage {
	s := &mlpStage{sizes: sizes, from: from, to: to, batch: batch, dt: dt}
	for l := from; l < to; l++ {
		in, out := sizes[l], sizes[l+1]
		w := make([]float64, in*out)
		for i := range w {
			w[i] = paramVal(l, 0, i) / math.Sqrt(float64(in))
		}
		b := make([]float64, out)
		for i := range b {
			b[i] = 0.1 * paramVal(l, 1, i)
		}
		s.params = append(s.params,
			gorgonia.NewMatrix(g, dt, gorgonia.WithShape(in, out), gorgonia.WithName(fmt.Sprintf("w%d", l)),
				gorgonia.WithValue(denseOf(dt, []int{in, out}, w))),
			gorgonia.NewVector(g, dt, gorgonia.WithShape(out), gorgonia.WithName(fmt.Sprintf("b%d", l)),
				gorgonia.WithValue(denseOf(dt, []int{out}, b))))
	}
	return s
}

func (s *mlpStage) InputShape() tensor.Shape   { return tensor.Shape{s.batch, s.sizes[s.from]} }
func (s *mlpStage) OutputShape() tensor.Shape  { return tensor.Shape{s.batch, s.sizes[s.to]} }
func (s *mlpStage) Learnables() gorgonia.Nodes { return append(gorgonia.Nodes(nil), s.params...) }
func (s *mlpStage) Dtype() tensor.Dtype        { return s.dt }

func (s *mlpStage) Forward(x *gorgonia.Node) (*gorgonia.Node, error) {
	h := x
	for l := s.from; l < s.to; l++ {
		k := 2 * (l - s.from)
		z, err := gorgonia.Mul(h, s.params[k])
		if err != nil {
			return nil, err
		}
		if z, err = gorgonia.BroadcastAdd(z, s.params[k+1], nil, []byte{0}); err != nil {
			return nil, err
		}
		if l < len(s.sizes)-2 {
			if z, err = gorgonia.Tanh(z); err != nil {
				return nil, err
			}
		}
		h = z
	}
	return h, nil
}

// mseLoss is the mean squared error over all elements.
func mseLoss(out, target *gorgonia.Node) (*gorgonia.Node, error) {
	d, err := gorgonia.Sub(out, target)
	if err != nil {
		return nil, err
	}
	sq, err := gorgonia.Square(d)
	if err != nil {
		return nil, err
	}
	return gorgonia.Mean(sq)
}

func denseOf(dt tensor.Dtype, shape []int, vals []float64) *tensor.Dense {
	if dt == tensor.Float32 {
		f := make([]float32, len(vals))
		for i, v := range vals {
			f[i] = float32(v)
		}
		return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(f))
	}
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(vals))
}

// splitLayers returns stage s's layer range [from, to) when L layers are
// split into p contiguous stages as evenly as possible.
func splitLayers(L, p, s int) (from, to int) {
	return s * L / p, (s + 1) * L / p
}

// Deterministic batch data: step, row, column.
func xval(step, row, col int) float64 {
	return math.Sin(0.7*float64(step) + 1.3*float64(row) + 0.37*float64(col))
}
func yval(step, row, col int) float64 {
	return math.Cos(0.5*float64(step) + 0.9*float64(row) + 1.1*float64(col))
}

// fillRows writes rows [lo, lo+rows) of f into t (float32 or float64).
func fillRows(t *tensor.Dense, lo int, f func(row, col int) float64) {
	shape := t.Shape()
	cols := shape[len(shape)-1]
	switch d := t.Data().(type) {
	case []float64:
		for i := range d {
			d[i] = f(lo+i/cols, i%cols)
		}
	case []float32:
		for i := range d {
			d[i] = float32(f(lo+i/cols, i%cols))
		}
	}
}

// mlpData returns the Data of step `step` for micro-batches of mbRows rows.
func mlpData(step, mbRows int, out func(mb int, o *tensor.Dense) error) Data {
	return Data{
		Input:  func(mb int, in *tensor.Dense) error { fillRows(in, mb*mbRows, curry(xval, step)); return nil },
		Target: func(mb int, t *tensor.Dense) error { fillRows(t, mb*mbRows, curry(yval, step)); return nil },
		Output: out,
	}
}

func curry(f func(step, row, col int) float64, step int) func(row, col int) float64 {
	return func(row, col int) float64 { return f(step, row, col) }
}

// testModel is a model the tests split into stages: Layers pipeline
// layers, stage s of p getting [s*Layers/p, (s+1)*Layers/p).
type testModel struct {
	Layers int
	// Build builds layers [from, to) for micro-batches of n samples.
	Build func(from, to, n int) Builder
	Loss  LossFunc
	// Data is step `step`'s batch for micro-batches of n samples.
	Data func(step, n int, out func(mb int, o *tensor.Dense) error) Data
}

func (tm testModel) stageBuilder(p, stage, n int) Builder {
	from, to := splitLayers(tm.Layers, p, stage)
	return tm.Build(from, to, n)
}

func mlpModel(sizes []int, dt tensor.Dtype) testModel {
	return testModel{
		Layers: len(sizes) - 1,
		Build: func(from, to, n int) Builder {
			return func(g *gorgonia.ExprGraph) (Stage, error) { return newMLPStage(g, sizes, from, to, n, dt), nil }
		},
		Loss: mseLoss,
		Data: mlpData,
	}
}

// refResult is what a run reports: the last step's loss, the gradients
// of every parameter (in layer order) and the outputs.
type refResult struct {
	loss  float64
	grads [][]float64
	out   []float64
}

// reference runs the whole model in one graph on a batch of n samples for
// `steps` steps of SGD (learning rate lr).
func reference(tm testModel, n, steps int, lr float64) (res refResult, err error) {
	buildMu.Lock()
	g := gorgonia.NewGraph()
	stg, err := tm.Build(0, tm.Layers, n)(g)
	if err != nil {
		buildMu.Unlock()
		return res, err
	}
	dt, _ := stageDtype(stg)
	inV := tensor.New(tensor.Of(dt), tensor.WithShape(stg.InputShape()...))
	in := gorgonia.NewTensor(g, dt, inV.Dims(), gorgonia.WithShape(inV.Shape()...), gorgonia.WithName("x"), gorgonia.WithValue(inV))
	out, err := stg.Forward(in)
	if err != nil {
		buildMu.Unlock()
		return res, err
	}
	tV := tensor.New(tensor.Of(dt), tensor.WithShape(out.Shape()...))
	target := gorgonia.NewTensor(g, dt, tV.Dims(), gorgonia.WithShape(tV.Shape()...), gorgonia.WithName("y"), gorgonia.WithValue(tV))
	loss, err := tm.Loss(out, target)
	if err != nil {
		buildMu.Unlock()
		return res, err
	}
	var lossV, outV gorgonia.Value
	gorgonia.Read(loss, &lossV)
	gorgonia.Read(out, &outV)
	params := stg.Learnables()
	if _, err = gorgonia.Grad(loss, params...); err != nil {
		buildMu.Unlock()
		return res, err
	}
	vm := gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(params...))
	buildMu.Unlock()
	defer vm.Close()
	solver := gorgonia.NewVanillaSolver(gorgonia.WithLearnRate(lr))
	for step := range steps {
		d := tm.Data(step, n, nil)
		if err := d.Input(0, inV); err != nil {
			return res, err
		}
		if err := d.Target(0, tV); err != nil {
			return res, err
		}
		if err := vm.RunAll(); err != nil {
			return res, err
		}
		vm.Reset()
		if res.loss, err = scalarOf(lossV); err != nil {
			return res, err
		}
		if res.grads, err = gradsOf(params); err != nil {
			return res, err
		}
		res.out = append(res.out[:0], outV.(*tensor.Dense).Data().([]float64)...)
		if step < steps-1 {
			if err := solver.Step(gorgonia.NodesToValueGrads(params)); err != nil {
				return res, err
			}
		}
	}
	return res, nil
}

// referenceInfer runs the whole model forward in one graph on m
// micro-batches of n samples of step 0's data and returns the outputs.
func referenceInfer(tm testModel, n, m int) ([]float64, error) {
	buildMu.Lock()
	g := gorgonia.NewGraph()
	stg, err := tm.Build(0, tm.Layers, n)(g)
	if err != nil {
		buildMu.Unlock()
		return nil, err
	}
	dt, _ := stageDtype(stg)
	inV := tensor.New(tensor.Of(dt), tensor.WithShape(stg.InputShape()...))
	in := gorgonia.NewTensor(g, dt, inV.Dims(), gorgonia.WithShape(inV.Shape()...), gorgonia.WithName("x"), gorgonia.WithValue(inV))
	out, err := stg.Forward(in)
	if err != nil {
		buildMu.Unlock()
		return nil, err
	}
	var outV gorgonia.Value
	gorgonia.Read(out, &outV)
	vm := gorgonia.NewTapeMachine(g)
	buildMu.Unlock()
	defer vm.Close()
	var res []float64
	d := tm.Data(0, n, nil)
	for mb := range m {
		if err := d.Input(mb, inV); err != nil {
			return nil, err
		}
		if err := vm.RunAll(); err != nil {
			return nil, err
		}
		vm.Reset()
		res = append(res, outV.(*tensor.Dense).Data().([]float64)...)
	}
	return res, nil
}

// trainStages runs `steps` SGD steps of the model on this rank's stage of
// pg with m micro-batches of n samples, and returns the last step's
// result: loss and outputs on the last stage, this stage's gradients.
func trainStages(ctx context.Context, pg *dist.ProcessGroup, tm testModel, m, n, steps int, lr float64, opts ...Option) (refResult, Stats, error) {
	var res refResult
	pl, err := New(ctx, pg, tm.stageBuilder(pg.WorldSize(), pg.Rank(), n),
		append([]Option{WithMicroBatches(m), WithLoss(tm.Loss)}, opts...)...)
	if err != nil {
		return res, Stats{}, err
	}
	defer pl.Close()
	solver := gorgonia.NewVanillaSolver(gorgonia.WithLearnRate(lr))
	for step := range steps {
		res.out = res.out[:0]
		loss, err := pl.TrainStep(ctx, tm.Data(step, n, func(mb int, o *tensor.Dense) error {
			res.out = append(res.out, o.Data().([]float64)...)
			return nil
		}))
		if err != nil {
			return res, Stats{}, err
		}
		res.loss = loss
		if step < steps-1 {
			if err := solver.Step(gorgonia.NodesToValueGrads(pl.Learnables())); err != nil {
				return res, Stats{}, err
			}
		}
	}
	res.grads, err = gradsOf(pl.Learnables())
	return res, pl.Stats(), err
}

// compareTraining checks a pipeline run against the reference: gradients
// and loss within tol; it returns the largest gradient difference.
func compareTraining(grads [][]float64, last, ref refResult, tol float64) (float64, error) {
	if len(grads) != len(ref.grads) {
		return 0, fmt.Errorf("%d gradients, reference has %d", len(grads), len(ref.grads))
	}
	worst := 0.0
	for i := range grads {
		if len(grads[i]) != len(ref.grads[i]) {
			return 0, fmt.Errorf("gradient %d has %d values, reference %d", i, len(grads[i]), len(ref.grads[i]))
		}
		for j := range grads[i] {
			worst = math.Max(worst, math.Abs(grads[i][j]-ref.grads[i][j]))
		}
	}
	if worst > tol {
		return worst, fmt.Errorf("max |grad - reference| = %g > %g", worst, tol)
	}
	if d := math.Abs(last.loss - ref.loss); d > tol {
		return worst, fmt.Errorf("loss %v, reference %v", last.loss, ref.loss)
	}
	return worst, nil
}

// maxAbsDiff returns max |a_i - b_i|; a and b must have equal lengths.
func maxAbsDiff(t *testing.T, a, b []float64) float64 {
	t.Helper()
	require.Equal(t, len(a), len(b))
	m := 0.0
	for i := range a {
		m = math.Max(m, math.Abs(a[i]-b[i]))
	}
	return m
}

func gradsOf(ns gorgonia.Nodes) ([][]float64, error) {
	var out [][]float64
	for _, n := range ns {
		d, err := gradData(n)
		if err != nil {
			return nil, err
		}
		out = append(out, append([]float64(nil), d.([]float64)...))
	}
	return out, nil
}
