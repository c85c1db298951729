package dist

import (
	"context"
	"testing"
)

// BenchmarkP2POverhead measures what a point-to-point call spends before
// it reaches the transport: its checks, and the join of its context with
// the job's failure (reused under a cancellable context; none under one
// that cannot end).
func BenchmarkP2POverhead(b *testing.B) {
	c := newCluster(b, 2)
	g := c.gs[0]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.Run("checkP2P", func(b *testing.B) {
		for b.Loop() {
			_ = g.checkP2P("send", 1, 5)
		}
	})
	b.Run("p2pCtx", func(b *testing.B) {
		for b.Loop() {
			_, h := g.p2pCtx(ctx)
			h.release()
		}
	})
	b.Run("p2pCtxBackground", func(b *testing.B) {
		for b.Loop() {
			_, h := g.p2pCtx(context.Background())
			h.release()
		}
	})
}
