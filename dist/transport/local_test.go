package transport_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/transporttest"
)

func locals(n int, opts ...transport.LocalOption) []transport.Transport {
	ls := transport.NewLocal(n, opts...)
	ts := make([]transport.Transport, n)
	for i, l := range ls {
		ts[i] = l
	}
	return ts
}

func TestLocalConformance(t *testing.T) {
	transporttest.Run(t, func(t *testing.T, n int) []transport.Transport {
		return locals(n)
	}, transporttest.WithLimited(func(t *testing.T, n, limit int) []transport.Transport {
		return locals(n, transport.WithLocalQueueLimit(limit))
	}))
}

// TestLocalSteadyStateNoAlloc: Send+Recv+Release of 16 KiB in process does
// not allocate once the buffer pool is warm.
func TestLocalSteadyStateNoAlloc(t *testing.T) {
	ls := transport.NewLocal(2)
	defer ls[0].Close()
	defer ls[1].Close()
	ctx := context.Background()
	p := make([]byte, 16<<10)
	round := func() {
		if err := ls[0].Send(ctx, 1, 3, transport.Meta{Seq: 1}, p); err != nil {
			panic(err)
		}
		m, err := ls[1].Recv(ctx, 0, 3)
		if err != nil {
			panic(err)
		}
		ls[1].Release(m.Payload)
	}
	for range 10 {
		round()
	}
	require.Zero(t, testing.AllocsPerRun(1000, round))
}

func BenchmarkLocalSendRecv(b *testing.B) {
	ls := transport.NewLocal(2)
	defer ls[0].Close()
	defer ls[1].Close()
	ctx := context.Background()
	p := make([]byte, 16<<10)
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	for b.Loop() {
		if err := ls[0].Send(ctx, 1, 3, transport.Meta{}, p); err != nil {
			b.Fatal(err)
		}
		m, err := ls[1].Recv(ctx, 0, 3)
		if err != nil {
			b.Fatal(err)
		}
		ls[1].Release(m.Payload)
	}
}
