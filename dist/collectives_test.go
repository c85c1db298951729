package dist

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// algorithm configurations every collective is checked under: the defaults,
// and each algorithm forced for every size with tiny segments so that the
// segmenting paths run on small vectors too ("pair" is the all-reduce
// between 2 members on one host; "ring" turns it off).
var algoConfigs = []struct {
	name string
	opts []Option
}{
	{"default", nil},
	{"ring", []Option{WithSmallThreshold(0), withSegment(64), withPairSegment(0)}},
	{"pair", []Option{WithSmallThreshold(0), withSegment(64), withPairSegment(64)}},
	{"small", []Option{WithSmallThreshold(math.MaxInt), withSegment(64)}},
}

// testLengths returns the vector lengths checked for world size n: empty,
// one element, fewer elements than ranks, odd, and a few hundred.
func testLengths(n int) []int {
	ls := []int{0, 1, 7, 333}
	if n > 2 {
		ls = append(ls, n-1)
	}
	return ls
}

func TestCollectivesMatchReference(t *testing.T) {
	for n := 1; n <= 8; n++ {
		for _, cfg := range algoConfigs {
			t.Run(fmt.Sprintf("n=%d/%s", n, cfg.name), func(t *testing.T) {
				t.Parallel()
				c := newCluster(t, n, cfg.opts...)
				requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
					for _, length := range testLengths(n) {
						if err := checkRank(t, g, n, r, length); err != nil {
							return err
						}
					}
					return nil
				}))
			})
		}
	}
}

// checkRank runs every collective on every dtype and op once on rank r and
// compares with the reference. It runs concurrently on all ranks, so it
// reports mismatches with assert (safe from any goroutine).
func checkRank(t require.TestingT, g *ProcessGroup, n, r, length int) error {
	ctx := bg
	where := func(what string) string { return fmt.Sprintf("%s n=%d rank=%d len=%d", what, n, r, length) }
	for _, op := range allOps {
		if err := checkAllReduceOp(ctx, t, g, n, r, length, op, where); err != nil {
			return err
		}

		// ReduceScatter: rank r gets block r of the all-reduce of n blocks.
		src := make([]float32, n*length)
		for i := range src {
			src[i] = float32(exactInput(op, r, i))
		}
		srcCopy := slices.Clone(src)
		dst := make([]float32, length)
		if err := g.ReduceScatter(ctx, F32(dst), F32(src), op); err != nil {
			return err
		}
		full := refAllReduce(op, Float32, n, n*length)
		for i := range dst {
			if float64(dst[i]) != full[r*length+i] {
				assert.Failf(t, "wrong value", "%s %v: [%d] = %v, want %v", where("reduce_scatter"), op, i, dst[i], full[r*length+i])
				break
			}
		}
		assert.Equal(t, srcCopy, src, where("reduce_scatter leaves src alone"))
		src64 := make([]float64, n*length)
		for i := range src64 {
			src64[i] = exactInput(op, r, i)
		}
		dst64 := make([]float64, length)
		if err := g.ReduceScatter(ctx, F64(dst64), F64(src64), op); err != nil {
			return err
		}
		full = refAllReduce(op, Float64, n, n*length)
		assert.Equal(t, full[r*length:(r+1)*length], dst64, where("reduce_scatter f64"))

		// Reduce to every root; other ranks' data is unchanged.
		for root := range n {
			d := make([]float32, length)
			for i := range d {
				d[i] = float32(exactInput(op, r, i))
			}
			orig := slices.Clone(d)
			if err := g.Reduce(ctx, F32(d), op, root); err != nil {
				return err
			}
			if r == root {
				want := refAllReduce(op, Float32, n, length)
				for i := range d {
					if float64(d[i]) != want[i] {
						assert.Failf(t, "wrong value", "%s %v root %d: [%d] = %v, want %v", where("reduce"), op, root, i, d[i], want[i])
						break
					}
				}
			} else {
				assert.Equal(t, orig, d, where("reduce leaves non-root data alone"))
			}
		}
		d64 := make([]float64, length)
		for i := range d64 {
			d64[i] = exactInput(op, r, i)
		}
		if err := g.Reduce(ctx, F64(d64), op, n-1); err != nil {
			return err
		}
		if r == n-1 {
			assert.Equal(t, refAllReduce(op, Float64, n, length), d64, where("reduce f64"))
		}
	}

	// AllGather.
	src := make([]float32, length)
	for i := range src {
		src[i] = float32(r*1000 + i)
	}
	dst := make([]float32, n*length)
	if err := g.AllGather(ctx, F32(dst), F32(src)); err != nil {
		return err
	}
	for q := range n {
		for i := range length {
			if dst[q*length+i] != float32(q*1000+i) {
				assert.Failf(t, "wrong value", "%s: block %d [%d] = %v", where("all_gather"), q, i, dst[q*length+i])
				return nil
			}
		}
	}
	src64 := make([]float64, length)
	for i := range src64 {
		src64[i] = float64(r*1000+i) + 0.5
	}
	dst64 := make([]float64, n*length)
	if err := g.AllGather(ctx, F64(dst64), F64(src64)); err != nil {
		return err
	}
	for q := range n {
		for i := range length {
			assert.Equal(t, float64(q*1000+i)+0.5, dst64[q*length+i], where("all_gather f64"))
		}
	}

	// Broadcast from every root.
	if err := checkBroadcasts(ctx, t, g, length, where); err != nil {
		return err
	}
	if err := checkMoves(ctx, t, g, n, r, length); err != nil {
		return err
	}
	return g.Barrier(ctx)
}

