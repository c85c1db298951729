package tcp

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
)

// TestBidirectionalCreditStress: both ranks stream to each other at once
// through tiny socket buffers and a small queue, so that credit frames are
// frequent and socket writes block often. Readers must never block on a
// write, or the two ranks deadlock.
func TestBidirectionalCreditStress(t *testing.T) {
	ts := mesh(t, 2, WithSocketBuffer(4<<10), WithQueueLimit(32<<10))
	defer ts[1].Close()
	defer ts[0].Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const msgs = 300
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for me := range 2 {
		other := 1 - me
		wg.Go(func() {
			p := make([]byte, 24<<10)
			for i := range msgs {
				if err := ts[me].Send(ctx, other, 1, transport.Meta{Seq: uint64(i)}, p); err != nil {
					errs <- fmt.Errorf("rank %d send %d: %w", me, i, err)
					return
				}
			}
		})
		wg.Go(func() {
			for i := range msgs {
				m, err := ts[me].Recv(ctx, other, 1)
				if err != nil {
					errs <- fmt.Errorf("rank %d recv %d: %w", me, i, err)
					return
				}
				if m.Meta.Seq != uint64(i) {
					errs <- fmt.Errorf("rank %d recv %d: seq %d", me, i, m.Meta.Seq)
					return
				}
				ts[me].Release(m.Payload)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}
