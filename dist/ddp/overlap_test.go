package ddp

import (
	"context"
	"errors"
	"fmt"
	"hash"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/chewxy/hm"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/internal/shard"
	"github.com/gdist/gdist/dist/transport"
)

// probeOp is an identity op whose gradient op counts how far the backward
// pass has got: its counter rises by one when backprop passes the layer the
// probe sits on.
type probeOp struct {
	id      int
	counter *atomic.Int64
	grad    bool
}

func (op *probeOp) Arity() int { return 1 }
func (op *probeOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	return hm.NewFnType(a, a)
}
func (op *probeOp) InferShape(in ...gorgonia.DimSizer) (tensor.Shape, error) {
	return in[0].(tensor.Shape).Clone(), nil
}
func (op *probeOp) Do(in ...gorgonia.Value) (gorgonia.Value, error) {
	if op.grad {
		op.counter.Add(1)
	}
	return shard.Clone(in[0])
}
func (op *probeOp) ReturnsPtr() bool          { return false }
func (op *probeOp) CallsExtern() bool         { return false }
func (op *probeOp) OverwritesInput() int      { return -1 }
func (op *probeOp) WriteHash(h hash.Hash)     { fmt.Fprintf(h, "probe%d/%v", op.id, op.grad) }
func (op *probeOp) Hashcode() uint32          { return shard.HashOf(op) }
func (op *probeOp) String() string            { return fmt.Sprintf("probe%d/%v", op.id, op.grad) }
func (op *probeOp) DiffWRT(inputs int) []bool { return []bool{true} }
func (op *probeOp) SymDiff(in gorgonia.Nodes, out, grad *gorgonia.Node) (gorgonia.Nodes, error) {
	n, err := gorgonia.ApplyOp(&probeOp{id: op.id, counter: op.counter, grad: true}, grad)
	return gorgonia.Nodes{n}, err
}

// overlapRun trains one step of a 4-layer MLP on 2 ranks with one bucket
// per parameter and reports, for rank 0, how many hidden layers the backward
// pass had passed (of 3) when each bucket's all-reduce was launched, plus the
// number of parameter gradients that arrived after the first launch.
func overlapRun(t *testing.T, upfront bool, opts ...Option) (launchProgress []int64, gradsAfterFirstLaunch int, st Stats) {
	const n = 2
	sizes := []int{64, 96, 96, 96, 8}
	const mb = 32
	var mu sync.Mutex
	runRanks(t, n, func(pg *dist.ProcessGroup) error {
		var counter atomic.Int64
		buildMu.Lock()
		g := gorgonia.NewGraph()
		ps := newParams(g, tensor.Float64, sizes, 0)
		buildMu.Unlock()
		d, err := Wrap(context.Background(), pg, ps, append([]Option{WithFirstBucketCap(1), WithBucketCap(1)}, opts...)...)
		if err != nil {
			return err
		}
		var progress []int64
		grads, launched := 0, false
		if pg.Rank() == 0 {
			d.trace = func(ev event) { // called with d.mu held, on the machine's goroutine or in Sync
				switch ev.kind {
				case "launch":
					progress = append(progress, counter.Load())
					launched = true
				case "grad":
					if launched {
						grads++
					}
				}
			}
		}
		buildMu.Lock()
		x := gorgonia.NewMatrix(g, tensor.Float64, gorgonia.WithShape(mb, sizes[0]), gorgonia.WithName("x"))
		y := gorgonia.NewMatrix(g, tensor.Float64, gorgonia.WithShape(mb, sizes[len(sizes)-1]), gorgonia.WithName("y"))
		use := func(i int) (*gorgonia.Node, error) { return d.Hook(ps[i]) }
		if upfront {
			hs, err := d.Hooked()
			if err != nil {
				buildMu.Unlock()
				return err
			}
			use = func(i int) (*gorgonia.Node, error) { return hs[i], nil }
		}
		probes := 0
		probe := func(z *gorgonia.Node) *gorgonia.Node {
			probes++
			return gorgonia.Must(gorgonia.ApplyOp(&probeOp{id: probes, counter: &counter}, z))
		}
		logits, err := forward(x, len(ps), use, probe)
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
		xv, yv := batch(tensor.Float64, 0, pg.Rank()*mb, (pg.Rank()+1)*mb, sizes[0], sizes[len(sizes)-1])
		if err := gorgonia.Let(x, xv); err != nil {
			return err
		}
		if err := gorgonia.Let(y, yv); err != nil {
			return err
		}
		if err := vm.RunAll(); err != nil {
			return err
		}
		if err := d.Solver(sgd()).Step(gorgonia.NodesToValueGrads(ps)); err != nil {
			return err
		}
		if pg.Rank() == 0 {
			mu.Lock()
			launchProgress, gradsAfterFirstLaunch, st = progress, grads, d.Stats()
			mu.Unlock()
		}
		return nil
	})
	return
}

