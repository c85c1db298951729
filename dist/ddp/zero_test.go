package ddp_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/ddp"
	"github.com/gdist/gdist/dist/disttest"
	"github.com/gdist/gdist/models/mlp"
	"github.com/gdist/gdist/train/optim"
)

// zeroRun is one training run of the equivalence tests.
type zeroRun struct {
	ranks, rows, steps int
	dt                 tensor.Dtype
	sizes              []int
	solver             string // "sgd", "momentum", "adam" or "gorgonia-adam"
	stage              int    // WithZeRO's
	opts               []ddp.Option
	// rotate gives rank r the rows of rank (r+rotate)%ranks, and reverse
	// reverses every rank's rows: the same global batch, summed in another
	// order.
	rotate  int
	reverse bool
}

func (z zeroRun) newSolver() (gorgonia.Solver, error) {
	switch z.solver {
	case "sgd":
		return optim.NewSGD(optim.WithLearnRate(0.05))
	case "momentum":
		return optim.NewMomentum(optim.WithLearnRate(0.05), optim.WithMomentum(0.9))
	case "adam":
		return optim.NewAdam(optim.WithLearnRate(0.01))
	case "gorgonia-adam":
		return gorgonia.NewAdamSolver(gorgonia.WithLearnRate(0.01)), nil
	}
	return nil, fmt.Errorf("unknown solver %q", z.solver)
}

// run trains on z.ranks in-process ranks and returns the final parameters
// (the same on every rank, which it checks) in float64.
func (z zeroRun) run(t *testing.T) []float64 {
	t.Helper()
	groups := disttest.Cluster(t, z.ranks, dist.WithTimeout(30*time.Second))
	out, errs := disttest.Results(t, groups, func(rank int, pg *dist.ProcessGroup) ([]float64, error) {
		return z.train(pg)
	})
	require.NoError(t, errors.Join(errs...))
	for r := 1; r < z.ranks; r++ {
		require.Equal(t, out[0], out[r], "rank %d's parameters differ from rank 0's", r)
	}
	return out[0]
}

