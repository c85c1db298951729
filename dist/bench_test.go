package dist

import (
	"context"
	"fmt"
	"math"
	"testing"
)

// BenchmarkAllReduce4096 is the steady-state all-reduce of 4096 float32s
// (16 KiB) between two ranks in this process, on the in-process and the TCP
// transport; run with -benchmem to see that it allocates nothing, also under
// a cancellable context (watched once, not per call).
func BenchmarkAllReduce4096(b *testing.B) {
	for _, tr := range []string{"local", "tcp"} {
		b.Run(tr, func(b *testing.B) {
			benchAllReduce(b, tr, 2, 4096)
		})
	}
	b.Run("local/cancellable", func(b *testing.B) {
		ctx, cancel := context.WithCancel(bg)
		defer cancel()
		benchAllReduceCtx(b, ctx, "local", 2, 4096)
	})
}

// BenchmarkAllReduceAlgo times recursive doubling ("rd") against the ring
// for sizes around the small-message threshold, on both transports; it is
// how DefaultSmallThreshold was chosen.
func BenchmarkAllReduceAlgo(b *testing.B) {
	for _, tr := range []string{"local", "tcp"} {
		for _, n := range []int{2, 3, 4} {
			for _, size := range []int{1 << 10, 4 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 1 << 20} {
				for _, algo := range []string{"rd", "ring"} {
					b.Run(fmt.Sprintf("%s/n=%d/bytes=%d/%s", tr, n, size, algo), func(b *testing.B) {
						small := 0
						if algo != "ring" {
							small = math.MaxInt
						}
						benchAllReduce(b, tr, n, size/4, WithSmallThreshold(small))
					})
				}
			}
		}
	}
}

func benchAllReduce(b *testing.B, tr string, n, length int, opts ...Option) {
	benchAllReduceCtx(b, bg, tr, n, length, opts...)
}

func benchAllReduceCtx(b *testing.B, ctx context.Context, tr string, n, length int, opts ...Option) {
	var c *cluster
	if tr == "tcp" {
		c, _ = newTCPCluster(b, n, opts...)
	} else {
		c = newCluster(b, n, opts...)
	}
	bufs := make([][]float32, n)
	for r := range bufs {
		bufs[r] = make([]float32, length)
	}
	step, stop := lockstep(b, c, func(r int, g *ProcessGroup) error {
		return g.AllReduce(ctx, F32(bufs[r]), Sum)
	})
	defer stop()
	for range 5 {
		step()
	}
	b.SetBytes(int64(4 * length))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		step()
	}
}