// TestOverlap checks that a bucket's all-reduce starts while backprop is
// still running: with hooks created at each parameter's use, the first
// bucket (the last layer's bias) is launched before the backward pass has
// passed any hidden layer, and most gradients arrive after it. With all hooks
// created up front, or WithOverlap(false), nothing is launched before the
// backward pass is over.
func TestOverlap(t *testing.T) {
	const layers = 3 // hidden layers, each with a probe
	const params = 8

	progress, after, st := overlapRun(t, false)
	require.Len(t, progress, params)
	assert.Equal(t, int64(0), progress[0], "first bucket launched before backprop reached the hidden layers")
	assert.Less(t, progress[len(progress)-3], int64(layers), "buckets launched throughout backprop: %v", progress)
	assert.Equal(t, params-1, after, "gradients arriving after the first launch")
	assert.Equal(t, params, st.Buckets)
	assert.Equal(t, 1, st.Passes)
	assert.Equal(t, int64(8*(64*96+96+96*96+96+96*96+96+96*8+8)), st.Bytes)
	assert.Positive(t, st.Compute)
	assert.Positive(t, st.Comm)
	t.Logf("hooks at use:  launches at backward progress %v; stats %+v", progress, st)

	progress, after, st = overlapRun(t, true)
	require.Len(t, progress, params)
	assert.Equal(t, int64(layers), progress[0], "hooks created up front: gradient ops run after the whole backward pass")
	assert.Equal(t, params-1, after)
	t.Logf("hooks upfront: launches at backward progress %v; stats %+v", progress, st)

	progress, after, st = overlapRun(t, false, WithOverlap(false))
	require.Len(t, progress, params)
	assert.Equal(t, int64(layers), progress[0], "WithOverlap(false) launches in Sync")
	assert.Equal(t, 0, after)
	t.Logf("no overlap:    launches at backward progress %v; stats %+v", progress, st)
}

// TestHookGradientOrder inspects the graph: with hooks at each use, the
// gradient op of the last layer's weight is created (and so run) well before
// the end of the backward pass.
func TestHookGradientOrder(t *testing.T) {
	runRanks(t, 1, func(pg *dist.ProcessGroup) error {
		for _, upfront := range []bool{false, true} {
			buildMu.Lock()
			g := gorgonia.NewGraph()
			ps := newParams(g, tensor.Float64, []int{3, 4, 4, 2}, 0)
			buildMu.Unlock()
			d, err := Wrap(t.Context(), pg, ps)
			if err != nil {
				return err
			}
			buildMu.Lock()
			x := gorgonia.NewMatrix(g, tensor.Float64, gorgonia.WithShape(2, 3), gorgonia.WithName("x"))
			use := func(i int) (*gorgonia.Node, error) { return d.Hook(ps[i]) }
			if upfront {
				hs, _ := d.Hooked()
				use = func(i int) (*gorgonia.Node, error) { return hs[i], nil }
			}
			out, err := forward(x, len(ps), use, nil)
			if err == nil {
				var loss *gorgonia.Node
				loss, err = gorgonia.Sum(out)
				if err == nil {
					_, err = gorgonia.Grad(loss, ps...)
				}
			}
			buildMu.Unlock()
			if err != nil {
				return err
			}
			total := int64(len(g.AllNodes()))
			last := d.gradNodes[len(ps)-2].ID() // gradient op of the last weight
			first := d.gradNodes[0].ID()        // of the first weight
			if upfront {
				assert.Greater(t, last, total-int64(len(ps))-1, "upfront: gradient ops come last")
			} else {
				assert.Less(t, last, total/2+total/4, "at use: the last layer's gradient op is early in backprop")
				assert.Greater(t, first, last)
			}
			t.Logf("upfront=%v: gradient op ids %v..%v of %d nodes", upfront, last, first, total)
		}
		return nil
	})
}

