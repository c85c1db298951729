package shm

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
)

// TestReceiveOrderAcrossPaths mixes the ways a message reaches a receive —
// taken straight from the ring by the waiting receiver, claimed as a
// posted receive, or queued by the reader and taken later — and checks
// that every (source, tag) stream arrives whole and in order. Receivers of
// four tags run concurrently, with Recv, RecvInto and RecvReduce, while
// the sender interleaves the tags at random, with sizes from 0 bytes to
// past the transport's first-piece size and random pauses.
func TestReceiveOrderAcrossPaths(t *testing.T) {
	ts := mesh(t, 2)
	defer ts[1].Close()
	defer ts[0].Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	const tags, perTag = 4, 400
	rng := rand.New(rand.NewPCG(1, 2))
	type msg struct {
		tag  uint32
		size int
	}
	var plan []msg
	left := [tags]int{}
	for i := range left {
		left[i] = perTag
	}
	for len(plan) < tags*perTag {
		tg := rng.IntN(tags)
		if left[tg] == 0 {
			continue
		}
		left[tg]--
		size := []int{0, 8, 8, 8, 24, 1000, 40 << 10, 200 << 10}[rng.IntN(8)]
		if tg == 3 { // the reducing receive takes one length
			size = 64
		}
		plan = append(plan, msg{uint32(tg + 1), size})
	}
	sizes := make([][]int, tags) // per tag, in order
	for _, m := range plan {
		sizes[m.tag-1] = append(sizes[m.tag-1], m.size)
	}

	// payload i of a tag: 8-byte sequence number, then bytes derived from it.
	fill := func(b []byte, seq int) {
		for j := range b {
			b[j] = byte(seq*7 + j)
		}
		if len(b) >= 8 {
			binary.LittleEndian.PutUint64(b, uint64(seq))
		}
	}
	check := func(tag uint32, seq int, b []byte) error {
		want := make([]byte, len(b))
		fill(want, seq)
		if string(want) != string(b) {
			return fmt.Errorf("tag %d message %d: wrong payload", tag, seq)
		}
		return nil
	}

	var wg sync.WaitGroup
	errs := make(chan error, tags+1)
	wg.Go(func() {
		seq := make([]int, tags)
		r := rand.New(rand.NewPCG(3, 4))
		for _, m := range plan {
			b := make([]byte, m.size)
			if m.tag == 4 {
				for j := 0; j < 16; j++ {
					binary.LittleEndian.PutUint32(b[4*j:], uint32(seq[3]+j))
				}
			} else {
				fill(b, seq[m.tag-1])
			}
			seq[m.tag-1]++
			if err := ts[0].Send(ctx, 1, m.tag, transport.Header{}, b); err != nil {
				errs <- err
				return
			}
			if r.IntN(50) == 0 {
				time.Sleep(time.Duration(r.IntN(200)) * time.Microsecond)
			}
		}
	})
	// Tag 1: Recv. Tag 2: RecvInto. Tag 3: RecvInto, slowly (its messages queue).
	// Tag 4: RecvReduce (adds uint32s into an accumulator).
	wg.Go(func() {
		for i, n := range sizes[0] {
			m, err := ts[1].Recv(ctx, 0, 1)
			if err == nil && len(m.Payload) != n {
				err = fmt.Errorf("tag 1 message %d: %d bytes, want %d", i, len(m.Payload), n)
			}
			if err == nil {
				err = check(1, i, m.Payload)
			}
			if err != nil {
				errs <- err
				return
			}
			ts[1].Release(m.Payload)
		}
	})
	for _, tg := range []uint32{2, 3} {
		wg.Go(func() {
			buf := make([]byte, 256<<10)
			for i, n := range sizes[tg-1] {
				if tg == 3 && i%20 == 0 {
					time.Sleep(2 * time.Millisecond)
				}
				_, got, err := ts[1].RecvInto(ctx, 0, tg, buf)
				if err == nil && got != n {
					err = fmt.Errorf("tag %d message %d: %d bytes, want %d", tg, i, got, n)
				}
				if err == nil {
					err = check(tg, i, buf[:got])
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Go(func() {
		acc := make([]byte, 64)
		add := func(dst, src []byte) {
			for j := 0; j+4 <= len(dst); j += 4 {
				binary.LittleEndian.PutUint32(dst[j:], binary.LittleEndian.Uint32(dst[j:])+binary.LittleEndian.Uint32(src[j:]))
			}
		}
		for i := range sizes[3] {
			clear(acc)
			if _, _, err := ts[1].RecvReduce(ctx, 0, 4, acc, 4, add); err != nil {
				errs <- err
				return
			}
			for j := 0; j < 16; j++ {
				if got := binary.LittleEndian.Uint32(acc[4*j:]); got != uint32(i+j) {
					errs <- fmt.Errorf("tag 4 message %d: element %d is %d, want %d", i, j, got, i+j)
					return
				}
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// TestTakeRefusesTooLong checks that a receive whose buffer is too short
// for the next message still reports ErrMessageTooLong (with the length)
// when it waits for the message, and that the stream goes on.
func TestTakeRefusesTooLong(t *testing.T) {
	ts := mesh(t, 2)
	defer ts[1].Close()
	defer ts[0].Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go func() {
		time.Sleep(5 * time.Millisecond) // the receive below waits first
		_ = ts[0].Send(ctx, 1, 7, transport.Header{}, make([]byte, 100))
		_ = ts[0].Send(ctx, 1, 7, transport.Header{}, []byte("next"))
	}()
	dst := make([]byte, 10)
	_, n, err := ts[1].RecvInto(ctx, 0, 7, dst)
	require.ErrorIs(t, err, transport.ErrMessageTooLong)
	require.Equal(t, 100, n)
	_, n, err = ts[1].RecvInto(ctx, 0, 7, dst)
	require.NoError(t, err)
	require.Equal(t, "next", string(dst[:n]))
}

// TestReaderDrainsAfterTake: after a receive took its message straight
// from the ring, the reader still drains what arrives while nobody
// receives — more than the ring holds — so the sender never waits for a
// receive it does not need (the queue limit allows it), and a receive
// blocked on another tag is served.
func TestReaderDrainsAfterTake(t *testing.T) {
	ts := mesh(t, 2, WithRingSize(64<<10))
	defer ts[1].Close()
	defer ts[0].Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// A ping-pong leaves rank 1 with no receive polling the ring.
	buf := make([]byte, 8)
	for range 100 {
		require.NoError(t, ts[0].Send(ctx, 1, 1, transport.Header{}, buf))
		_, _, err := ts[1].RecvInto(ctx, 0, 1, buf)
		require.NoError(t, err)
	}
	// 1 MiB in 4 KiB messages through a 64 KiB ring, nobody receiving.
	msg := make([]byte, 4<<10)
	start := time.Now()
	for i := range 256 {
		msg[0] = byte(i)
		require.NoError(t, ts[0].Send(ctx, 1, 2, transport.Header{}, msg))
	}
	t.Logf("sent 1 MiB with no receive in %v", time.Since(start))
	for i := range 256 {
		_, n, err := ts[1].RecvInto(ctx, 0, 2, msg)
		require.NoError(t, err)
		require.Equal(t, 4<<10, n)
		require.Equal(t, byte(i), msg[0])
	}

	// A receive that stops polling and blocks is served by the reader,
	// even while another receive takes records from the ring.
	got := make(chan error, 1)
	go func() {
		_, _, err := ts[1].RecvInto(ctx, 0, 3, make([]byte, 8))
		got <- err
	}()
	time.Sleep(20 * time.Millisecond) // well past the spin: it blocks
	for range 10 {
		require.NoError(t, ts[0].Send(ctx, 1, 1, transport.Header{}, buf))
		_, _, err := ts[1].RecvInto(ctx, 0, 1, buf)
		require.NoError(t, err)
	}
	require.NoError(t, ts[0].Send(ctx, 1, 3, transport.Header{}, buf))
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the blocked receive was not served")
	}
}

// TestOwedSettles: a receive that takes a small record from the ring
// leaves its ring space and credit owed (settle), and they come back
// without any further receive — the reader settles them — so a sender
// that needs that credit is not held up by a receiver that stopped
// receiving. A record above the limit settles at once.
func TestOwedSettles(t *testing.T) {
	const limit = 64 << 10
	ts := mesh(t, 2, WithQueueLimit(limit), WithRingSize(256<<10))
	defer ts[1].Close()
	defer ts[0].Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p := ts[1].peers[0].Load()
	require.Equal(t, uint64(limit/16), p.owedMax)
	state := func() (owed int, owings uint64) {
		p.rmu.Lock()
		defer p.rmu.Unlock()
		return p.owed, p.owings
	}
	// recv receives one message of n bytes under tag, waiting for it
	// before it is sent, and reports whether its receive left it owed.
	recv := func(tag uint32, n int) bool {
		_, before := state()
		got := make(chan error, 1)
		go func() {
			_, k, err := ts[1].RecvInto(ctx, 0, tag, make([]byte, n))
			if err == nil && k != n {
				err = fmt.Errorf("received %d bytes, want %d", k, n)
			}
			got <- err
		}()
		time.Sleep(20 * time.Microsecond)
		require.NoError(t, ts[0].Send(ctx, 1, tag, transport.Header{}, make([]byte, n)))
		require.NoError(t, <-got)
		_, after := state()
		return after > before
	}

	small := limit / 16
	for attempt := 0; !recv(1, small); attempt++ {
		// The reader may have delivered it before the receive polled.
		require.Less(t, attempt, 100, "no receive left its record owed")
	}
	// The rest of the window: it passes only once the owed credit is back.
	start := time.Now()
	big := make([]byte, limit-small+1)
	require.NoError(t, ts[0].Send(ctx, 1, 2, transport.Header{}, big))
	t.Logf("the send that needed the owed credit waited %v", time.Since(start))
	require.Less(t, time.Since(start), time.Second)
	owed, _ := state()
	require.Zero(t, owed)
	_, n, err := ts[1].RecvInto(ctx, 0, 2, big)
	require.NoError(t, err)
	require.Equal(t, len(big), n)

	for range 20 {
		require.False(t, recv(3, small+1), "a record above the limit was left owed")
		owed, _ := state()
		require.Zero(t, owed)
	}
}
