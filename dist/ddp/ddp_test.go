package ddp

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
)

var (
	sgd  = func() gorgonia.Solver { return gorgonia.NewVanillaSolver(gorgonia.WithLearnRate(0.2)) }
	adam = func() gorgonia.Solver { return gorgonia.NewAdamSolver(gorgonia.WithLearnRate(0.01)) }
)

// Tolerances against the single-process reference, as maxRelErr (absolute
// below 1, relative above): float64 1e-12, float32 1e-5.
func tolerance(dt tensor.Dtype) float64 {
	if dt == tensor.Float32 {
		return 1e-5
	}
	return 1e-12
}

// TestMatchesSingleProcess is the core property: N ranks each training on
// B/N samples end with the parameters one process gets on all B samples.
func TestMatchesSingleProcess(t *testing.T) {
	sizes := []int{4, 6, 5, 3}
	type variant struct {
		name    string
		opts    []Option
		micro   int
		noSync  bool
		upfront bool
	}
	variants := []variant{
		{name: "default"},
		// Small caps: a bucket per parameter or two, and parameters larger than the cap.
		{name: "many-buckets", opts: []Option{WithBucketCap(40), WithFirstBucketCap(8)}},
		{name: "no-overlap", opts: []Option{WithOverlap(false), WithBucketCap(64)}},
		{name: "upfront-hooks", upfront: true, opts: []Option{WithBucketCap(64)}},
		{name: "accumulation", micro: 2, opts: []Option{WithBucketCap(64)}},
	}
	solvers := map[string]func() gorgonia.Solver{"sgd": sgd, "adam": adam}
	for _, n := range []int{1, 2, 3} {
		for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			for sname, solver := range solvers {
				for _, v := range variants {
					t.Run(fmt.Sprintf("n=%d/%v/%s/%s", n, dt, sname, v.name), func(t *testing.T) {
						s := trainSetup{n: n, steps: 4, micro: max(v.micro, 1), batch: 12, sizes: sizes, dt: dt,
							solver: solver, opts: v.opts, noSync: v.noSync, upfront: v.upfront}
						want := trainReference(t, s, solver())
						res := trainDDP(t, s)
						assertSameAcrossRanks(t, res)
						require.Greater(t, maxDiff(want, initialParams(dt, sizes)), 1e-3, "training must move the parameters")
						e := maxRelErr(want, res[0].params)
						assert.LessOrEqual(t, e, tolerance(dt), "max error vs single process")
						t.Logf("max error %.3g", e)
					})
				}
			}
		}
	}
}

// TestNoSyncAccumulation accumulates with SetSync(false): the gradients of
// the micro passes are summed (as Gorgonia and PyTorch's no_sync do), so SGD
// with learning rate η matches one process with η·micro on the full batch.
func TestNoSyncAccumulation(t *testing.T) {
	for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
		t.Run(dt.String(), func(t *testing.T) {
			const micro = 2
			s := trainSetup{n: 3, steps: 3, micro: micro, batch: 12, sizes: []int{4, 6, 3}, dt: dt,
				solver: sgd, noSync: true, opts: []Option{WithBucketCap(64)}}
			want := trainReference(t, s, gorgonia.NewVanillaSolver(gorgonia.WithLearnRate(0.2*micro)))
			res := trainDDP(t, s)
			assertSameAcrossRanks(t, res)
			e := maxRelErr(want, res[0].params)
			assert.LessOrEqual(t, e, tolerance(dt))
			for _, st := range res[0].stats {
				assert.Equal(t, micro, st.Passes)
			}
		})
	}
}

