//go:build linux

package shm

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
)

// TestBidirectionalStress: both ranks stream to each other at once, from
// several goroutines on several tags, through the smallest ring and a
// small queue limit, with and without spinning, so that senders wait for
// ring space and for credit all the time and readers park and wake
// constantly. Every message arrives intact and in order per tag.
//
// The large variant sends messages of up to 200 KiB through 256 KiB rings,
// most of them long enough that a sender finding the ring drained restarts
// it at the start of its next lap (lap marks), while other messages still
// stream through.
func TestBidirectionalStress(t *testing.T) {
	for _, c := range []struct {
		name       string
		ring, max  int
		queueLimit int
		spin       time.Duration
	}{
		{"spin=0", 4 << 10, 40 << 10, 32 << 10, 0},
		{"spin=default", 4 << 10, 40 << 10, 32 << 10, DefaultSpin},
		{"large", 256 << 10, 200 << 10, 1 << 20, DefaultSpin},
	} {
		t.Run(c.name, func(t *testing.T) {
			ts := mesh(t, 2, WithRingSize(c.ring), WithQueueLimit(c.queueLimit), WithSpin(c.spin))
			defer ts[1].Close()
			defer ts[0].Close()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			const msgs, tags = 200, 3
			size := func(tag, i int) int { return (i*7919 + tag*104729) % c.max }
			body := func(me, tag, i int) []byte {
				b := make([]byte, size(tag, i))
				for k := range b {
					b[k] = byte(me*31 + tag*7 + i + k)
				}
				return b
			}
			var wg sync.WaitGroup
			errs := make(chan error, 4*tags)
			for me := range 2 {
				other := 1 - me
				for tag := range tags {
					wg.Go(func() {
						for i := range msgs {
							var h transport.Header
							binary.LittleEndian.PutUint64(h[:], uint64(i))
							if err := ts[me].Send(ctx, other, uint32(tag), h, body(me, tag, i)); err != nil {
								errs <- fmt.Errorf("rank %d tag %d send %d: %w", me, tag, i, err)
								return
							}
						}
					})
					wg.Go(func() {
						dst := make([]byte, c.max)
						for i := range msgs {
							var got []byte
							var h transport.Header
							if i%2 == 0 {
								m, err := ts[me].Recv(ctx, other, uint32(tag))
								if err != nil {
									errs <- fmt.Errorf("rank %d tag %d recv %d: %w", me, tag, i, err)
									return
								}
								got, h = m.Payload, m.Header
							} else {
								hh, n, err := ts[me].RecvInto(ctx, other, uint32(tag), dst)
								if err != nil {
									errs <- fmt.Errorf("rank %d tag %d recv %d: %w", me, tag, i, err)
									return
								}
								got, h = dst[:n], hh
							}
							if binary.LittleEndian.Uint64(h[:]) != uint64(i) || !bytes.Equal(got, body(other, tag, i)) {
								errs <- fmt.Errorf("rank %d tag %d recv %d: wrong message", me, tag, i)
								return
							}
							if i%2 == 0 {
								ts[me].Release(got)
							}
						}
					})
				}
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			if c.name == "large" {
				restarts := 0
				for _, tr := range ts {
					for r := range tr.peers {
						if p := tr.peers[r].Load(); p != nil {
							p.wmu.Lock()
							restarts += int(p.restarts)
							p.wmu.Unlock()
						}
					}
				}
				t.Logf("%d lap restarts", restarts)
				require.NotZero(t, restarts, "no sender restarted its ring")
			}
		})
	}
}
