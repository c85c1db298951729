//go:build linux

package shm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/shm/internal/ring"
)

// pair starts a 2-rank job in one process with New over a socket pair.
func pair(t testing.TB, opts ...Option) [2]*Transport {
	t.Helper()
	a, b := socketPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var ts [2]*Transport
	var errs [2]error
	var wg sync.WaitGroup
	for i, c := range []*net.UnixConn{a, b} {
		wg.Go(func() {
			conns := make([]*net.UnixConn, 2)
			conns[1-i] = c
			o := append([]Option{WithToken(testToken), WithLogger(quiet())}, opts...)
			ts[i], errs[i] = New(ctx, i, 2, conns, o...)
		})
	}
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		t.Fatal(err)
	}
	return ts
}

const fuzzRing = ring.MinSize

// FuzzCorruptRing: rank 1 sends some messages to rank 0, then bytes of the
// pair's shared memory (either direction, control block or data) are
// overwritten with fuzzer input, as a buggy or hostile rank 1 could, and
// both ranks go on using the link. Whatever was written, nothing panics
// or reads out of bounds, and every call ends with a result, its
// context's error, or a *PeerError naming the other rank (for corruption
// it detects: wrapping ErrProtocol).
func FuzzCorruptRing(f *testing.F) {
	region := 2 * (ring.CtrlSize + fuzzRing)
	for _, off := range []int{0, 8, 16, 128, 136, 256, ring.CtrlSize, ring.CtrlSize + 4, ring.CtrlSize + 8, ring.CtrlSize + 40,
		region / 2, region/2 + 128, region/2 + 136, region/2 + ring.CtrlSize + 8} {
		f.Add(uint16(off), []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}, uint8(3), uint16(100))
		f.Add(uint16(off), []byte{1}, uint8(1), uint16(5000))
	}
	// A remote record pointing anywhere, written where the next record goes.
	f.Add(uint16(ring.CtrlSize+region/2), []byte("GDSR\x01\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00"), uint8(0), uint16(0))
	f.Fuzz(func(t *testing.T, off uint16, data []byte, msgs uint8, size uint16) {
		ts := pair(t, WithRingSize(fuzzRing), WithMaxFrame(64<<10), WithQueueLimit(256<<10), WithHeartbeat(0, 0), WithSpin(0))
		var wg sync.WaitGroup
		defer wg.Wait() // after the Closes, which end what still waits
		defer ts[1].Close()
		defer ts[0].Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		check := func(what string, err error) {
			if err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || errors.Is(err, transport.ErrClosed) {
				return
			}
			if errors.Is(err, transport.ErrMessageTooLong) { // RecvReduce into a buffer that is too short
				return
			}
			var pe *transport.PeerError
			if !errors.As(err, &pe) {
				t.Errorf("%s: not a *PeerError: %v", what, err)
				return
			}
			if errors.Is(err, transport.ErrMessageTooLong) {
				return
			}
			if pe.Rank != 0 && pe.Rank != 1 {
				t.Errorf("%s: names rank %d", what, pe.Rank)
			}
		}
		n := int(msgs % 8)
		sizes := func(i int) int { return (int(size) * (i + 1)) % (48 << 10) }
		for i := range n {
			if err := ts[1].Send(ctx, 0, 1, transport.Header{byte(i)}, make([]byte, sizes(i))); err != nil {
				t.Fatal(err)
			}
		}
		p := ts[1].peers[0].Load()
		o := int(off) % region
		copy(p.region[o:], data)
		p.myBell.Force()
		p.peerBell.Force()

		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			check("send 1->0", ts[1].Send(sctx, 0, 1, transport.Header{}, make([]byte, 3000)))
		})
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			check("send 0->1", ts[0].Send(sctx, 1, 2, transport.Header{}, make([]byte, 7000)))
		})
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			_, _, err := ts[1].RecvInto(rctx, 0, 2, make([]byte, 8<<10))
			check("recv 1<-0", err)
		})
		buf := make([]byte, 64<<10)
		for i := 0; i <= n; i++ {
			rctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			var err error
			switch i % 3 {
			case 0:
				var m transport.Message
				m, err = ts[0].Recv(rctx, 1, 1)
				ts[0].Release(m.Payload)
			case 1:
				_, _, err = ts[0].RecvInto(rctx, 1, 1, buf)
			default: // combines only a message of exactly len(dst) bytes
				dst := buf[:sizes(i)-sizes(i)%4]
				_, _, err = ts[0].RecvReduce(rctx, 1, 1, dst, 4, func(d, s []byte) {
					if len(d) != len(s) || len(d)%4 != 0 {
						t.Errorf("combine of %d bytes into %d", len(s), len(d))
					}
					copy(d, s)
				})
			}
			cancel()
			check(fmt.Sprintf("recv 0<-1 #%d", i), err)
			if err != nil && !errors.Is(err, transport.ErrMessageTooLong) {
				break
			}
		}
	})
}
