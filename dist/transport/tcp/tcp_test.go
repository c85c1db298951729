package tcp

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/transporttest"
)

var testToken = []byte("test-token-0123456789")

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// listeners opens n loopback listeners.
func listeners(t testing.TB, n int) ([]net.Listener, []string) {
	lns := make([]net.Listener, n)
	addrs := make([]string, n)
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		lns[i], addrs[i] = ln, ln.Addr().String()
	}
	return lns, addrs
}

// mesh starts an n-rank job over loopback with New, in one process.
func mesh(t testing.TB, n int, opts ...Option) []*Transport {
	t.Helper()
	lns, addrs := listeners(t, n)
	ts := make([]*Transport, n)
	errs := make([]error, n)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			o := append([]Option{WithToken(testToken), WithLogger(quiet())}, opts...)
			ts[i], errs[i] = New(ctx, i, n, lns[i], addrs, o...)
		})
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "rank %d", i)
	}
	return ts
}

func asTransports(ts []*Transport) []transport.Transport {
	out := make([]transport.Transport, len(ts))
	for i, t := range ts {
		out[i] = t
	}
	return out
}

func TestConformance(t *testing.T) {
	transporttest.Run(t, func(t *testing.T, n int) []transport.Transport {
		return asTransports(mesh(t, n))
	}, transporttest.WithLimited(func(t *testing.T, n, limit int) []transport.Transport {
		return asTransports(mesh(t, n, WithQueueLimit(limit)))
	}))
}