func TestMisuse(t *testing.T) {
	build := smallModel

	t.Run("not-hooked", func(t *testing.T) {
		runRanks(t, 2, func(pg *dist.ProcessGroup) error {
			d, ps, _, _, vm := build(t, pg, 0)
			defer vm.Close()
			require.NoError(t, vm.RunAll())
			err := d.Solver(sgd()).Step(gorgonia.NodesToValueGrads(ps))
			assert.ErrorIs(t, err, ErrNotHooked)
			assert.ErrorIs(t, d.Err(), ErrNotHooked)
			return nil
		})
	})
	t.Run("sync-pending", func(t *testing.T) {
		runRanks(t, 1, func(pg *dist.ProcessGroup) error {
			d, _, _, _, vm := build(t, pg, -1)
			defer vm.Close()
			require.NoError(t, vm.RunAll())
			vm.Reset()
			assert.Error(t, vm.RunAll(), "second backward pass before Sync")
			assert.ErrorIs(t, d.Err(), ErrSyncPending)
			assert.ErrorIs(t, d.Sync(t.Context()), ErrSyncPending)
			return nil
		})
	})
	t.Run("sync-off-then-on", func(t *testing.T) {
		runRanks(t, 1, func(pg *dist.ProcessGroup) error {
			d, ps, _, _, vm := build(t, pg, -1)
			defer vm.Close()
			d.SetSync(false)
			for range 3 {
				require.NoError(t, vm.RunAll())
				vm.Reset()
			}
			// Sync all-reduces what the unsynchronised passes accumulated:
			// the sum of three identical passes (one rank).
			require.NoError(t, vm.RunAll()) // fourth pass, still unsynchronised
			g1 := toFloat64(d.gradNodes[0].Value())
			require.NoError(t, d.Sync(t.Context()))
			gv, err := ps[0].Grad()
			require.NoError(t, err)
			got := toFloat64(gv)
			for k := range got {
				assert.InDelta(t, 4*g1[k], got[k], 1e-12)
			}
			assert.Equal(t, 4, d.Stats().Passes)
			return nil
		})
	})
	t.Run("peer-lost", func(t *testing.T) {
		runRanks(t, 2, func(pg *dist.ProcessGroup) error {
			d, ps, _, _, vm := build(t, pg, -1)
			defer vm.Close()
			// Rank 1 must not die before rank 0's Wrap is over: rank 1
			// passes the barrier only once rank 0 has reached it.
			berr := pg.Barrier(t.Context())
			if pg.Rank() == 1 {
				require.NoError(t, berr)
				pg.Transport().(*transport.Local).Kill()
				return nil
			}
			_ = vm.RunAll() // may or may not fail, depending on when the loss is seen
			err := d.Solver(sgd()).Step(gorgonia.NodesToValueGrads(ps))
			require.Error(t, err)
			var pe *dist.PeerError
			assert.True(t, errors.As(err, &pe) || errors.Is(err, dist.ErrAborted) || errors.Is(err, dist.ErrClosed), "got %v", err)
			assert.Error(t, d.Err())
			return nil
		})
	})
}
