package shm

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
)

// TestSendStream: messages sent with SendStream arrive as Send's do —
// empty, short, whole records (up to 32 KiB), records streamed in pieces,
// lengths off the copy kernel's 128-byte blocks, through a small ring so
// that records and pieces wrap its end — interleaved with plain sends,
// received by RecvInto and by Recv.
func TestSendStream(t *testing.T) {
	ts := mesh(t, 2, WithRingSize(64<<10))
	defer ts[1].Close()
	defer ts[0].Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var sizes []int
	for _, n := range []int{0, 1, 127, 1023, 1024, 1025, 4096 + 33, 32 << 10, 32<<10 + 1, 100003, 300 << 10} {
		sizes = append(sizes, n, n, n) // again, at other places of the ring
	}
	done := make(chan error, 1)
	go func() {
		for i, n := range sizes {
			p := make([]byte, n)
			for k := range p {
				p[k] = byte(k*7 + i)
			}
			send := ts[0].SendStream
			if i%3 == 2 {
				send = ts[0].Send
			}
			if err := send(ctx, 1, 9, transport.Header{byte(i)}, p); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	dst := make([]byte, 300<<10)
	for i, n := range sizes {
		want := make([]byte, n)
		for k := range want {
			want[k] = byte(k*7 + i)
		}
		var got []byte
		var h transport.Header
		if i%2 == 0 {
			var m int
			var err error
			h, m, err = ts[1].RecvInto(ctx, 0, 9, dst)
			require.NoError(t, err, "message %d", i)
			got = dst[:m]
		} else {
			msg, err := ts[1].Recv(ctx, 0, 9)
			require.NoError(t, err, "message %d", i)
			h, got = msg.Header, msg.Payload
		}
		require.Equal(t, transport.Header{byte(i)}, h)
		require.True(t, bytes.Equal(want, got), "message %d: %d bytes", i, n)
	}
	require.NoError(t, <-done)
}

// TestSendStreamRefuses: SendStream refuses what Send refuses, with the
// same matchable errors: a rank out of range, a message over the peer's
// maximum, a call after Close.
func TestSendStreamRefuses(t *testing.T) {
	ts := mesh(t, 2, WithMaxFrame(64<<10))
	defer ts[1].Close()
	ctx := context.Background()
	require.ErrorIs(t, ts[0].SendStream(ctx, 2, 1, transport.Header{}, nil), transport.ErrInvalidRank)
	require.ErrorIs(t, ts[0].SendStream(ctx, -1, 1, transport.Header{}, nil), transport.ErrInvalidRank)
	require.ErrorIs(t, ts[0].SendStream(ctx, 1, 1, transport.Header{}, make([]byte, 64<<10+1)), transport.ErrFrameTooLarge)
	require.NoError(t, ts[0].Close())
	require.ErrorIs(t, ts[0].SendStream(ctx, 1, 1, transport.Header{}, make([]byte, 4096)), transport.ErrClosed)
}
