package tcp

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/transporttest"
)

// seqHdr is a header holding one little-endian sequence number.
func seqHdr(seq uint64) transport.Header {
	var h transport.Header
	binary.LittleEndian.PutUint64(h[:], seq)
	return h
}

func seqOf(h transport.Header) uint64 { return binary.LittleEndian.Uint64(h[:]) }

// TestSteadyStateNoAlloc: once buffers are pooled, Send, Recv and Release,
// and Send and RecvInto, allocate nothing — counting the reader goroutine's allocations too, since
// AllocsPerRun counts the whole process.
func TestSteadyStateNoAlloc(t *testing.T) {
	ts := mesh(t, 2)
	defer ts[1].Close()
	defer ts[0].Close()
	ctx := context.Background()
	for _, size := range []int{8, 16 << 10, postedMax, 4 << 20} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			p := make([]byte, size)
			dst := make([]byte, size)
			round := func() {
				if err := ts[0].Send(ctx, 1, 3, seqHdr(1), p); err != nil {
					panic(err)
				}
				m, err := ts[1].Recv(ctx, 0, 3)
				if err != nil {
					panic(err)
				}
				ts[1].Release(m.Payload)
				if err := ts[0].Send(ctx, 1, 3, seqHdr(2), p); err != nil {
					panic(err)
				}
				if _, _, err := ts[1].RecvInto(ctx, 0, 3, dst); err != nil {
					panic(err)
				}
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
			err = ts[1].Send(ctx, 0, 1, m.Header, m.Payload)
			ts[1].Release(m.Payload)
			if err != nil {
				done <- err
				return
			}
		}
	}()
	b.ReportAllocs()
	for b.Loop() {
		if err := ts[0].Send(ctx, 1, 1, transport.Header{}, p); err != nil {
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

// BenchmarkLargeRecv compares receiving a large message with RecvInto and
// with Recv followed by a copy into the caller's buffer and Release, at
// postedMax (the reader reads the payload from the socket into the
// caller's buffer when the receive is already posted) and above it (the
// reader reads into a pooled buffer that RecvInto copies from). Sender and
// receiver run concurrently; one op = one message.
func BenchmarkLargeRecv(b *testing.B) {
	ts := mesh(b, 2)
	defer ts[1].Close()
	defer ts[0].Close()
	ctx := context.Background()
	for _, size := range []int{postedMax, 4 << 20} {
		p := make([]byte, size)
		dst := make([]byte, size)
		for _, mode := range []string{"RecvInto", "Recv+copy"} {
			b.Run(sizeName(size)+"/"+mode, func(b *testing.B) {
				n := b.N
				errc := make(chan error, 1)
				go func() {
					for range n {
						if err := ts[0].Send(ctx, 1, 1, transport.Header{}, p); err != nil {
							errc <- err
							return
						}
					}
					errc <- nil
				}()
				b.SetBytes(int64(size))
				b.ReportAllocs()
				b.ResetTimer()
				for range n {
					if mode == "RecvInto" {
						if _, _, err := ts[1].RecvInto(ctx, 0, 1, dst); err != nil {
							b.Fatal(err)
						}
						continue
					}
					m, err := ts[1].Recv(ctx, 0, 1)
					if err != nil {
						b.Fatal(err)
					}
					copy(dst, m.Payload)
					ts[1].Release(m.Payload)
				}
				b.StopTimer()
				if err := <-errc; err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}

// distinctTags sends one 64-byte message on each of n distinct tags from
// rank 0 to rank 1 over TCP, half received with Recv and half with
// RecvInto, and returns the heap growth.
func distinctTags(tb testing.TB, ts []*Transport, n int) int64 {
	ctx := context.Background()
	p := make([]byte, 64)
	dst := make([]byte, 64)
	run := func(lo, hi uint32) {
		errc := make(chan error, 1)
		go func() {
			for tag := lo; tag < hi; tag++ {
				if err := ts[0].Send(ctx, 1, tag, transport.Header{}, p); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
		for tag := lo; tag < hi; tag++ {
			if tag&1 == 0 {
				m, err := ts[1].Recv(ctx, 0, tag)
				if err != nil {
					tb.Fatal(err)
				}
				ts[1].Release(m.Payload)
			} else if _, _, err := ts[1].RecvInto(ctx, 0, tag, dst); err != nil {
				tb.Fatal(err)
			}
		}
		if err := <-errc; err != nil {
			tb.Fatal(err)
		}
	}
	run(0, 1024)
	before := transporttest.HeapInUse()
	run(1024, 1024+uint32(n))
	return transporttest.HeapInUse() - before
}

// TestDistinctTagsNoLeak: distinct tags leave nothing behind on the
// receiver: 1,000,000 of them (100,000 with -short) grow the heap by less
// than 2 MiB.
func TestDistinctTagsNoLeak(t *testing.T) {
	n := 1_000_000
	if testing.Short() {
		n = 100_000
	}
	ts := mesh(t, 2)
	defer ts[1].Close()
	defer ts[0].Close()
	growth := distinctTags(t, ts, n)
	t.Logf("TCP: %d distinct tags: heap growth %d bytes (%.1f B/tag), %d queues left", n, growth, float64(growth)/float64(n), ts[1].box.Len())
	require.Less(t, growth, int64(2<<20))
	require.Zero(t, ts[1].box.Len())
}

// BenchmarkDistinctTags: 1,000,000 distinct tags per op over TCP; reports
// the heap growth.
func BenchmarkDistinctTags(b *testing.B) {
	ts := mesh(b, 2)
	defer ts[1].Close()
	defer ts[0].Close()
	b.ReportAllocs()
	var growth int64
	for b.Loop() {
		growth = distinctTags(b, ts, 1_000_000)
	}
	b.ReportMetric(float64(growth), "heap-growth-B")
}