// TestCompression all-reduces in F16 and BF16. The result is only close to
// the uncompressed one: each gradient element is rounded to the wire type
// (relative error 2^-11 for F16, 2^-8 for BF16) at every hop, so after 4 SGD
// steps (learning rate 0.2, gradients below ~1) parameters may differ by
// about steps·lr·|g|·(n hops)·ε. The tolerances (F16 2e-3, BF16 2e-2,
// absolute below 1 / relative above) leave a margin of several times that.
// Every rank still ends with identical parameters.
func TestCompression(t *testing.T) {
	cases := []struct {
		wire dist.DType
		dt   tensor.Dtype
		tol  float64
	}{
		{dist.Float16, tensor.Float32, 2e-3},
		{dist.BFloat16, tensor.Float32, 2e-2},
		{dist.Float16, tensor.Float64, 2e-3},
		{dist.BFloat16, tensor.Float64, 2e-2},
		{dist.Float32, tensor.Float64, 1e-5},
	}
	for _, c := range cases {
		for _, n := range []int{1, 2, 3} {
			t.Run(fmt.Sprintf("%v/%v/n=%d", c.wire, c.dt, n), func(t *testing.T) {
				s := trainSetup{n: n, steps: 4, micro: 1, batch: 12, sizes: []int{4, 6, 5, 3}, dt: c.dt, solver: sgd,
					opts: []Option{WithCompression(c.wire), WithBucketCap(64)}}
				want := trainReference(t, s, sgd())
				res := trainDDP(t, s)
				assertSameAcrossRanks(t, res)
				e := maxRelErr(want, res[0].params)
				assert.LessOrEqual(t, e, c.tol)
				assert.Greater(t, e, 0.0, "compression should be visible")
				t.Logf("max error %.3g", e)
				assert.Equal(t, int64(c.wire.Size()*(4*6+6+6*5+5+5*3+3)), res[0].stats[0].Bytes)
			})
		}
	}
	t.Run("accumulation", func(t *testing.T) {
		s := trainSetup{n: 2, steps: 3, micro: 3, batch: 12, sizes: []int{4, 6, 3}, dt: tensor.Float32, solver: sgd,
			opts: []Option{WithCompression(dist.Float16)}}
		want := trainReference(t, s, sgd())
		res := trainDDP(t, s)
		assertSameAcrossRanks(t, res)
		assert.LessOrEqual(t, maxRelErr(want, res[0].params), 2e-3)
	})
}

func TestBuckets(t *testing.T) {
	runRanks(t, 1, func(pg *dist.ProcessGroup) error {
		buildMu.Lock()
		g := gorgonia.NewGraph()
		// sizes 4·6=24, 6, 30, 5, 15, 3 float64s: 192, 48, 240, 40, 120, 24 bytes.
		ps := newParams(g, tensor.Float64, []int{4, 6, 5, 3}, 0)
		buildMu.Unlock()
		for _, c := range []struct {
			opts []Option
			want [][]int
		}{
			{nil, [][]int{{5, 4, 3, 2, 1, 0}}},
			// first cap 150: b2(24)+w2(120) fit, b1 would exceed; later cap 300.
			{[]Option{WithFirstBucketCap(150), WithBucketCap(300)}, [][]int{{5, 4}, {3, 2}, {1, 0}}},
			// everything above the cap gets its own bucket.
			{[]Option{WithFirstBucketCap(1), WithBucketCap(1)}, [][]int{{5}, {4}, {3}, {2}, {1}, {0}}},
		} {
			d, err := Wrap(t.Context(), pg, ps, c.opts...)
			if err != nil {
				return err
			}
			assert.Equal(t, c.want, d.Buckets())
		}
		return nil
	})
}