// checkAllReduceOp runs AllReduce (float32, float64) and AllReduceTyped
// (every dtype) with op once on rank r and compares with the reference.
func checkAllReduceOp(ctx context.Context, t require.TestingT, g *ProcessGroup, n, r, length int, op ReduceOp, where func(string) string) error {
	// AllReduce, float32 and float64.
	want := refAllReduce(op, Float32, n, length)
	f32 := make([]float32, length)
	for i := range f32 {
		f32[i] = float32(exactInput(op, r, i))
	}
	if err := g.AllReduce(ctx, F32(f32), op); err != nil {
		return err
	}
	for i := range f32 {
		if float64(f32[i]) != want[i] {
			assert.Failf(t, "wrong value", "%s %v: [%d] = %v, want %v", where("all_reduce f32"), op, i, f32[i], want[i])
			break
		}
	}
	want = refAllReduce(op, Float64, n, length)
	f64 := make([]float64, length)
	for i := range f64 {
		f64[i] = exactInput(op, r, i)
	}
	if err := g.AllReduce(ctx, F64(f64), op); err != nil {
		return err
	}
	assert.Equal(t, want, f64, where("all_reduce f64 "+op.String()))

	// AllReduceTyped, every dtype.
	for _, dt := range allDTypes {
		in := make([]float64, length)
		for i := range in {
			in[i] = exactInput(op, r, i)
		}
		buf := encodeValues(t, dt, in)
		if err := g.AllReduce(ctx, Typed(buf, dt), op); err != nil {
			return err
		}
		assert.Equal(t, refAllReduce(op, dt, n, length), decodeValues(t, dt, buf), where("typed "+dt.String()+" "+op.String()))
	}
	return nil
}

// TestAllReduceLarge checks vectors of more than a million elements, split
// unevenly among the ranks, on the default (ring) path.
func TestAllReduceLarge(t *testing.T) {
	sizes := []int{3}
	if !testing.Short() {
		sizes = append(sizes, 8)
	}
	const length = 1<<20 + 3
	for _, n := range sizes {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			c := newCluster(t, n)
			results := make([][]float32, n)
			requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
				d := make([]float32, length)
				for i := range d {
					d[i] = float32(exactInput(Sum, r, i))
				}
				results[r] = d
				return g.AllReduce(bg, F32(d), Sum)
			}))
			want := refAllReduce(Sum, Float32, n, length)
			for r := range n {
				for i, v := range results[r] {
					if float64(v) != want[i] {
						require.Failf(t, "wrong value", "rank %d [%d] = %v, want %v", r, i, v, want[i])
					}
				}
			}
		})
	}
}

// TestAllReduceBitwiseIdentical uses random data (so the reduction order
// matters for rounding) and checks every rank ends with the same bits.
func TestAllReduceBitwiseIdentical(t *testing.T) {
	for _, n := range []int{3, 5, 8} {
		for _, cfg := range algoConfigs {
			t.Run(fmt.Sprintf("n=%d/%s", n, cfg.name), func(t *testing.T) {
				t.Parallel()
				requireSameBits(t, newCluster(t, n, cfg.opts...), n, Float16)
			})
		}
	}
}

// requireSameBits runs float32 and typed (dt, 16-bit) all-reduces of
// random data (Sum, Mean, Prod) on the n ranks of c and requires that
// every rank ends with the same bits.
func requireSameBits(t *testing.T, c *cluster, n int, dt DType) {
	const length = 1001
	res32 := make([][]float32, n)
	res16 := make([][]byte, n)
	requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
		rng := rand.New(rand.NewPCG(uint64(r), 1))
		for _, op := range []ReduceOp{Sum, Mean, Prod} {
			d := make([]float32, length)
			for i := range d {
				d[i] = float32(rng.NormFloat64())
			}
			if err := g.AllReduce(bg, F32(d), op); err != nil {
				return err
			}
			res32[r] = append(res32[r], d...)
			b := make([]byte, 2*length)
			for i := range length {
				codecF16.store(b[2*i:], rng.NormFloat64())
			}
			if err := g.AllReduce(bg, Typed(b, dt), op); err != nil {
				return err
			}
			res16[r] = append(res16[r], b...)
		}
		return nil
	}))
	for r := 1; r < n; r++ {
		for i := range res32[0] {
			if math.Float32bits(res32[r][i]) != math.Float32bits(res32[0][i]) {
				require.Failf(t, "ranks differ", "f32 rank %d [%d]: %v vs %v", r, i, res32[r][i], res32[0][i])
			}
		}
		require.Equal(t, res16[0], res16[r], "%v rank %d", dt, r)
	}
}

