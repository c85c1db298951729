//go:build linux

package hybrid_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
)

// TestRecvReduce: RecvReduce combines a message into the buffer on every
// route — from a peer on shared memory, from one on TCP, from this rank —
// and consumes a message of another length without touching the buffer.
func TestRecvReduce(t *testing.T) {
	ts := mesh(t, []string{"A", "A", "B"}) // rank 0: 1 over shm, 2 over tcp
	require.Equal(t, "shm", ts[0].Via(1))
	require.Equal(t, "tcp", ts[0].Via(2))
	assert.Equal(t, "shm to 1 peer, tcp to 1 peer", ts[0].Summary())
	assert.Equal(t, "tcp to 2 peers", ts[2].Summary())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	add := func(d, s []byte) {
		for i := range d {
			d[i] += s[i]
		}
	}
	tag := uint32(1)
	for from := range 3 {
		for _, size := range []int{0, 12, 5000, 5 << 20} {
			tag++
			t.Run(fmt.Sprintf("from%d/%s/%d", from, ts[0].Via(from), size), func(t *testing.T) {
				src := make([]byte, size)
				dst := make([]byte, size)
				want := make([]byte, size)
				for i := range src {
					src[i], dst[i] = byte(i*7+1), byte(i*3)
					want[i] = dst[i] + src[i]
				}
				h := transport.Header{byte(from), 9}
				errc := make(chan error, 1)
				go func() { errc <- ts[from].Send(ctx, 0, tag, h, src) }()
				gh, n, err := ts[0].RecvReduce(ctx, from, tag, dst, 4, add)
				require.NoError(t, err)
				require.NoError(t, <-errc)
				assert.Equal(t, h, gh)
				assert.Equal(t, size, n)
				assert.Equal(t, want, dst)

				// A longer message: ErrMessageTooLong, dst untouched.
				go func() { errc <- ts[from].Send(ctx, 0, tag, h, make([]byte, size+4)) }()
				before := append([]byte{}, dst...)
				_, n, err = ts[0].RecvReduce(ctx, from, tag, dst, 4, add)
				require.NoError(t, <-errc)
				assert.ErrorIs(t, err, transport.ErrMessageTooLong)
				assert.Equal(t, size+4, n)
				assert.Equal(t, before, dst)
			})
		}
	}
	_, _, err := ts[0].RecvReduce(ctx, 2, 1, make([]byte, 6), 4, add)
	assert.ErrorIs(t, err, transport.ErrInvalidArgument)
}
