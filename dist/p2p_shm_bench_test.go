//go:build linux

package dist

import (
	"context"
	"crypto/rand"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/shm"
)

// BenchmarkP2PMessage measures what one 8-byte message costs the CPU
// over shared memory, with no waiting: one goroutine sends it from rank 0
// and receives it on rank 1 of the same process, through the transport
// alone and through dist (under a cancellable context, as most callers'
// are, and under context.Background()). It is the software on the path
// of every message, which a ping-pong adds to the cost of moving cache
// lines between the cores.
func BenchmarkP2PMessage(b *testing.B) {
	ts, gs := shmPair(b)
	defer func() {
		for _, g := range gs {
			require.NoError(b, g.Close())
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, dst := make([]byte, 8), make([]byte, 8)
	b.Run("transport", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := ts[0].Send(ctx, 1, 5, transport.Header{}, p); err != nil {
				b.Fatal(err)
			}
			if _, _, err := ts[1].RecvInto(ctx, 0, 5, dst); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, c := range []struct {
		name string
		ctx  context.Context
	}{{"dist", ctx}, {"dist-background", context.Background()}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := gs[0].Send(c.ctx, 1, 5, p); err != nil {
					b.Fatal(err)
				}
				if _, err := gs[1].RecvInto(c.ctx, 0, 5, dst); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// shmPair returns the 2 ranks of a job in this process over shared
// memory, as transports and as groups on them.
func shmPair(tb testing.TB) ([]*shm.Transport, []*ProcessGroup) {
	tb.Helper()
	ts := make([]*shm.Transport, 2)
	errs := make([]error, 2)
	rctx, rcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer rcancel()
	token, name := []byte(rand.Text()), "@gdist-shm-pair-"+rand.Text()
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() { ts[i], errs[i] = shm.Rendezvous(rctx, i, 2, name, shm.WithToken(token)) })
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(tb, err, "rank %d", i)
	}
	return ts, groupsOn(tb, ts)
}
