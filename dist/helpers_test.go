package dist

import (
	"context"
	"math"
	"os"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/x448/float16"
	"go.uber.org/goleak"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/transporttest"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(childMain(role))
	}
	goleak.VerifyTestMain(m)
}

var allOps = []ReduceOp{Sum, Mean, Max, Min, Prod}
var allDTypes = []DType{Float16, BFloat16, Float32, Float64}

// cluster is n in-process ranks.
type cluster struct {
	gs []*ProcessGroup
	ts []*transport.Local
}

func newCluster(t testing.TB, n int, opts ...Option) *cluster {
	t.Helper()
	return localCluster(t, transporttest.NewLocal(t, n), opts...)
}

// localCluster is a group over each of ts, closed one after another when
// the test ends.
func localCluster(t testing.TB, ts []*transport.Local, opts ...Option) *cluster {
	t.Helper()
	c := &cluster{gs: groupsOn(t, ts, opts...), ts: ts}
	t.Cleanup(func() {
		for _, g := range c.gs {
			require.NoError(t, g.Close())
		}
	})
	return c
}

// groupsOn makes a group over each of ts.
func groupsOn[T transport.Transport](t testing.TB, ts []T, opts ...Option) []*ProcessGroup {
	t.Helper()
	gs := make([]*ProcessGroup, len(ts))
	for i, tr := range ts {
		g, err := New(tr, opts...)
		require.NoError(t, err, "rank %d", i)
		gs[i] = g
	}
	return gs
}

// run calls f on every rank concurrently and returns the ranks' errors.
func (c *cluster) run(f func(r int, g *ProcessGroup) error) []error {
	errs := make([]error, len(c.gs))
	var wg sync.WaitGroup
	for r, g := range c.gs {
		wg.Go(func() { errs[r] = f(r, g) })
	}
	wg.Wait()
	return errs
}

func requireNoErrors(t testing.TB, errs []error) {
	t.Helper()
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
}

// exactInput is rank r's element i for op: small integers (sums of up to
// eight stay exact in every dtype) or, for Prod, signed powers of two (so
// products stay exact too). With these, every reduction order gives the same
// result and the references below can be exact.
func exactInput(op ReduceOp, r, i int) float64 {
	if op == Prod {
		return [...]float64{1, 2, -1, 0.5, -2, 1, 0.5}[(r*5+i*3)%7]
	}
	return float64((r*7+i*13)%17 - 8)
}

// refBF16 rounds f to bfloat16 independently of bf16FromF32: it picks the
// nearer of the two bfloat16 neighbours of f, ties to the even one.
func refBF16(f float32) float32 {
	if f != f {
		return f
	}
	b := math.Float32bits(f)
	lo := math.Float32frombits(b &^ 0xffff)
	hi := math.Float32frombits((b &^ 0xffff) + 0x10000) // next bf16 away from zero
	dl, dh := math.Abs(float64(f)-float64(lo)), math.Abs(float64(f)-float64(hi))
	if math.IsInf(float64(hi), 0) { // rounding up overflows: compare with 2^128
		dh = math.Ldexp(1, 128) - math.Abs(float64(f))
	}
	switch {
	case dl < dh:
		return lo
	case dh < dl:
		return hi
	case b>>16&1 == 0:
		return lo
	default:
		return hi
	}
}

// roundTo rounds v to dt the way the wire does (Float16 and BFloat16 through float32).
func roundTo(dt DType, v float64) float64 {
	switch dt {
	case Float16:
		return float64(float16.Fromfloat32(float32(v)).Float32())
	case BFloat16:
		return float64(refBF16(float32(v)))
	case Float32:
		return float64(float32(v))
	}
	return v
}

// refCombine reduces the per-rank values vs with op, exactly (for
// exactInput values), in float64.
func refCombine(op ReduceOp, vs []float64) float64 {
	acc := vs[0]
	for _, v := range vs[1:] {
		switch op {
		case Sum, Mean:
			acc += v
		case Prod:
			acc *= v
		case Max:
			acc = math.Max(acc, v)
		case Min:
			acc = math.Min(acc, v)
		}
	}
	if op == Mean {
		acc /= float64(len(vs))
	}
	return acc
}

// refAllReduce is the reference all-reduce of exactInput over n ranks.
func refAllReduce(op ReduceOp, dt DType, n, length int) []float64 {
	out := make([]float64, length)
	vs := make([]float64, n)
	for i := range out {
		for r := range n {
			vs[r] = roundTo(dt, exactInput(op, r, i))
		}
		out[i] = roundTo(dt, refCombine(op, vs))
	}
	return out
}

func encodeValues(t require.TestingT, dt DType, vs []float64) []byte {
	f := make([]float32, len(vs))
	for i, v := range vs {
		f[i] = float32(v)
	}
	b := make([]byte, len(vs)*dt.Size())
	if dt == Float64 {
		for i, v := range vs {
			codecF64.store(b[8*i:], v)
		}
		return b
	}
	require.NoError(t, EncodeFloat32(b, f, dt))
	return b
}

func decodeValues(t require.TestingT, dt DType, b []byte) []float64 {
	out := make([]float64, len(b)/dt.Size())
	if dt == Float64 {
		for i := range out {
			out[i] = codecF64.load(b[8*i:])
		}
		return out
	}
	f := make([]float32, len(out))
	require.NoError(t, DecodeFloat32(f, b, dt))
	for i, v := range f {
		out[i] = float64(v)
	}
	return out
}

var bg = context.Background()
