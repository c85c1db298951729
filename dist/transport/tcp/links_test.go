package tcp

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/transporttest"
)

func listen(t testing.TB, world int, opts ...Option) *Listener {
	t.Helper()
	l, err := Listen(context.Background(), "127.0.0.1:0", world,
		append([]Option{WithToken(testToken), WithLogger(quiet())}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	return l
}

// star dials every rank 1..world-1 to l and accepts them: links[r] is the
// accepting side of rank r's link, dialed[r] the dialing side.
func star(t testing.TB, l *Listener, world int, opts ...Option) (links, dialed []*Transport) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	links = make([]*Transport, world)
	dialed = make([]*Transport, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := 1; r < world; r++ {
		wg.Go(func() {
			dialed[r], errs[r] = Dial(ctx, l.Addr().String(), r, world,
				append([]Option{WithToken(testToken), WithLogger(quiet())}, opts...)...)
		})
	}
	for range world - 1 {
		tr, r, err := l.Accept(ctx)
		require.NoError(t, err)
		require.Nil(t, links[r], "rank %d accepted twice", r)
		links[r] = tr
	}
	wg.Wait()
	for r := 1; r < world; r++ {
		require.NoError(t, errs[r], "rank %d", r)
	}
	return links, dialed
}

// TestLinks: every rank of a star gets a link of its own, a transport of
// two ranks, on which messages go both ways.
func TestLinks(t *testing.T) {
	const world = 4
	l := listen(t, world)
	links, dialed := star(t, l, world)
	ctx := context.Background()
	for r := 1; r < world; r++ {
		require.Equal(t, 0, links[r].Rank())
		require.Equal(t, 2, links[r].WorldSize())
		require.Equal(t, 1, dialed[r].Rank())
		msg := []byte{byte(r), 1, 2}
		require.NoError(t, dialed[r].Send(ctx, 0, 9, transport.Header{byte(r)}, msg))
		m, err := links[r].Recv(ctx, 1, 9)
		require.NoError(t, err)
		assert.Equal(t, msg, m.Payload, "rank %d's message arrives on rank %d's link", r, r)
		assert.Equal(t, byte(r), m.Header[0])
		require.NoError(t, links[r].Send(ctx, 1, 3, transport.Header{}, []byte("back")))
		m, err = dialed[r].Recv(ctx, 0, 3)
		require.NoError(t, err)
		assert.Equal(t, "back", string(m.Payload))
	}
	for r := 1; r < world; r++ {
		require.NoError(t, dialed[r].Close())
		_, err := links[r].Recv(ctx, 1, 9)
		assert.ErrorIs(t, err, transport.ErrPeerClosed)
		require.NoError(t, links[r].Close())
	}
}

// TestLinkConformance: a link is a transport of two ranks like any other.
func TestLinkConformance(t *testing.T) {
	pair := func(t *testing.T, opts ...Option) []transport.Transport {
		l := listen(t, 2, opts...)
		links, dialed := star(t, l, 2, opts...)
		return []transport.Transport{links[1], dialed[1]}
	}
	transporttest.Run(t, func(t *testing.T, n int) []transport.Transport {
		if n != 2 {
			t.Skip("a link has two ranks")
		}
		return pair(t)
	}, transporttest.WithLimited(func(t *testing.T, n, limit int) []transport.Transport {
		if n != 2 {
			t.Skip("a link has two ranks")
		}
		return pair(t, WithQueueLimit(limit))
	}))
}

// TestLinkAgain: a rank whose link broke (its process died) dials again
// and is accepted; the old link's transport names the loss.
func TestLinkAgain(t *testing.T) {
	l := listen(t, 3)
	links, dialed := star(t, l, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dialed[2].Kill()
	_, err := links[2].Recv(ctx, 1, 1)
	var pe *transport.PeerError
	require.ErrorAs(t, err, &pe)
	assert.ErrorIs(t, err, transport.ErrPeerLost)
	links[2].Close()

	again, err := Dial(ctx, l.Addr().String(), 2, 3, WithToken(testToken), WithLogger(quiet()))
	require.NoError(t, err)
	tr, r, err := l.Accept(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, r)
	require.NoError(t, again.Send(ctx, 0, 1, transport.Header{}, []byte("again")))
	m, err := tr.Recv(ctx, 1, 1)
	require.NoError(t, err)
	assert.Equal(t, "again", string(m.Payload))
	// Rank 1's link was not affected.
	require.NoError(t, dialed[1].Send(ctx, 0, 1, transport.Header{}, []byte("still")))
	m, err = links[1].Recv(ctx, 1, 1)
	require.NoError(t, err)
	assert.Equal(t, "still", string(m.Payload))
	for _, x := range []*Transport{again, tr, dialed[1], links[1]} {
		x.Close()
	}
}

// TestLinkRefusals: a wrong token, a rank outside the star and a star of
// another size are refused (and logged on the listener, which goes on);
// Dial to an address nobody listens on fails at once, matching
// ECONNREFUSED; a dial the listener never answers ends within the
// handshake timeout.
func TestLinkRefusals(t *testing.T) {
	var logs transporttest.LogBuffer
	l, err := Listen(context.Background(), "127.0.0.1:0", 3, WithToken(testToken),
		WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	addr := l.Addr().String()

	_, err = Dial(ctx, addr, 1, 3, WithToken([]byte("another-token-0123456789")), WithLogger(quiet()))
	assert.ErrorIs(t, err, ErrAuth)
	_, err = Dial(ctx, addr, 3, 4, WithToken(testToken), WithLogger(quiet()))
	var rj *RejectedError
	require.ErrorAs(t, err, &rj)
	_, err = Dial(ctx, addr, 0, 3, WithToken(testToken), WithLogger(quiet()))
	assert.ErrorIs(t, err, ErrInvalidArgument)

	tr, err := Dial(ctx, addr, 1, 3, WithToken(testToken), WithLogger(quiet()))
	require.NoError(t, err, "the listener goes on")
	acc, r, err := l.Accept(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, r)
	tr.Close()
	acc.Close()
	for _, want := range []string{"authentication failed", "world size 4, this job has 3"} {
		assert.Eventually(t, func() bool { return strings.Contains(logs.String(), want) }, 5*time.Second, 5*time.Millisecond,
			"the listener logs %q (its serving goroutine may log after the dialer has its answer):\n%s", want, logs.String())
	}

	// Nobody listens.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gone := ln.Addr().String()
	ln.Close()
	_, err = Dial(ctx, gone, 1, 3, WithToken(testToken), WithLogger(quiet()))
	assert.True(t, errors.Is(err, syscall.ECONNREFUSED), "%v", err)

	// Somebody listens and never answers.
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer mute.Close()
	start := time.Now()
	_, err = Dial(ctx, mute.Addr().String(), 1, 3, WithToken(testToken), WithLogger(quiet()),
		WithHandshakeTimeout(300*time.Millisecond))
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 3*time.Second)
}

// TestLinkTLS: links over TLS; a dialer without a trusted certificate is
// refused with ErrTLS and a log line, and the listener goes on.
func TestLinkTLS(t *testing.T) {
	cfg, _ := testTLS(t)
	var logs transporttest.LogBuffer
	l, err := Listen(context.Background(), "127.0.0.1:0", 2, WithToken(testToken), WithTLS(cfg),
		WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	strangers, _ := testTLS(t) // another CA
	_, err = Dial(ctx, l.Addr().String(), 1, 2, WithToken(testToken), WithTLS(strangers), WithLogger(quiet()))
	assert.ErrorIs(t, err, ErrTLS)
	_, err = Dial(ctx, l.Addr().String(), 1, 2, WithToken(testToken), WithLogger(quiet()))
	assert.Error(t, err, "plain TCP to a TLS listener")

	tr, err := Dial(ctx, l.Addr().String(), 1, 2, WithToken(testToken), WithTLS(cfg), WithLogger(quiet()))
	require.NoError(t, err)
	acc, _, err := l.Accept(ctx)
	require.NoError(t, err)
	_, ok := acc.peers[1].Load().conn.(tlsStream)
	assert.True(t, ok, "the link is TLS")
	require.NoError(t, tr.Send(ctx, 0, 1, transport.Header{}, []byte("sealed")))
	m, err := acc.Recv(ctx, 1, 1)
	require.NoError(t, err)
	assert.Equal(t, "sealed", string(m.Payload))
	tr.Close()
	acc.Close()
	assert.Eventually(t, func() bool { return strings.Contains(logs.String(), "TLS handshake failed") }, 5*time.Second, 5*time.Millisecond)
}
