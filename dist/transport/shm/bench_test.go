//go:build linux

package shm

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/gdist/gdist/dist/transport"
)

// TestSteadyStateNoAlloc: once buffers are pooled, Send + Recv + Release
// and Send + RecvInto (posted or queued) allocate nothing, counting the
// reader goroutines too (AllocsPerRun counts the whole process); sizes
// below, at and far above the ring size.
func TestSteadyStateNoAlloc(t *testing.T) {
	ts := mesh(t, 2)
	defer ts[1].Close()
	defer ts[0].Close()
	ctx := context.Background()
	for _, size := range []int{8, 16 << 10, 1 << 20, 4 << 20} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			p := make([]byte, size)
			dst := make([]byte, size)
			// A long-lived sender, so that rounds start no goroutines.
			kick, errc := make(chan struct{}), make(chan error)
			go func() {
				for range kick {
					errc <- ts[0].Send(ctx, 1, 3, transport.Header{2}, p)
				}
			}()
			defer close(kick)
			round := func() {
				if err := ts[0].Send(ctx, 1, 3, transport.Header{1}, p); err != nil {
					panic(err)
				}
				m, err := ts[1].Recv(ctx, 0, 3)
				if err != nil {
					panic(err)
				}
				ts[1].Release(m.Payload)
				kick <- struct{}{}
				if _, _, err := ts[1].RecvInto(ctx, 0, 3, dst); err != nil {
					panic(err)
				}
				if err := <-errc; err != nil {
					panic(err)
				}
			}
			for range 50 {
				round()
			}
			if raceEnabled {
				t.Skip("allocation counts are not meaningful under -race")
			}
			require.Zero(t, testing.AllocsPerRun(100, round))
		})
	}
}