func (z zeroRun) train(pg *dist.ProcessGroup) ([]float64, error) {
	optimBuildMu.Lock()
	g := gorgonia.NewGraph()
	m, err := mlp.New(g, mlp.Config{Sizes: z.sizes, Batch: z.rows, Dtype: z.dt, Seed: 5})
	optimBuildMu.Unlock()
	if err != nil {
		return nil, err
	}
	params := m.Learnables()
	d, err := ddp.Wrap(context.Background(), pg, params, append([]ddp.Option{ddp.WithZeRO(z.stage)}, z.opts...)...)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	optimBuildMu.Lock()
	x, y := m.NewInputs()
	var loss *gorgonia.Node
	logits, err := m.ForwardHooked(x, d.Hook)
	if err == nil {
		loss, err = mlp.Loss(logits, y)
	}
	if err == nil {
		_, err = gorgonia.Grad(loss, params...)
	}
	optimBuildMu.Unlock()
	if err != nil {
		return nil, err
	}
	var vmOpts []gorgonia.VMOpt
	if z.solver == "gorgonia-adam" || z.stage == 0 {
		vmOpts = append(vmOpts, gorgonia.BindDualValues(params...))
	}
	vm := gorgonia.NewTapeMachine(g, vmOpts...)
	defer vm.Close()
	inner, err := z.newSolver()
	if err != nil {
		return nil, err
	}
	solver := d.Solver(inner)
	src := (pg.Rank() + z.rotate) % z.ranks
	classes := z.sizes[len(z.sizes)-1]
	for step := range z.steps {
		xv, yv := optimBatch(z.dt, step, src*z.rows, (src+1)*z.rows, z.sizes[0], classes)
		if z.reverse {
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
	var out []float64
	for _, p := range params {
		switch v := p.Value().Data().(type) {
		case []float32:
			for _, e := range v {
				out = append(out, float64(e))
			}
		case []float64:
			out = append(out, v...)
		}
	}
	return out, nil
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

// relDiff is the relative L2 difference ||a-b|| / ||b||.
func relDiff(a, b []float64) float64 {
	var d, m float64
	for i := range a {
		d += (a[i] - b[i]) * (a[i] - b[i])
		m += b[i] * b[i]
	}
	return math.Sqrt(d / m)
}

// zeroBuckets makes several buckets of the test models, so that pieces
// cross parameters and buckets are padded.
var zeroBuckets = []ddp.Option{ddp.WithBucketCap(256), ddp.WithFirstBucketCap(128)}

// TestZeROMatchesDDP trains an MLP for 100 steps with DDP, ZeRO-1 and ZeRO-2
// on 2, 3 and 4 ranks with each solver. In float64 the parameters agree to
// 1e-12 (relative L2 difference); in float32 ZeRO differs from DDP by at
// most twice what DDP itself differs by when the same global batch is
// summed in another order (the rows dealt to other ranks, or reversed
// within each rank), measured in the same test. On 2 ranks the reduce-
// scatter adds the two ranks' gradients exactly as the all-reduce does, and
// the parameters are bitwise DDP's.
func TestZeROMatchesDDP(t *testing.T) {
	for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
		for _, solver := range []string{"sgd", "momentum", "adam"} {
			for _, ranks := range []int{2, 3, 4} {
				t.Run(fmt.Sprintf("%v/%s/%d", dt, solver, ranks), func(t *testing.T) {
					base := zeroRun{ranks: ranks, rows: 3, steps: 100, dt: dt, sizes: []int{11, 16, 12, 5}, solver: solver, opts: zeroBuckets}
					want := base.run(t)
					var control float64
					if dt == tensor.Float32 {
						for rot := range ranks {
							for _, rev := range []bool{false, true} {
								if rot == 0 && !rev {
									continue
								}
								z := base
								z.rotate, z.reverse = rot, rev
								c := relDiff(z.run(t), want)
								t.Logf("reordered (rows of rank r+%d, reversed %t): %.3g", rot, rev, c)
								control = max(control, c)
							}
						}
					}
					for _, stage := range []int{1, 2} {
						z := base
						z.stage = stage
						got := z.run(t)
						diff := relDiff(got, want)
						t.Logf("ZeRO-%d: relative difference to DDP %.3g (reordered sums: %.3g)", stage, diff, control)
						if ranks == 2 {
							assert.Equal(t, want, got, "ZeRO-%d on 2 ranks: bitwise DDP", stage)
						}
						if dt == tensor.Float64 {
							assert.LessOrEqual(t, diff, 1e-12, "ZeRO-%d", stage)
						} else {
							assert.LessOrEqual(t, diff, 2*control, "ZeRO-%d", stage)
						}
					}
				})
			}
		}
	}
}

// TestZeROClip: with WithMaxGradNorm small enough to clip every step, ZeRO's
// norm (each rank's squares, all-reduced) gives DDP's training to 1e-12.
func TestZeROClip(t *testing.T) {
	opts := append([]ddp.Option{ddp.WithMaxGradNorm(0.05)}, zeroBuckets...)
	base := zeroRun{ranks: 3, rows: 3, steps: 100, dt: tensor.Float64, sizes: []int{11, 16, 12, 5}, solver: "momentum", opts: opts}
	want := base.run(t)
	unclipped := base
	unclipped.opts = zeroBuckets
	require.Greater(t, relDiff(unclipped.run(t), want), 1e-3, "the clip changes training")
	for _, stage := range []int{1, 2} {
		z := base
		z.stage = stage
		diff := relDiff(z.run(t), want)
		t.Logf("ZeRO-%d with clipping: relative difference to DDP %.3g", stage, diff)
		assert.LessOrEqual(t, diff, 1e-12, "ZeRO-%d", stage)
	}
}

// TestZeROAnySolver: a Gorgonia solver steps the shards too.
func TestZeROAnySolver(t *testing.T) {
	base := zeroRun{ranks: 2, rows: 3, steps: 20, dt: tensor.Float64, sizes: []int{11, 16, 12, 5}, solver: "gorgonia-adam", opts: zeroBuckets}
	want := base.run(t)
	for _, stage := range []int{1, 2} {
		z := base
		z.stage = stage
		assert.Equal(t, want, z.run(t), "ZeRO-%d", stage)
	}
}

// TestZeROAccumulation: ZeRO-1 accumulates over passes as DDP does; ZeRO-2
// refuses to.
func TestZeROAccumulation(t *testing.T) {
	opts := append([]ddp.Option{ddp.WithAccumulation(3)}, zeroBuckets...)
	base := zeroRun{ranks: 3, rows: 2, steps: 30, dt: tensor.Float64, sizes: []int{11, 16, 12, 5}, solver: "adam", opts: opts}
	want := base.run(t)
	z := base
	z.stage = 1
	assert.LessOrEqual(t, relDiff(z.run(t), want), 1e-12)

	_, err := ddp.Wrap(context.Background(), nil, nil, ddp.WithZeRO(2), ddp.WithAccumulation(2))
	assert.ErrorIs(t, err, dist.ErrInvalidArgument)
	runRanksExt(t, 2, func(pg *dist.ProcessGroup) error {
		optimBuildMu.Lock()
		g := gorgonia.NewGraph()
		m, err := mlp.New(g, mlp.Config{Sizes: []int{4, 3}, Batch: 2, Dtype: tensor.Float64, Seed: 1})
		optimBuildMu.Unlock()
		if err != nil {
			return err
		}
		d, err := ddp.Wrap(context.Background(), pg, m.Learnables(), ddp.WithZeRO(2))
		if err != nil {
			return err
		}
		defer d.Close()
		optimBuildMu.Lock()
		x, y := m.NewInputs()
		logits, err := m.ForwardHooked(x, d.Hook)
		var loss *gorgonia.Node
		if err == nil {
			loss, err = mlp.Loss(logits, y)
		}
		if err == nil {
			_, err = gorgonia.Grad(loss, m.Learnables()...)
		}
		optimBuildMu.Unlock()
		if err != nil {
			return err
		}
		xv, yv := optimBatch(tensor.Float64, 0, 0, 2, 4, 3)
		if err := gorgonia.Let(x, xv); err != nil {
			return err
		}
		if err := gorgonia.Let(y, yv); err != nil {
			return err
		}
		vm := gorgonia.NewTapeMachine(g)
		defer vm.Close()
		d.SetSync(false)
		assert.Error(t, vm.RunAll())
		assert.ErrorIs(t, d.Err(), ddp.ErrUnsupported)
		return nil
	})
}

// TestZeROOptions: misapplied options are refused.
func TestZeROOptions(t *testing.T) {
	for name, opts := range map[string][]ddp.Option{
		"stage 3":            {ddp.WithZeRO(3)},
		"stage -1":           {ddp.WithZeRO(-1)},
		"compression":        {ddp.WithZeRO(1), ddp.WithCompression(dist.Float16)},
		"zero2 no overlap":   {ddp.WithZeRO(2), ddp.WithOverlap(false)},
		"max grad norm 0":    {ddp.WithMaxGradNorm(0)},
		"max grad norm +Inf": {ddp.WithMaxGradNorm(math.Inf(1))},
	} {
		_, err := ddp.Wrap(context.Background(), nil, nil, opts...)
		assert.ErrorIs(t, err, dist.ErrInvalidArgument, name)
	}
}

// runRanksExt runs fn on n in-process ranks.
func runRanksExt(t *testing.T, n int, fn func(pg *dist.ProcessGroup) error) {
	t.Helper()
	groups := disttest.Cluster(t, n, dist.WithTimeout(30*time.Second))
	require.NoError(t, errors.Join(disttest.Run(t, groups, func(_ int, pg *dist.ProcessGroup) error { return fn(pg) })...))
}

// TestZeROMemory counts, on 4 ranks after a step with Adam, the optimizer
// state each rank holds (from the solver's tensors) and the DDP's own
// buffers: ZeRO's optimizer state is 1/4 of DDP's within 5 %, and so are
// its gradient pieces; ZeRO-2 keeps two staging buffers, the size of the
// largest even and the largest odd bucket, in place of one per bucket.
func TestZeROMemory(t *testing.T) {
	const ranks = 4
	sizes := []int{64, 128, 64, 10}
	type measure struct {
		opt     int64
		mem     ddp.Memory
		staging int64 // the largest even and the largest odd bucket, padded
	}
	measureStage := func(stage int) []measure {
		groups := disttest.Cluster(t, ranks, dist.WithTimeout(30*time.Second))
		out, errs := disttest.Results(t, groups, func(rank int, pg *dist.ProcessGroup) (measure, error) {
			optimBuildMu.Lock()
			g := gorgonia.NewGraph()
			m, err := mlp.New(g, mlp.Config{Sizes: sizes, Batch: 2, Seed: 1})
			optimBuildMu.Unlock()
			if err != nil {
				return measure{}, err
			}
			params := m.Learnables()
			d, err := ddp.Wrap(context.Background(), pg, params, ddp.WithZeRO(stage), ddp.WithBucketCap(8<<10), ddp.WithFirstBucketCap(4<<10))
			if err != nil {
				return measure{}, err
			}
			defer d.Close()
			optimBuildMu.Lock()
			x, y := m.NewInputs()
			logits, err := m.ForwardHooked(x, d.Hook)
			var loss *gorgonia.Node
			if err == nil {
				loss, err = mlp.Loss(logits, y)
			}
			if err == nil {
				_, err = gorgonia.Grad(loss, params...)
			}
			optimBuildMu.Unlock()
			if err != nil {
				return measure{}, err
			}
			xv, yv := optimBatch(tensor.Float32, 0, 2*rank, 2*rank+2, sizes[0], sizes[len(sizes)-1])
			if err := gorgonia.Let(x, xv); err != nil {
				return measure{}, err
			}
			if err := gorgonia.Let(y, yv); err != nil {
				return measure{}, err
			}
			vm := gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(params...))
			defer vm.Close()
			adam, err := optim.NewAdam()
			if err != nil {
				return measure{}, err
			}
			if err := vm.RunAll(); err != nil {
				return measure{}, err
			}
			if err := d.Solver(adam).Step(gorgonia.NodesToValueGrads(params)); err != nil {
				return measure{}, err
			}
			var opt int64
			for _, p := range adam.State().Params {
				for _, s := range p.Slots {
					opt += int64(4*len(s.F32) + 8*len(s.F64))
				}
			}
			var big [2]int64
			for bi, b := range d.Buckets() {
				n := 0
				for _, i := range b {
					n += params[i].Shape().TotalSize()
				}
				big[bi%2] = max(big[bi%2], int64(4*ranks*((n+ranks-1)/ranks)))
			}
			return measure{opt: opt, mem: d.Memory(), staging: big[0] + big[1]}, nil
		})
		require.NoError(t, errors.Join(errs...))
		return out
	}
	plain := measureStage(0)
	var model int64
	for l := 0; l+1 < len(sizes); l++ {
		model += int64(4 * (sizes[l]*sizes[l+1] + sizes[l+1]))
	}
	require.Equal(t, 2*model, plain[0].opt, "DDP: Adam's two moments of every parameter")
	require.Equal(t, model, plain[0].mem.Buckets)
	for _, stage := range []int{1, 2} {
		for r, m := range measureStage(stage) {
			t.Logf("ZeRO-%d rank %d: optimizer %d B (DDP %d), gradient pieces %d B, buckets %d B", stage, r, m.opt, plain[r].opt, m.mem.Shards, m.mem.Buckets)
			assert.InEpsilon(t, float64(plain[r].opt)/ranks, float64(m.opt), 0.05, "ZeRO-%d rank %d optimizer state", stage, r)
			assert.InEpsilon(t, float64(model)/ranks, float64(m.mem.Shards), 0.05, "ZeRO-%d rank %d gradient pieces", stage, r)
			if stage == 1 {
				assert.GreaterOrEqual(t, m.mem.Buckets, model, "ZeRO-1 keeps every bucket")
			} else {
				assert.Equal(t, m.staging, m.mem.Buckets, "ZeRO-2 keeps two staging buffers")
			}
		}
	}
}
