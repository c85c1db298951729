package tcp

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
)

// TestSteadyStateNoAlloc: once buffers are pooled, Send, Recv and Release
// allocate nothing — counting the reader goroutine's allocations too, since
// AllocsPerRun counts the whole process.
func TestSteadyStateNoAlloc(t *testing.T) {
	ts := mesh(t, 2)
	defer ts[1].Close()
	defer ts[0].Close()
	ctx := context.Background()
	for _, size := range []int{8, 16 << 10, 1 << 20} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			p := make([]byte, size)
			round := func() {
				if err := ts[0].Send(ctx, 1, 3, transport.Meta{Seq: 1}, p); err != nil {
					panic(err)
				}
				m, err := ts[1].Recv(ctx, 0, 3)
				if err != nil {
					panic(err)
				}
				ts[1].Release(m.Payload)
			}
			for range 100 {
				round()
			}
			if raceEnabled {
				t.Skip("allocation counts are not meaningful under -race")
			}
			require.Zero(t, testing.AllocsPerRun(200, round))
		})
	}
}

// BenchmarkPingPong measures the round trip of an 8-byte message between two
// ranks over loopback (one op = one round trip).
func BenchmarkPingPong(b *testing.B) {
	ts := mesh(b, 2)
	defer ts[1].Close()
	defer ts[0].Close()
	ctx := context.Background()
	p := make([]byte, 8)
	done := make(chan error, 1)
	go func() {
		for {
			m, err := ts[1].Recv(ctx, 0, 1)
			if err != nil {
				done <- nil
				return
			}
			err = ts[1].Send(ctx, 0, 1, m.Meta, m.Payload)
			ts[1].Release(m.Payload)
			if err != nil {
				done <- err
				return
			}
		}
	}()
	b.ReportAllocs()
	for b.Loop() {
		if err := ts[0].Send(ctx, 1, 1, transport.Meta{}, p); err != nil {
			b.Fatal(err)
		}
		m, err := ts[0].Recv(ctx, 1, 1)
		if err != nil {
			b.Fatal(err)
		}
		ts[0].Release(m.Payload)
	}
	b.StopTimer()
	ts[0].Close()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

// BenchmarkStream measures one-way throughput: rank 0 sends b.N messages,
// rank 1 receives and releases them.
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
				for range n {
					m, err := ts[1].Recv(ctx, 0, 1)
					if err != nil {
						done <- err
						return
					}
					ts[1].Release(m.Payload)
				}
				done <- nil
			}()
			b.ResetTimer()
			for range n {
				if err := ts[0].Send(ctx, 1, 1, transport.Meta{}, p); err != nil {
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