// BenchmarkPingPong measures the round trip of an 8-byte message between
// two ranks in one process (one op = one round trip).
func BenchmarkPingPong(b *testing.B) {
	ts := mesh(b, 2)
	defer ts[1].Close()
	defer ts[0].Close()
	ctx := context.Background()
	p := make([]byte, 8)
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 8)
		for {
			h, n, err := ts[1].RecvInto(ctx, 0, 1, buf)
			if err != nil {
				done <- nil
				return
			}
			if err := ts[1].Send(ctx, 0, 1, h, buf[:n]); err != nil {
				done <- err
				return
			}
		}
	}()
	dst := make([]byte, 8)
	b.ReportAllocs()
	for b.Loop() {
		if err := ts[0].Send(ctx, 1, 1, transport.Header{}, p); err != nil {
			b.Fatal(err)
		}
		if _, _, err := ts[0].RecvInto(ctx, 1, 1, dst); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	ts[0].Close()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

// BenchmarkStream measures one-way throughput: rank 0 sends b.N messages,
// rank 1 receives them into its buffer (RecvInto).
func BenchmarkStream(b *testing.B) {
	for _, size := range []int{1 << 10, 64 << 10, 1 << 20, 16 << 20} {
		b.Run(sizeName(size), func(b *testing.B) {
			ts := mesh(b, 2)
			defer ts[1].Close()
			defer ts[0].Close()
			ctx := context.Background()
			p := make([]byte, size)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			done := make(chan error, 1)
			n := b.N
			go func() {
				dst := make([]byte, size)
				for range n {
					if _, _, err := ts[1].RecvInto(ctx, 0, 1, dst); err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			b.ResetTimer()
			for range n {
				if err := ts[0].Send(ctx, 1, 1, transport.Header{}, p); err != nil {
					b.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		})
	}
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// cpuTime is the CPU time this process used so far.
func cpuTime(t testing.TB) time.Duration {
	var ru unix.Rusage
	require.NoError(t, unix.Getrusage(unix.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuShare runs f and returns the fraction of a core this process used
// while it ran.
func cpuShare(t testing.TB, f func()) float64 {
	c0, w0 := cpuTime(t), time.Now()
	f()
	c1, w1 := cpuTime(t), time.Now()
	return float64(c1-c0) / float64(w1.Sub(w0))
}

// idleCPU sleeps for d and returns the fraction of a core this process
// used meanwhile.
func idleCPU(t testing.TB, d time.Duration) float64 {
	return cpuShare(t, func() { time.Sleep(d) })
}

// TestIdleReceiverCPU: ranks blocked in a receive park on the futex after
// their brief spin: from the first millisecond on, the whole process
// (both ranks, their readers and heartbeat monitors) uses well under 5 %
// of a core.
func TestIdleReceiverCPU(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	ts := mesh(t, 2)
	defer ts[1].Close()
	defer ts[0].Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Some traffic first, so the readers have spun and parked once.
	for range 100 {
		require.NoError(t, ts[0].Send(ctx, 1, 1, transport.Header{}, make([]byte, 64)))
		_, err := ts[1].Recv(ctx, 0, 1)
		require.NoError(t, err)
	}
	res := make(chan error, 2)
	go func() { _, err := ts[1].Recv(ctx, 0, 2); res <- err }()
	go func() { _, err := ts[0].Recv(ctx, 1, 2); res <- err }()
	time.Sleep(time.Millisecond)
	frac := idleCPU(t, time.Second)
	t.Logf("idle: %.2f%% of a core over 1s", 100*frac)
	assert.Less(t, frac, 0.05)
	require.NoError(t, ts[0].Send(ctx, 1, 2, transport.Header{}, []byte("wake")))
	require.NoError(t, ts[1].Send(ctx, 0, 2, transport.Header{}, []byte("wake")))
	require.NoError(t, <-res)
	require.NoError(t, <-res)
}

// TestSingleCopy: once the ranks have checked they can read each other's
// memory, large messages go as remote records (the receiver reads the
// sender's buffer with process_vm_readv), queued or posted, intact; with
// WithSingleCopy(0) they stream through the ring.
func TestSingleCopy(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprint(on), func(t *testing.T) {
			opts := []Option{WithSingleCopy(256 << 10)}
			if !on {
				opts = append(opts, WithSingleCopy(0))
			}
			ts := mesh(t, 2, opts...)
			defer ts[1].Close()
			defer ts[0].Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			// Small messages both ways let the readers probe.
			for r := range 2 {
				require.NoError(t, ts[r].Send(ctx, 1-r, 1, transport.Header{}, []byte("hi")))
				_, err := ts[1-r].Recv(ctx, r, 1)
				require.NoError(t, err)
			}
			require.Eventually(t, func() bool {
				require.NoError(t, ts[1].Send(ctx, 0, 1, transport.Header{}, []byte("hi")))
				_, err := ts[0].Recv(ctx, 1, 1)
				require.NoError(t, err)
				return ts[0].peers[1].Load().outR.RemoteOK() == on
			}, 5*time.Second, time.Millisecond)
			big := make([]byte, 4<<20+5)
			for i := range big {
				big[i] = byte(i * 7)
			}
			require.NoError(t, ts[0].Send(ctx, 1, 2, transport.Header{9}, big)) // queued: the reader reads it into a pooled buffer
			m, err := ts[1].Recv(ctx, 0, 2)
			require.NoError(t, err)
			require.Equal(t, transport.Header{9}, m.Header)
			require.True(t, bytes.Equal(big, m.Payload))
			dst := make([]byte, len(big))
			done := make(chan error, 1)
			go func() { _, _, err := ts[1].RecvInto(ctx, 0, 3, dst); done <- err }()
			time.Sleep(5 * time.Millisecond)
			require.NoError(t, ts[0].Send(ctx, 1, 3, transport.Header{}, big)) // posted
			require.NoError(t, <-done)
			require.True(t, bytes.Equal(big, dst))
			go func() { done <- ts[0].Send(ctx, 1, 3, transport.Header{}, big) }()
			_, n, err := ts[1].RecvInto(ctx, 0, 3, dst[:10])
			require.ErrorIs(t, err, transport.ErrMessageTooLong)
			require.Equal(t, len(big), n)
			require.NoError(t, <-done)
			p := ts[0].peers[1].Load()
			p.wmu.Lock()
			sent := p.remoteSent
			p.wmu.Unlock()
			if on {
				require.Equal(t, uint64(3), sent)
			} else {
				require.Zero(t, sent)
			}
		})
	}
}