func TestMixedDtypesSplitBuckets(t *testing.T) {
	runRanks(t, 2, func(pg *dist.ProcessGroup) error {
		buildMu.Lock()
		g := gorgonia.NewGraph()
		a := gorgonia.NewVector(g, tensor.Float32, gorgonia.WithShape(3), gorgonia.WithName("a"), gorgonia.WithInit(gorgonia.Ones()))
		b := gorgonia.NewVector(g, tensor.Float64, gorgonia.WithShape(3), gorgonia.WithName("b"), gorgonia.WithInit(gorgonia.Ones()))
		c := gorgonia.NewScalar(g, tensor.Float32, gorgonia.WithName("c"), gorgonia.WithValue(float32(pg.Rank()+1)))
		buildMu.Unlock()
		d, err := Wrap(t.Context(), pg, gorgonia.Nodes{a, b, c})
		if err != nil {
			return err
		}
		assert.Equal(t, [][]int{{2}, {1}, {0}}, d.Buckets())
		assert.Equal(t, float32(1), c.Value().Data(), "scalar broadcast from rank 0")
		return nil
	})
}

func TestOptionsValidated(t *testing.T) {
	runRanks(t, 1, func(pg *dist.ProcessGroup) error {
		buildMu.Lock()
		g := gorgonia.NewGraph()
		ps := newParams(g, tensor.Float64, []int{2, 2}, 0)
		iv := gorgonia.NewVector(g, tensor.Int, gorgonia.WithShape(2), gorgonia.WithName("i"), gorgonia.WithInit(gorgonia.Zeroes()))
		noValue := gorgonia.NewVector(g, tensor.Float64, gorgonia.WithShape(2), gorgonia.WithName("nv"))
		buildMu.Unlock()
		ctx := t.Context()
		for _, tc := range []struct {
			o    Option
			name string
		}{
			{WithBucketCap(0), "WithBucketCap(0)"},
			{WithBucketCap(-5), "WithBucketCap(-5)"},
			{WithFirstBucketCap(-1), "WithFirstBucketCap(-1)"},
			{WithFirstBucketCap(0), "WithFirstBucketCap(0)"},
			{WithAccumulation(0), "WithAccumulation(0)"},
			{WithCompression(dist.Float64), "WithCompression(f64)"},
			{WithCompression(0), "WithCompression("},
			{nil, "option 0 is nil"},
		} {
			_, err := Wrap(ctx, pg, ps, tc.o)
			assert.ErrorIs(t, err, dist.ErrInvalidArgument)
			if assert.Error(t, err) {
				assert.Contains(t, err.Error(), tc.name)
			}
		}
		// The first refusal wins; valid options before it do not matter.
		_, err := Wrap(ctx, pg, ps, WithOverlap(false), WithAccumulation(-1), WithBucketCap(0))
		assert.ErrorContains(t, err, "WithAccumulation(-1)")
		_, err = Wrap(ctx, pg, nil)
		assert.ErrorIs(t, err, dist.ErrInvalidArgument)
		_, err = Wrap(ctx, nil, ps)
		assert.ErrorIs(t, err, dist.ErrInvalidArgument)
		_, err = Wrap(ctx, pg, gorgonia.Nodes{ps[0], ps[0]})
		assert.ErrorIs(t, err, dist.ErrInvalidArgument)
		_, err = Wrap(ctx, pg, gorgonia.Nodes{iv})
		assert.ErrorIs(t, err, dist.ErrUnsupportedDType)
		_, err = Wrap(ctx, pg, gorgonia.Nodes{noValue})
		assert.ErrorIs(t, err, dist.ErrInvalidArgument)
		other := gorgonia.NewGraph()
		buildMu.Lock()
		op := newParams(other, tensor.Float64, []int{2, 2}, 0)
		buildMu.Unlock()
		_, err = Wrap(ctx, pg, gorgonia.Nodes{ps[0], op[0]})
		assert.ErrorIs(t, err, dist.ErrInvalidArgument)

		d, err := Wrap(ctx, pg, ps[:1])
		if err != nil {
			return err
		}
		_, err = d.Hook(ps[1])
		assert.ErrorIs(t, err, ErrNotParam)
		err = d.Solver(sgd()).Step(gorgonia.NodesToValueGrads(ps))
		assert.ErrorIs(t, err, ErrNotParam)
		assert.ErrorIs(t, d.Sync(ctx), ErrNoGradients)
		return nil
	})
}
