// Package dptest trains a small MLP data-parallel on in-process ranks under
// any wrapper (DDP, ZeRO, FSDP), so that the wrappers' tests compare their
// training with one another on the same runs.
package dptest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/disttest"
	"github.com/gdist/gdist/models/mlp"
	"github.com/gdist/gdist/train/optim"
)

// BuildMu serialises Gorgonia graph construction across the rank goroutines
// of a test (it touches package globals).
var BuildMu sync.Mutex

// Wrapped is a wrapper around one rank's model.
type Wrapped struct {
	// Hook stands for a parameter at its use in the forward pass.
	Hook func(*gorgonia.Node) (*gorgonia.Node, error)
	// Solver wraps the inner solver.
	Solver func(inner gorgonia.Solver) gorgonia.Solver
	// Params returns the whole parameters after training, in the model's
	// order (a collective for sharded wrappers); nil means the model's own
	// values.
	Params func(ctx context.Context) ([]tensor.Tensor, error)
	// BindDual binds the parameters' dual values (plain DDP needs them).
	BindDual bool
	Close    func() error
}

// Run is one training run.
type Run struct {
	Ranks, Rows, Steps int
	Dtype              tensor.Dtype
	Sizes              []int
	Solver             string // "sgd", "momentum", "adam" or "gorgonia-adam"
	// Rotate gives rank r the rows of rank (r+Rotate)%Ranks, and Reverse
	// reverses every rank's rows: the same global batch, summed in another
	// order.
	Rotate  int
	Reverse bool
	// Wrap wraps one rank's model (called outside BuildMu: it may run
	// collectives).
	Wrap func(ctx context.Context, pg *dist.ProcessGroup, m *mlp.Model) (*Wrapped, error)
}

// NewSolver returns the run's inner solver.
func (z Run) NewSolver() (gorgonia.Solver, error) {
	switch z.Solver {
	case "sgd":
		return optim.NewSGD(optim.WithLearnRate(0.05))
	case "momentum":
		return optim.NewMomentum(optim.WithLearnRate(0.05), optim.WithMomentum(0.9))
	case "adam":
		return optim.NewAdam(optim.WithLearnRate(0.01))
	case "gorgonia-adam":
		return gorgonia.NewAdamSolver(gorgonia.WithLearnRate(0.01)), nil
	}
	return nil, fmt.Errorf("unknown solver %q", z.Solver)
}

// Train trains on z.Ranks in-process ranks and returns the final parameters
// in float64, after checking that every rank holds the same.
func (z Run) Train(t testing.TB) []float64 {
	t.Helper()
	groups := disttest.Cluster(t, z.Ranks, dist.WithTimeout(30*time.Second))
	out, errs := disttest.Results(t, groups, func(rank int, pg *dist.ProcessGroup) ([]float64, error) {
		return z.train(pg)
	})
	require.NoError(t, errors.Join(errs...))
	for r := 1; r < z.Ranks; r++ {
		require.Equal(t, out[0], out[r], "rank %d's parameters differ from rank 0's", r)
	}
	return out[0]
}

func (z Run) train(pg *dist.ProcessGroup) (_ []float64, err error) {
	ctx := context.Background()
	BuildMu.Lock()
	g := gorgonia.NewGraph()
	m, err := mlp.New(g, mlp.Config{Sizes: z.Sizes, Batch: z.Rows, Dtype: z.Dtype, Seed: 5})
	BuildMu.Unlock()
	if err != nil {
		return nil, err
	}
	params := m.Learnables()
	w, err := z.Wrap(ctx, pg, m)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, w.Close()) }()
	x, y, _, err := Build(m, w.Hook)
	if err != nil {
		return nil, err
	}
	var vmOpts []gorgonia.VMOpt
	if w.BindDual {
		vmOpts = append(vmOpts, gorgonia.BindDualValues(params...))
	}
	vm := gorgonia.NewTapeMachine(g, vmOpts...)
	defer vm.Close()
	inner, err := z.NewSolver()
	if err != nil {
		return nil, err
	}
	solver := w.Solver(inner)
	src := (pg.Rank() + z.Rotate) % z.Ranks
	classes := z.Sizes[len(z.Sizes)-1]
	for step := range z.Steps {
		xv, yv := Batch(z.Dtype, step, src*z.Rows, (src+1)*z.Rows, z.Sizes[0], classes)
		if z.Reverse {
			xv, yv = reverseRows(xv), reverseRows(yv)
		}
		if err := gorgonia.Let(x, xv); err != nil {
			return nil, err
		}
		if err := gorgonia.Let(y, yv); err != nil {
			return nil, err
		}
		if err := vm.RunAll(); err != nil {
			return nil, err
		}
		if err := solver.Step(gorgonia.NodesToValueGrads(params)); err != nil {
			return nil, err
		}
		vm.Reset()
	}
	var ts []tensor.Tensor
	if w.Params != nil {
		if ts, err = w.Params(ctx); err != nil {
			return nil, err
		}
	} else {
		for _, p := range params {
			ts = append(ts, p.Value().(tensor.Tensor))
		}
	}
	return Flatten(ts), nil
}

