// Package disttest runs several ranks of a process group inside one test
// process: one group per rank over the in-process transport, one goroutine
// per rank, each group closed when its rank's function returns (so that a
// failing rank makes its peers fail instead of hang) and again, idempotently,
// in t.Cleanup, so that goleak finds nothing left behind.
//
// Multi-process tests (the test binary re-executed as ranks over TCP) use
// package procjob, which package dist's own tests can import too.
//
// # Usage
//
//	errs := disttest.Run(t, disttest.Cluster(t, 3), func(rank int, pg *dist.ProcessGroup) error {
//		return pg.AllReduceF64(ctx, data[rank], dist.Sum)
//	})
//	require.NoError(t, errors.Join(errs...))
//
//	disttest.Check(t, 3, func(pg *dist.ProcessGroup) error { ... }) // Cluster, Run, every error reported
//
// CheckGradients compares the gradients of a distributed graph (each
// rank's own or replicated tensors) with central differences of a loss
// the ranks compute together.
package disttest

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/transport"
)

// Cluster returns n process groups, rank r's at index r, connected by the
// in-process transport and made with opts. They are closed in t.Cleanup.
func Cluster(t testing.TB, n int, opts ...dist.Option) []*dist.ProcessGroup {
	t.Helper()
	ls, err := transport.NewLocal(n)
	if err != nil {
		t.Fatal(err)
	}
	return Groups(t, ls, opts...)
}

// Groups returns a process group on each of ts, made with opts, rank r's at
// index r. They are closed in t.Cleanup (which closes their transports).
func Groups[T transport.Transport](t testing.TB, ts []T, opts ...dist.Option) []*dist.ProcessGroup {
	t.Helper()
	pgs := make([]*dist.ProcessGroup, len(ts))
	t.Cleanup(func() {
		for _, pg := range pgs {
			if pg != nil {
				pg.Close()
			}
		}
	})
	for r, tr := range ts {
		pg, err := dist.New(tr, opts...)
		require.NoError(t, err, "rank %d", r)
		pgs[r] = pg
	}
	return pgs
}

// Run runs fn on every group, each in its own goroutine, closes each group
// when its fn returns, waits for all of them and returns their errors, rank
// r's at index r.
func Run(t testing.TB, groups []*dist.ProcessGroup, fn func(rank int, pg *dist.ProcessGroup) error) []error {
	t.Helper()
	_, errs := Results(t, groups, func(rank int, pg *dist.ProcessGroup) (struct{}, error) {
		return struct{}{}, fn(rank, pg)
	})
	return errs
}

// Check runs fn on n in-process ranks (Cluster with opts, then Run) and
// reports on t every rank's error: the usual start of a test of a
// collective or a distributed op.
func Check(t testing.TB, n int, fn func(pg *dist.ProcessGroup) error, opts ...dist.Option) {
	t.Helper()
	errs := Run(t, Cluster(t, n, opts...), func(_ int, pg *dist.ProcessGroup) error { return fn(pg) })
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// Results is Run for functions that return a value: it returns the values
// and the errors, rank r's at index r.
func Results[T any](t testing.TB, groups []*dist.ProcessGroup, fn func(rank int, pg *dist.ProcessGroup) (T, error)) ([]T, []error) {
	t.Helper()
	res := make([]T, len(groups))
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for r, pg := range groups {
		wg.Go(func() {
			defer pg.Close()
			res[r], errs[r] = fn(r, pg)
		})
	}
	wg.Wait()
	return res, errs
}
