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
	"github.com/gdist/gdist/dist/disttest"
	"github.com/gdist/gdist/dist/pipeline/pipelinetest"
	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/transporttest"
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
	ts := transporttest.NewLocal(t, n)
	return runOn(t, ts, fn)
}

func runOn(t *testing.T, ts []*transport.Local, fn func(pg *dist.ProcessGroup) error) []error {
	t.Helper()
	return disttest.Run(t, disttest.Groups(t, ts, dist.WithTimeout(30*time.Second)), func(_ int, pg *dist.ProcessGroup) error {
		return fn(pg)
	})
}

// The small MLP that splits by layers, and its loss, are shared with bench/pipeline.
var (
	newMLPStage = pipelinetest.NewMLPStage
	mseLoss     = pipelinetest.MSE
)

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

// trainInterleaved is trainStages for NewInterleaved with v chunks per
// rank: it returns the last step's result (gradients left empty) and the
// gradients of each chunk.
func trainInterleaved(ctx context.Context, pg *dist.ProcessGroup, tm testModel, v, m, n, steps int, lr float64, opts ...Option) (refResult, [][][]float64, error) {
	var res refResult
	V := pg.WorldSize() * v
	pl, err := NewInterleaved(ctx, pg, v, func(g *gorgonia.ExprGraph, vs int) (Stage, error) {
		return tm.stageBuilder(V, vs, n)(g)
	}, append([]Option{WithMicroBatches(m), WithLoss(tm.Loss)}, opts...)...)
	if err != nil {
		return res, nil, err
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
			return res, nil, err
		}
		res.loss = loss
		if step < steps-1 {
			if err := solver.Step(gorgonia.NodesToValueGrads(pl.Learnables())); err != nil {
				return res, nil, err
			}
		}
	}
	var grads [][][]float64
	for _, st := range pl.Stages() {
		g, err := gradsOf(st.Learnables())
		if err != nil {
			return res, nil, err
		}
		grads = append(grads, g)
	}
	return res, grads, nil
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