// TestAllReduceTypedRandom compares Float16, BFloat16 and Float32 all-reduces of random
// data with an exact float64 reference. The inputs are rounded to the dtype
// first; the reduction then rounds once per combination, in an order that
// depends on the algorithm, so the result may differ from the exactly
// rounded sum. Tolerance (documented bound): with u the unit roundoff
// (2^-11 for Float16, 2^-8 for BFloat16, 2^-24 for Float32), n ranks and S = sum of |x|,
// |got - exact| <= (n-1)*u*S + u*|exact| for Sum — each of the n-1
// combinations contributes at most u times a partial sum bounded by S, plus
// the final rounding — and the same relative bound for Mean; Max and Min are
// exact.
func TestAllReduceTypedRandom(t *testing.T) {
	units := map[DType]float64{Float16: 0x1p-11, BFloat16: 0x1p-8, Float32: 0x1p-24}
	for _, n := range []int{2, 3, 4, 7} {
		for _, cfg := range algoConfigs[:2] {
			t.Run(fmt.Sprintf("n=%d/%s", n, cfg.name), func(t *testing.T) {
				t.Parallel()
				c := newCluster(t, n, cfg.opts...)
				const length = 517
				in := map[DType][][]float64{}
				for _, dt := range []DType{Float16, BFloat16, Float32} {
					for r := range n {
						rng := rand.New(rand.NewPCG(uint64(r), uint64(dt)))
						v := make([]float64, length)
						for i := range v {
							v[i] = roundTo(dt, rng.Float64()*4-2)
						}
						in[dt] = append(in[dt], v)
					}
				}
				inputs := func(dt DType, r int) []float64 { return in[dt][r] }
				requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
					for _, dt := range []DType{Float16, BFloat16, Float32} {
						for _, op := range []ReduceOp{Sum, Mean, Max, Min} {
							buf := encodeValues(t, dt, inputs(dt, r))
							if err := g.AllReduce(bg, Typed(buf, dt), op); err != nil {
								return err
							}
							got := decodeValues(t, dt, buf)
							u := units[dt]
							for i := range got {
								vs := make([]float64, n)
								s := 0.0
								for q := range n {
									vs[q] = inputs(dt, q)[i]
									s += math.Abs(vs[q])
								}
								exact := refCombine(op, vs)
								tol := 0.0
								switch op {
								case Sum:
									tol = float64(n-1)*u*s + u*math.Abs(exact)
								case Mean:
									tol = (float64(n-1)*u*s)/float64(n) + 2*u*math.Abs(exact)
								}
								if math.Abs(got[i]-exact) > tol {
									assert.Failf(t, "out of tolerance", "%v %v n=%d [%d]: got %v, exact %v, tol %v", dt, op, n, i, got[i], exact, tol)
									break
								}
							}
						}
					}
					return nil
				}))
			})
		}
	}
}

// TestTypedF32MatchesFloat64Accumulation checks the claim that lets typed Float32
// use the float32 kernels: rounding a float64 combination of two float32s to
// float32 gives the float32 result.
func TestTypedF32MatchesFloat64Accumulation(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for range 200000 {
		a := float32(rng.NormFloat64() * math.Pow(2, float64(rng.IntN(60)-30)))
		b := float32(rng.NormFloat64() * math.Pow(2, float64(rng.IntN(60)-30)))
		for _, op := range []ReduceOp{Sum, Prod, Max, Min} {
			d, s := []float32{a}, []float32{b}
			reduceInto(d, s, op)
			want := float32(combine64(float64(a), float64(b), op))
			require.Equal(t, math.Float32bits(want), math.Float32bits(d[0]), "%v %v %v", a, op, b)
		}
		n := rng.IntN(8) + 1
		d := []float32{a}
		divInto(d, float32(n))
		require.Equal(t, math.Float32bits(float32(float64(a)/float64(n))), math.Float32bits(d[0]))
	}
}

