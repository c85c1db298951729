package dist

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/quick"
	"time"

	"github.com/gdist/gdist/dist/internal/coll"
	"github.com/gdist/gdist/dist/internal/coll/colltest"
)

// The reduction algorithms, run through the real kernels of every dtype
// and reduce op on colltest's simulated network (bounded links, deliveries
// reordered at random), against the references of helpers_test.go.
// Package coll's own property tests cover the data-moving collectives.

// quickCase is one random configuration of the property tests.
type quickCase struct {
	n, length, seg, cap, root int
	small                     int
	hosts                     []int
	dt                        DType
	op                        ReduceOp
	seed                      uint64
}

func (c quickCase) String() string {
	return fmt.Sprintf("n=%d len=%d seg=%d cap=%d root=%d small=%d hosts=%v %v %v seed=%d",
		c.n, c.length, c.seg, c.cap, c.root, c.small, c.hosts, c.dt, c.op, c.seed)
}

func newQuickCase(r *rand.Rand) quickCase {
	n := 1 + r.IntN(16)
	lens := []int{0, 1, max(n-1, 0), n + 1, 7, r.IntN(200), 1 + r.IntN(2000)}
	c := quickCase{
		n:      n,
		length: lens[r.IntN(len(lens))],
		seg:    8 * (1 + r.IntN(16)),
		cap:    1 + r.IntN(3),
		root:   r.IntN(n),
		dt:     allDTypes[r.IntN(len(allDTypes))],
		op:     allOps[r.IntN(len(allOps))],
		seed:   r.Uint64(),
	}
	if r.IntN(2) == 0 {
		c.small = 1 << 30
	}
	if r.IntN(3) == 0 {
		hosts := make([]int, n)
		h := 0
		for i := 1; i < n; i++ {
			if r.IntN(2) == 0 {
				h++
			}
			hosts[i] = h
		}
		c.hosts = hosts
	}
	return c
}

// runQuick runs f on every member of a fresh simulated network.
func runQuick(c quickCase, f func(ctx context.Context, me int, nt *coll.Net) error) ([]error, int) {
	nw := colltest.New(c.n, c.cap, c.seed)
	defer nw.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make([]error, c.n)
	var wg sync.WaitGroup
	for me := range c.n {
		nt := &coll.Net{Ex: nw.Exchange(me), Segment: c.seg, Small: c.small}
		if c.hosts != nil {
			nt.Hier = coll.NewPlan(c.hosts, me)
		}
		wg.Go(func() { errs[me] = f(ctx, me, nt) })
	}
	wg.Wait()
	return errs, nw.Pending()
}

// quickInputs returns member me's exact inputs for c, as dt bytes.
func quickInputs(t *testing.T, c quickCase, me, n int) []byte {
	vs := make([]float64, n)
	for i := range vs {
		vs[i] = exactInput(c.op, me, i)
	}
	return encodeValues(t, c.dt, vs)
}

func quickCheck(t *testing.T, name string, f func(c quickCase) error) {
	count := 0
	prop := func(seed uint64) bool {
		count++
		c := newQuickCase(rand.New(rand.NewPCG(seed, 11)))
		if err := f(c); err != nil {
			t.Errorf("%s %v: %v", name, c, err)
			return false
		}
		return true
	}
	cfg := &quick.Config{MaxCount: 300}
	if testing.Short() {
		cfg.MaxCount = 60
	}
	if err := quick.Check(prop, cfg); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %d random cases", name, count)
}

// equalValues compares decoded results with the reference.
func equalValues(t *testing.T, c quickCase, what string, me int, got []byte, want []float64) error {
	vs := decodeValues(t, c.dt, got)
	for i := range want {
		if vs[i] != want[i] && !(vs[i] != vs[i] && want[i] != want[i]) {
			return fmt.Errorf("%s: member %d [%d] = %v, want %v", what, me, i, vs[i], want[i])
		}
	}
	return nil
}

func firstErr(errs []error, pending int) error {
	for me, err := range errs {
		if err != nil {
			return fmt.Errorf("member %d: %w", me, err)
		}
	}
	if pending != 0 {
		return fmt.Errorf("%d messages left behind", pending)
	}
	return nil
}

func TestQuickAllReduce(t *testing.T) {
	quickCheck(t, "all_reduce", func(c quickCase) error {
		red := reducer{c.dt, c.op}.asColl()
		want := refAllReduce(c.op, c.dt, c.n, c.length)
		var mu sync.Mutex
		var bad error
		errs, pending := runQuick(c, func(ctx context.Context, me int, nt *coll.Net) error {
			b := quickInputs(t, c, me, c.length)
			if err := nt.AllReduce(ctx, coll.World(c.n, me), b, red); err != nil {
				return err
			}
			if err := equalValues(t, c, "all_reduce", me, b, want); err != nil {
				mu.Lock()
				bad = err
				mu.Unlock()
			}
			return nil
		})
		if err := firstErr(errs, pending); err != nil {
			return err
		}
		return bad
	})
}

func TestQuickReduceScatter(t *testing.T) {
	quickCheck(t, "reduce_scatter", func(c quickCase) error {
		red := reducer{c.dt, c.op}.asColl()
		full := refAllReduce(c.op, c.dt, c.n, c.n*c.length)
		var mu sync.Mutex
		var bad error
		errs, pending := runQuick(c, func(ctx context.Context, me int, nt *coll.Net) error {
			src := quickInputs(t, c, me, c.n*c.length)
			dst := make([]byte, c.length*c.dt.Size())
			if err := nt.ReduceScatter(ctx, coll.World(c.n, me), dst, src, red); err != nil {
				return err
			}
			if err := equalValues(t, c, "reduce_scatter", me, dst, full[me*c.length:(me+1)*c.length]); err != nil {
				mu.Lock()
				bad = err
				mu.Unlock()
			}
			return nil
		})
		if err := firstErr(errs, pending); err != nil {
			return err
		}
		return bad
	})
}

func TestQuickReduceBroadcast(t *testing.T) {
	quickCheck(t, "reduce+broadcast", func(c quickCase) error {
		red := reducer{c.dt, c.op}.asColl()
		want := refAllReduce(c.op, c.dt, c.n, c.length)
		var mu sync.Mutex
		var bad error
		note := func(err error) {
			if err != nil {
				mu.Lock()
				bad = err
				mu.Unlock()
			}
		}
		errs, pending := runQuick(c, func(ctx context.Context, me int, nt *coll.Net) error {
			b := quickInputs(t, c, me, c.length)
			if err := nt.Reduce(ctx, coll.World(c.n, me), b, c.root, red); err != nil {
				return err
			}
			if me == c.root {
				note(equalValues(t, c, "reduce", me, b, want))
			} else {
				note(equalValues(t, c, "reduce (non-root unchanged)", me, b, decodeValues(t, c.dt, quickInputs(t, c, me, c.length))))
			}
			if me != c.root {
				clear(b)
			}
			if err := nt.Broadcast(ctx, coll.World(c.n, me), b, c.root); err != nil {
				return err
			}
			note(equalValues(t, c, "broadcast", me, b, want))
			return nil
		})
		if err := firstErr(errs, pending); err != nil {
			return err
		}
		return bad
	})
}