// StateBytes is the bytes of the per-parameter state (Adam's moments, a
// velocity) an optim.Solver holds, counted from its tensors; 0 for another
// solver.
func StateBytes(s gorgonia.Solver) int64 {
	o, ok := s.(optim.Solver)
	if !ok {
		return 0
	}
	var n int64
	for _, p := range o.State().Params {
		for _, sl := range p.Slots {
			n += int64(4*len(sl.F32) + 8*len(sl.F64))
		}
	}
	return n
}

// Build adds to m's graph, under BuildMu, the inputs, the forward pass with
// hook at every use of a parameter, the mean cross-entropy loss and its
// gradients with respect to the parameters.
func Build(m *mlp.Model, hook func(*gorgonia.Node) (*gorgonia.Node, error)) (x, y, loss *gorgonia.Node, err error) {
	BuildMu.Lock()
	defer BuildMu.Unlock()
	x, y = m.NewInputs()
	logits, err := m.ForwardHooked(x, hook)
	if err != nil {
		return nil, nil, nil, err
	}
	if loss, err = mlp.Loss(logits, y); err != nil {
		return nil, nil, nil, err
	}
	if _, err = gorgonia.Grad(loss, m.Learnables()...); err != nil {
		return nil, nil, nil, err
	}
	return x, y, loss, nil
}

// Flatten returns the elements of ts, in order, in float64.
func Flatten(ts []tensor.Tensor) []float64 {
	var out []float64
	for _, t := range ts {
		switch v := t.Data().(type) {
		case []float32:
			for _, e := range v {
				out = append(out, float64(e))
			}
		case []float64:
			out = append(out, v...)
		}
	}
	return out
}

// Batch returns rows [lo, hi) of step s's inputs and one-hot targets.
func Batch(dt tensor.Dtype, s, lo, hi, in, classes int) (x, y tensor.Tensor) {
	xs := make([]float64, 0, (hi-lo)*in)
	ys := make([]float64, (hi-lo)*classes)
	for r := lo; r < hi; r++ {
		for c := range in {
			xs = append(xs, math.Sin(0.7*float64(s)+1.3*float64(r)+0.37*float64(c)))
		}
		ys[(r-lo)*classes+(3*r+s)%classes] = 1
	}
	return dense(dt, []int{hi - lo, in}, xs), dense(dt, []int{hi - lo, classes}, ys)
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

// reverseRows returns t's rows in reverse order.
func reverseRows(t tensor.Tensor) tensor.Tensor {
	d := t.(*tensor.Dense)
	rows, cols := d.Shape()[0], d.Shape()[1]
	out := d.Clone().(*tensor.Dense)
	switch v := d.Data().(type) {
	case []float32:
		o := out.Data().([]float32)
		for r := range rows {
			copy(o[(rows-1-r)*cols:(rows-r)*cols], v[r*cols:(r+1)*cols])
		}
	case []float64:
		o := out.Data().([]float64)
		for r := range rows {
			copy(o[(rows-1-r)*cols:(rows-r)*cols], v[r*cols:(r+1)*cols])
		}
	}
	return out
}

// RelDiff is the relative L2 difference ||a-b|| / ||b||.
func RelDiff(a, b []float64) float64 {
	var d, m float64
	for i := range a {
		d += (a[i] - b[i]) * (a[i] - b[i])
		m += b[i] * b[i]
	}
	return math.Sqrt(d / m)
}

// ReorderControl trains z with the global batch summed in every other order
// (the rows dealt to the ranks rotated, reversed within each rank, or both)
// and returns the largest relative difference to want: the difference that
// merely reordering the same sums makes, against which a sharded wrapper's
// difference is judged.
func (z Run) ReorderControl(t testing.TB, want []float64) float64 {
	var control float64
	for rot := range z.Ranks {
		for _, rev := range []bool{false, true} {
			if rot == 0 && !rev {
				continue
			}
			c := z
			c.Rotate, c.Reverse = rot, rev
			d := RelDiff(c.Train(t), want)
			t.Logf("reordered (rows of rank r+%d, reversed %t): %.3g", rot, rev, d)
			control = max(control, d)
		}
	}
	return control
}