func TestBF16Rounding(t *testing.T) {
	cases := []float32{0, 1, -1, 1.00390625, 1.005859375, 3.4e38, -3.4e38, float32(math.Inf(1)), 1e-40, -1e-40}
	rng := rand.New(rand.NewPCG(3, 3))
	for range 100000 {
		cases = append(cases, math.Float32frombits(rng.Uint32()&^0x7f800000|uint32(rng.IntN(254)+1)<<23))
	}
	for _, f := range cases {
		require.Equal(t, math.Float32bits(refBF16(f)), math.Float32bits(f32FromBF16(bf16FromF32(f))), "%v", f)
	}
	nan := f32FromBF16(bf16FromF32(float32(math.NaN())))
	require.True(t, nan != nan)
	// Exactly halfway between two bfloat16 values: ties go to even.
	require.Equal(t, uint16(0x3f80), bf16FromF32(math.Float32frombits(0x3f808000)))
	require.Equal(t, uint16(0x3f82), bf16FromF32(math.Float32frombits(0x3f818000)))
}

func TestUnalignedTypedBuffers(t *testing.T) {
	c := newCluster(t, 3)
	requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
		for _, dt := range []DType{Float32, Float64} {
			in := make([]float64, 9)
			for i := range in {
				in[i] = exactInput(Sum, r, i)
			}
			raw := make([]byte, 1+len(in)*dt.Size())
			buf := raw[1:] // misaligned on purpose
			copy(buf, encodeValues(t, dt, in))
			if err := g.AllReduce(bg, Typed(buf, dt), Sum); err != nil {
				return err
			}
			assert.Equal(t, refAllReduce(Sum, dt, 3, len(in)), decodeValues(t, dt, buf))
		}
		return nil
	}))
}

// TestCollectivesZeroAllocs: every typed-slice collective, float32 and
// float64 (one generic body each), allocates nothing in steady state on the
// in-process transport.
func TestCollectivesZeroAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	const n, length = 2, 1024
	type bufs struct {
		a32, b32 []float32
		a64, b64 []float64
	}
	for _, tc := range []struct {
		name string
		op   func(g *ProcessGroup, b *bufs) error
	}{
		{"all_reduce/f64", func(g *ProcessGroup, b *bufs) error { return g.AllReduce(bg, F64(b.a64), Sum) }},
		{"all_gather/f32", func(g *ProcessGroup, b *bufs) error { return g.AllGather(bg, F32(b.b32), F32(b.a32)) }},
		{"all_gather/f64", func(g *ProcessGroup, b *bufs) error { return g.AllGather(bg, F64(b.b64), F64(b.a64)) }},
		{"reduce_scatter/f32", func(g *ProcessGroup, b *bufs) error { return g.ReduceScatter(bg, F32(b.a32), F32(b.b32), Sum) }},
		{"reduce_scatter/f64", func(g *ProcessGroup, b *bufs) error { return g.ReduceScatter(bg, F64(b.a64), F64(b.b64), Sum) }},
		{"broadcast/f32", func(g *ProcessGroup, b *bufs) error { return g.Broadcast(bg, F32(b.a32), 1) }},
		{"broadcast/f64", func(g *ProcessGroup, b *bufs) error { return g.Broadcast(bg, F64(b.a64), 1) }},
		{"reduce/f32", func(g *ProcessGroup, b *bufs) error { return g.Reduce(bg, F32(b.a32), Max, 0) }},
		{"reduce/f64", func(g *ProcessGroup, b *bufs) error { return g.Reduce(bg, F64(b.a64), Max, 0) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, n)
			bs := make([]bufs, n)
			for r := range bs {
				bs[r] = bufs{make([]float32, length), make([]float32, n*length), make([]float64, length), make([]float64, n*length)}
			}
			step, stop := lockstep(t, c, func(r int, g *ProcessGroup) error { return tc.op(g, &bs[r]) })
			defer stop()
			for range 5 {
				step()
			}
			require.Zero(t, testing.AllocsPerRun(50, step))
		})
	}
}

// checkBroadcasts broadcasts from every root, float32 and float64, and
// checks every value against the root's.
func checkBroadcasts(ctx context.Context, t require.TestingT, g *ProcessGroup, length int, where func(string) string) error {
	r := g.Rank()
	for root := range g.WorldSize() {
		d := make([]float32, length)
		d64 := make([]float64, length)
		for i := range d {
			d[i] = float32(r*100 + i)
			d64[i] = float64(r*100+i) + 0.25
		}
		if err := g.Broadcast(ctx, F32(d), root); err != nil {
			return err
		}
		if err := g.Broadcast(ctx, F64(d64), root); err != nil {
			return err
		}
		for i := range d {
			if d[i] != float32(root*100+i) || d64[i] != float64(root*100+i)+0.25 {
				assert.Failf(t, "wrong value", "%s root %d: [%d] = %v, %v", where("broadcast"), root, i, d[i], d64[i])
				break
			}
		}
	}
	return nil
}
