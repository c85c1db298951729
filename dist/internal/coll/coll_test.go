package coll_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"testing/quick"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/internal/coll"
	"github.com/gdist/gdist/dist/internal/coll/colltest"
)

// These tests check the algorithms on float64 sums and maxima of small
// integers (exact in any order); package dist's property tests cover every
// dtype and reduce op through the real kernels.

func f64s(b []byte) []float64 {
	out := make([]float64, len(b)/8)
	for i := range out {
		out[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return out
}

func bytesOf(x []float64) []byte {
	b := make([]byte, 8*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(v))
	}
	return b
}

func f64Reducer(max bool) coll.Reducer {
	return coll.Reducer{Size: 8,
		Combine: func(dst, src []byte) {
			for i := 0; i+8 <= len(dst); i += 8 {
				a := math.Float64frombits(binary.LittleEndian.Uint64(dst[i:]))
				b := math.Float64frombits(binary.LittleEndian.Uint64(src[i:]))
				r := a + b
				if max {
					r = math.Max(a, b)
				}
				binary.LittleEndian.PutUint64(dst[i:], math.Float64bits(r))
			}
		}}
}

// tcase is one random configuration.
type tcase struct {
	N, Len, Seg, Cap, Root int
	Small                  int
	Pair                   int // Net.PairSegment
	Max                    bool
	Hosts                  []int // nil: flat
	Seed                   uint64
}

func genCase(r *rand.Rand) tcase {
	n := 1 + r.IntN(16)
	lens := []int{0, 1, max(n-1, 0), n, n + 1, 7, 33, r.IntN(300)}
	c := tcase{
		N:    n,
		Len:  lens[r.IntN(len(lens))],
		Seg:  8 * (1 + r.IntN(8)),
		Cap:  1 + r.IntN(3),
		Root: r.IntN(n),
		Max:  r.IntN(2) == 0,
		Seed: r.Uint64(),
	}
	if r.IntN(2) == 0 {
		c.Small = 1 << 30 // latency-optimal algorithms
	}
	if r.IntN(2) == 0 {
		c.Pair = 8 * (1 + r.IntN(8))
	}
	if r.IntN(3) == 0 { // a host map: members in host order, hosts numbered by first member
		hosts := make([]int, n)
		h := 0
		for i := 1; i < n; i++ {
			if r.IntN(2) == 0 {
				h++
			}
			hosts[i] = h
		}
		c.Hosts = hosts
	}
	return c
}

// run runs f on every member of a fresh network and returns the members'
// errors.
func run(t *testing.T, c tcase, f func(ctx context.Context, me int, nt *coll.Net) error) []error {
	t.Helper()
	nw := colltest.New(c.N, c.Cap, c.Seed)
	defer nw.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := make([]error, c.N)
	var wg sync.WaitGroup
	for me := range c.N {
		nt := &coll.Net{Ex: nw.Exchange(me), Segment: c.Seg, Small: c.Small, PairSegment: c.Pair}
		if c.Hosts != nil {
			nt.Hier = coll.NewPlan(c.Hosts, me)
		}
		wg.Go(func() { errs[me] = f(ctx, me, nt) })
	}
	wg.Wait()
	if nw.Pending() != 0 {
		t.Errorf("%+v: %d messages left behind", c, nw.Pending())
	}
	return errs
}

// input returns member me's vector of length n: small integers, exact
// under any order of additions.
func input(seed uint64, me, n int) []float64 {
	r := rand.New(rand.NewPCG(seed, uint64(me)+1000))
	x := make([]float64, n)
	for i := range x {
		x[i] = float64(r.IntN(17) - 8)
	}
	return x
}

func combineAll(c tcase, n int) []float64 {
	out := input(c.Seed, 0, n)
	for m := 1; m < c.N; m++ {
		for i, v := range input(c.Seed, m, n) {
			if c.Max {
				out[i] = math.Max(out[i], v)
			} else {
				out[i] += v
			}
		}
	}
	return out
}

func check(t *testing.T, c tcase, what string, errs []error, got [][]float64, want func(me int) []float64) bool {
	t.Helper()
	for me, err := range errs {
		if err != nil {
			t.Errorf("%s %+v: member %d: %v", what, c, me, err)
			return false
		}
		if w := want(me); !slices.Equal(got[me], w) {
			t.Errorf("%s %+v: member %d: got %v, want %v", what, c, me, got[me], w)
			return false
		}
	}
	return true
}

var quickCfg = &quick.Config{MaxCount: 250}

func cases(t *testing.T, name string, f func(c tcase) bool) {
	t.Helper()
	n := 0
	prop := func(seed uint64) bool {
		n++
		return f(genCase(rand.New(rand.NewPCG(seed, 7))))
	}
	if testing.Short() {
		quickCfg.MaxCount = 100
	}
	if err := quick.Check(prop, quickCfg); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %d random cases", name, n)
}

func TestAllReduceQuick(t *testing.T) {
	cases(t, "all_reduce", func(c tcase) bool {
		got := make([][]float64, c.N)
		errs := run(t, c, func(ctx context.Context, me int, nt *coll.Net) error {
			b := bytesOf(input(c.Seed, me, c.Len))
			err := nt.AllReduce(ctx, coll.World(c.N, me), b, f64Reducer(c.Max))
			got[me] = f64s(b)
			return err
		})
		want := combineAll(c, c.Len)
		return check(t, c, "all_reduce", errs, got, func(int) []float64 { return want })
	})
}

// TestAllReducePairQuick: the all-reduce between 2 members that share
// memory (Net.PairSegment), over lengths shorter than, equal to and
// longer than a segment, odd and empty, and with the small-message
// threshold on either side of the length.
func TestAllReducePairQuick(t *testing.T) {
	n := 0
	prop := func(seed uint64) bool {
		n++
		r := rand.New(rand.NewPCG(seed, 11))
		c := genCase(r)
		c.N, c.Root, c.Hosts = 2, r.IntN(2), nil
		c.Pair = 8 * (1 + r.IntN(8))
		lens := []int{0, 1, 2, 3, c.Pair / 8, c.Pair/4 + 1, 2*c.Pair/8 - 1, 7 * c.Pair / 8, r.IntN(400)}
		c.Len = lens[r.IntN(len(lens))]
		c.Small = []int{0, 8 * c.Len, 8*c.Len + 8, 1 << 30}[r.IntN(4)]
		got := make([][]float64, 2)
		errs := run(t, c, func(ctx context.Context, me int, nt *coll.Net) error {
			b := bytesOf(input(c.Seed, me, c.Len))
			err := nt.AllReduce(ctx, coll.World(2, me), b, f64Reducer(c.Max))
			got[me] = f64s(b)
			return err
		})
		want := combineAll(c, c.Len)
		return check(t, c, "all_reduce pair", errs, got, func(int) []float64 { return want })
	}
	if err := quick.Check(prop, quickCfg); err != nil {
		t.Fatal(err)
	}
	t.Logf("all_reduce pair: %d random cases", n)
}

func TestReduceScatterQuick(t *testing.T) {
	cases(t, "reduce_scatter", func(c tcase) bool {
		got := make([][]float64, c.N)
		errs := run(t, c, func(ctx context.Context, me int, nt *coll.Net) error {
			src := bytesOf(input(c.Seed, me, c.N*c.Len))
			keep := slices.Clone(src)
			dst := make([]byte, 8*c.Len)
			err := nt.ReduceScatter(ctx, coll.World(c.N, me), dst, src, f64Reducer(c.Max))
			if !slices.Equal(src, keep) {
				t.Errorf("reduce_scatter %+v: member %d: src modified", c, me)
			}
			got[me] = f64s(dst)
			return err
		})
		all := combineAll(c, c.N*c.Len)
		return check(t, c, "reduce_scatter", errs, got, func(me int) []float64 { return all[me*c.Len : (me+1)*c.Len] })
	})
}

func TestReduceQuick(t *testing.T) {
	cases(t, "reduce", func(c tcase) bool {
		got := make([][]float64, c.N)
		errs := run(t, c, func(ctx context.Context, me int, nt *coll.Net) error {
			b := bytesOf(input(c.Seed, me, c.Len))
			err := nt.Reduce(ctx, coll.World(c.N, me), b, c.Root, f64Reducer(c.Max))
			got[me] = f64s(b)
			return err
		})
		all := combineAll(c, c.Len)
		return check(t, c, "reduce", errs, got, func(me int) []float64 {
			if me == c.Root {
				return all
			}
			return input(c.Seed, me, c.Len)
		})
	})
}

func TestBroadcastQuick(t *testing.T) {
	cases(t, "broadcast", func(c tcase) bool {
		got := make([][]float64, c.N)
		errs := run(t, c, func(ctx context.Context, me int, nt *coll.Net) error {
			b := bytesOf(input(c.Seed, me, c.Len))
			err := nt.Broadcast(ctx, coll.World(c.N, me), b, c.Root)
			got[me] = f64s(b)
			return err
		})
		want := input(c.Seed, c.Root, c.Len)
		return check(t, c, "broadcast", errs, got, func(int) []float64 { return want })
	})
}

func concat(c tcase, lens func(m int) int) []float64 {
	var out []float64
	for m := range c.N {
		out = append(out, input(c.Seed, m, lens(m))...)
	}
	return out
}

func TestAllGatherQuick(t *testing.T) {
	cases(t, "all_gather", func(c tcase) bool {
		got := make([][]float64, c.N)
		errs := run(t, c, func(ctx context.Context, me int, nt *coll.Net) error {
			dst := make([]byte, 8*c.N*c.Len)
			err := nt.AllGather(ctx, coll.World(c.N, me), dst, bytesOf(input(c.Seed, me, c.Len)))
			got[me] = f64s(dst)
			return err
		})
		want := concat(c, func(int) int { return c.Len })
		return check(t, c, "all_gather", errs, got, func(int) []float64 { return want })
	})
}

// sizes returns uneven block lengths (some empty) for a case.
func sizes(c tcase, salt int) []int {
	r := rand.New(rand.NewPCG(c.Seed, uint64(salt)))
	s := make([]int, c.N)
	for i := range s {
		s[i] = r.IntN(c.Len + 2)
	}
	return s
}

func TestAllGatherVQuick(t *testing.T) {
	cases(t, "all_gather_v", func(c tcase) bool {
		counts := sizes(c, 1)
		total := 0
		for _, k := range counts {
			total += k
		}
		got := make([][]float64, c.N)
		errs := run(t, c, func(ctx context.Context, me int, nt *coll.Net) error {
			dst := make([]byte, 8*total)
			err := nt.AllGatherV(ctx, coll.World(c.N, me), dst, bytesOf(input(c.Seed, me, counts[me])), counts, 8)
			got[me] = f64s(dst)
			return err
		})
		want := concat(c, func(m int) int { return counts[m] })
		return check(t, c, "all_gather_v", errs, got, func(int) []float64 { return want })
	})
}

func TestGatherScatterQuick(t *testing.T) {
	cases(t, "gather+scatter", func(c tcase) bool {
		got := make([][]float64, c.N)
		errs := run(t, c, func(ctx context.Context, me int, nt *coll.Net) error {
			var dst []byte
			if me == c.Root {
				dst = make([]byte, 8*c.N*c.Len)
			}
			err := nt.Gather(ctx, coll.World(c.N, me), dst, bytesOf(input(c.Seed, me, c.Len)), c.Root)
			got[me] = f64s(dst)
			return err
		})
		want := concat(c, func(int) int { return c.Len })
		if !check(t, c, "gather", errs, got, func(me int) []float64 {
			if me == c.Root {
				return want
			}
			return []float64{}
		}) {
			return false
		}
		errs = run(t, c, func(ctx context.Context, me int, nt *coll.Net) error {
			var src []byte
			if me == c.Root {
				src = bytesOf(want)
			}
			dst := make([]byte, 8*c.Len)
			err := nt.Scatter(ctx, coll.World(c.N, me), dst, src, c.Root)
			got[me] = f64s(dst)
			return err
		})
		return check(t, c, "scatter", errs, got, func(me int) []float64 { return want[me*c.Len : (me+1)*c.Len] })
	})
}

func TestAllToAllQuick(t *testing.T) {
	cases(t, "all_to_all", func(c tcase) bool {
		// counts[i][j]: elements member i sends to member j (equal splits
		// on half the cases).
		equal := c.Seed%2 == 0
		counts := make([][]int, c.N)
		for i := range counts {
			counts[i] = sizes(c, 10+i)
			if equal {
				for j := range counts[i] {
					counts[i][j] = c.Len
				}
			}
		}
		got := make([][]float64, c.N)
		errs := run(t, c, func(ctx context.Context, me int, nt *coll.Net) error {
			send, recv := make([]int, c.N), make([]int, c.N)
			ns, nr := 0, 0
			for j := range c.N {
				send[j], recv[j] = counts[me][j], counts[j][me]
				ns += counts[me][j]
				nr += counts[j][me]
			}
			src := bytesOf(input(c.Seed, me, ns))
			dst := make([]byte, 8*nr)
			if equal {
				send, recv = nil, nil
			}
			err := nt.AllToAll(ctx, coll.World(c.N, me), dst, src, send, recv, 8)
			got[me] = f64s(dst)
			return err
		})
		return check(t, c, "all_to_all", errs, got, func(me int) []float64 {
			var want []float64
			for j := range c.N {
				ns, off := 0, 0
				for k := range c.N {
					if k == me {
						off = ns
					}
					ns += counts[j][k]
				}
				x := input(c.Seed, j, ns)
				want = append(want, x[off:off+counts[j][me]]...)
			}
			if want == nil {
				want = []float64{}
			}
			return want
		})
	})
}

func TestBarrierQuick(t *testing.T) {
	cases(t, "barrier", func(c tcase) bool {
		var mu sync.Mutex
		entered := 0
		errs := run(t, c, func(ctx context.Context, me int, nt *coll.Net) error {
			mu.Lock()
			entered++
			mu.Unlock()
			if err := nt.Barrier(ctx, coll.World(c.N, me)); err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			if entered != c.N {
				t.Errorf("barrier %+v: member %d left with %d of %d entered", c, me, entered, c.N)
			}
			return nil
		})
		for _, err := range errs {
			if err != nil {
				t.Errorf("barrier %+v: %v", c, err)
				return false
			}
		}
		return true
	})
}

// TestHierFlatMismatch: a member that runs the all-reduce flat next to one
// that runs it hierarchically fails with ErrFlatPeer instead of mixing
// messages.
func TestHierFlatMismatch(t *testing.T) {
	c := tcase{N: 4, Len: 8, Seg: 64, Cap: 2, Seed: 1, Small: 1 << 30}
	nw := colltest.New(c.N, c.Cap, c.Seed)
	defer nw.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	errs := make([]error, c.N)
	var wg sync.WaitGroup
	for me := range c.N {
		nt := &coll.Net{Ex: nw.Exchange(me), Segment: c.Seg, Small: c.Small}
		if me != 1 {
			nt.Hier = coll.NewPlan([]int{0, 0, 1, 1}, me)
		}
		wg.Go(func() {
			errs[me] = nt.AllReduce(ctx, coll.World(c.N, me), bytesOf(input(1, me, c.Len)), f64Reducer(false))
		})
	}
	wg.Wait()
	require.ErrorIs(t, errs[2], coll.ErrFlatPeer, "member 2 follows the flat member 1")
}

// TestAllReducePairStreams: over an exchange that can stream, the
// all-reduce between 2 members sends both ways as its choice goes
// (plainly and streamed), and every result is exact.
func TestAllReducePairStreams(t *testing.T) {
	c := tcase{N: 2, Cap: 4, Seed: 7, Seg: 64, Small: 0, Pair: 64}
	nw := colltest.New(c.N, c.Cap, c.Seed)
	defer nw.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const calls = 3 * 32
	lens := []int{1, 40, 333}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for me := range 2 {
		nt := &coll.Net{Ex: nw.Exchange(me), Segment: c.Seg, Small: c.Small, PairSegment: c.Pair}
		wg.Go(func() {
			for k := range calls {
				n := lens[k%len(lens)]
				b := bytesOf(input(c.Seed+uint64(k), me, n))
				if err := nt.AllReduce(ctx, coll.World(2, me), b, f64Reducer(false)); err != nil {
					errs[me] = err
					return
				}
				cc := c
				cc.Seed, cc.Len = c.Seed+uint64(k), n
				if want := combineAll(cc, n); !slices.Equal(want, f64s(b)) {
					errs[me] = fmt.Errorf("call %d, %d elements: got %v, want %v", k, n, f64s(b), want)
					return
				}
			}
		})
	}
	wg.Wait()
	for me, err := range errs {
		require.NoError(t, err, "member %d", me)
		st := nw.Stats(me)
		require.Positive(t, st.Streamed, "member %d streamed nothing", me)
		require.Less(t, st.Streamed, st.Messages, "member %d sent nothing plainly", me)
	}
}
