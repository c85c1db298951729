//go:build linux

package hybrid_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/hybrid"
	"github.com/gdist/gdist/dist/transport/tcp"
)

// overLink makes a link with tcp.Listen and tcp.Dial and builds a hybrid
// transport over each end, the accepting side with host id hosts[0].
func overLink(t *testing.T, hosts [2]string, opts ...hybrid.Option) [2]*hybrid.Transport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topts := []tcp.Option{tcp.WithToken(testToken), tcp.WithLogger(quiet())}
	l, err := tcp.Listen(ctx, "127.0.0.1:0", 2, topts...)
	require.NoError(t, err)
	defer l.Close()
	var ends [2]*tcp.Transport
	var dialErr error
	var wg sync.WaitGroup
	wg.Go(func() { ends[1], dialErr = tcp.Dial(ctx, l.Addr().String(), 1, 2, topts...) })
	ends[0], _, err = l.Accept(ctx)
	require.NoError(t, err)
	wg.Wait()
	require.NoError(t, dialErr)
	var hs [2]*hybrid.Transport
	var errs [2]error
	for i := range 2 {
		wg.Go(func() {
			o := append([]hybrid.Option{hybrid.WithToken(testToken), hybrid.WithLogger(quiet()), hybrid.WithHostID(hosts[i])}, opts...)
			hs[i], errs[i] = hybrid.Over(ctx, ends[i], o...)
		})
	}
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	t.Cleanup(func() { hs[0].Close(); hs[1].Close() })
	return hs
}

// TestOver: a link between two processes of one host moves to shared
// memory; between hosts (or in mode TCP) it stays TCP. Messages pass either
// way, and closing one end is seen by the other.
func TestOver(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name  string
		hosts [2]string
		opts  []hybrid.Option
		via   string
	}{
		{"one host", [2]string{"h", "h"}, nil, hybrid.ViaSHM},
		{"two hosts", [2]string{"h0", "h1"}, nil, hybrid.ViaTCP},
		{"mode tcp", [2]string{"h", "h"}, []hybrid.Option{hybrid.WithMode(hybrid.TCP)}, hybrid.ViaTCP},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hs := overLink(t, tc.hosts, tc.opts...)
			assert.Equal(t, tc.via, hs[0].Via(1))
			assert.Equal(t, tc.via, hs[1].Via(0))
			big := make([]byte, 1<<20)
			big[12345] = 7
			require.NoError(t, hs[1].Send(ctx, 0, 3, transport.Header{9}, big))
			m, err := hs[0].Recv(ctx, 1, 3)
			require.NoError(t, err)
			assert.Equal(t, big, m.Payload)
			require.NoError(t, hs[1].Close())
			_, err = hs[0].Recv(ctx, 1, 3)
			assert.ErrorIs(t, err, transport.ErrPeerClosed)
		})
	}
}

func TestOverRefusesTCPOptions(t *testing.T) {
	ctx := context.Background()
	l, err := tcp.Listen(ctx, "127.0.0.1:0", 2, tcp.WithToken(testToken), tcp.WithLogger(quiet()))
	require.NoError(t, err)
	defer l.Close()
	var wg sync.WaitGroup
	wg.Go(func() {
		if tr, _, err := l.Accept(ctx); err == nil {
			tr.Close()
		}
	})
	tr, err := tcp.Dial(ctx, l.Addr().String(), 1, 2, tcp.WithToken(testToken), tcp.WithLogger(quiet()))
	require.NoError(t, err)
	wg.Wait()
	_, err = hybrid.Over(ctx, tr, hybrid.WithTCP(tcp.WithMaxFrame(1<<20)))
	assert.ErrorIs(t, err, hybrid.ErrInvalidArgument)
}
