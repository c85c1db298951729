package tcp

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/tcp/internal/wire"
)

// TestBidirectionalCreditStress: both ranks stream to each other at once
// through small socket buffers and a small queue, so that credit frames are
// frequent and socket writes block often. (Socket buffers much below 64 KiB
// stall loopback TCP itself, with or without gdist.)
func TestBidirectionalCreditStress(t *testing.T) {
	ts := mesh(t, 2, WithSocketBuffer(64<<10), WithQueueLimit(32<<10))
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
				if err := ts[me].Send(ctx, other, 1, seqHdr(uint64(i)), p); err != nil {
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
				if seqOf(m.Header) != uint64(i) {
					errs <- fmt.Errorf("rank %d recv %d: seq %d", me, i, seqOf(m.Header))
					return
				}
				ts[me].Release(m.Payload)
			}
		})
	}
	wg.Wait()
	close(errs)
	if len(errs) > 0 {
		for r, tr := range ts {
			p := tr.peers[1-r].Load()
			p.cmu.Lock()
			t.Logf("rank %d -> %d: inflight %d waiters %d blockedSent %v | freed %d peerBlocked %v pending %d tx %d rx %d credit tokens %d",
				r, 1-r, p.inflight, p.waiters, p.blockedSent, p.freed.Load(), p.peerBlocked.Load(), p.pending.Load(), p.tx.Load(), p.rx.Load(), len(p.credit))
			p.cmu.Unlock()
		}
	}
	for err := range errs {
		require.NoError(t, err)
	}
}

// TestReaderNeverBlocksOnWrites: a peer that never reads, while this rank
// sends to it until the socket is full and owes it credits (it keeps saying
// it is blocked), must not stop this rank from receiving what it sends: the
// reader never writes (control frames go through the link's control
// goroutine).
func TestReaderNeverBlocksOnWrites(t *testing.T) {
	lns, addrs := listeners(t, 2)
	lns[1].Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type res struct {
		t   *Transport
		err error
	}
	r0 := make(chan res, 1)
	go func() {
		tr, err := New(ctx, 0, 2, lns[0], addrs, WithToken(testToken), WithLogger(quiet()), WithSocketBuffer(64<<10))
		r0 <- res{tr, err}
	}()
	conn, _, err := fakeClient(t, addrs[0], 1, 2, testToken, 0, wire.ModeMesh)
	require.NoError(t, err)
	conn.SetReadBuffer(64 << 10)
	r := <-r0
	require.NoError(t, r.err)
	defer r.t.Close()

	const msgs, batch = 40000, 500
	frame := append(header(wire.Header{Kind: wire.Data, Src: 1, Tag: 1, Len: 1}), 'x')
	frame = append(frame, header(wire.Header{Kind: wire.Blocked, Src: 1})...)
	var chunk []byte
	for range batch {
		chunk = append(chunk, frame...)
	}
	serr := make(chan error, 1)
	go func() { // blocks once the peer's socket is full; Close ends it
		for {
			if err := r.t.Send(ctx, 1, 9, transport.Header{}, make([]byte, 16<<10)); err != nil {
				serr <- err
				return
			}
		}
	}()
	werr := make(chan error, 1)
	go func() {
		for range msgs / batch {
			if _, err := conn.Write(chunk); err != nil {
				werr <- err
				return
			}
		}
		werr <- nil
	}()
	for i := range msgs {
		m, err := r.t.Recv(ctx, 1, 1)
		require.NoError(t, err, "message %d", i)
		r.t.Release(m.Payload)
	}
	require.NoError(t, <-werr)
	conn.Close()
	r.t.Close()
	require.Error(t, <-serr)
}
