//go:build linux

package shm

import (
	"context"
	"fmt"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
)

// addBytes returns a combine that adds src to dst byte by byte (an
// element-wise operation for any element size) and checks that every piece
// it gets is whole elements of dst, at an element boundary.
func addBytes(t *testing.T, dst []byte, unit int, pieces *int) transport.Combine {
	return func(d, s []byte) {
		if len(d) != len(s) || len(d)%unit != 0 {
			t.Errorf("piece of %d bytes into %d, unit %d", len(s), len(d), unit)
		}
		if len(d) > 0 {
			off := uintptr(unsafe.Pointer(&d[0])) - uintptr(unsafe.Pointer(&dst[0]))
			if off%uintptr(unit) != 0 || int(off)+len(d) > len(dst) {
				t.Errorf("piece at offset %d of %d bytes, unit %d", off, len(d), unit)
			}
		}
		for i := range d {
			d[i] += s[i]
		}
		*pieces++
	}
}

// TestRecvReduce: RecvReduce combines a message into its buffer, whether
// posted before the message arrives (from the ring in place, or from the
// sender's memory) or after it was queued, from another rank or itself;
// on small rings that wrap inside elements; with element sizes that do and
// do not divide the ring's alignment.
func TestRecvReduce(t *testing.T) {
	configs := []struct {
		name string
		opts []Option
	}{
		{"default", nil},
		{"ring4K", []Option{WithRingSize(4 << 10), WithSingleCopy(0)}},
		{"ring4K-singlecopy", []Option{WithRingSize(4 << 10), WithSingleCopy(8 << 10)}},
	}
	for _, c := range configs {
		t.Run(c.name, func(t *testing.T) {
			ts := mesh(t, 2, c.opts...)
			defer ts[1].Close()
			defer ts[0].Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			// Small messages both ways let single copy set in.
			for r := range 2 {
				require.NoError(t, ts[r].Send(ctx, 1-r, 9, transport.Header{}, []byte("hi")))
				_, err := ts[1-r].Recv(ctx, r, 9)
				require.NoError(t, err)
			}
			tag := uint32(10)
			for _, unit := range []int{1, 4, 8, 12} {
				for _, size := range []int{0, 8, 5000, 300 << 10} {
					size -= size % unit
					for _, mode := range []string{"posted", "queued", "self"} {
						tag++
						t.Run(fmt.Sprintf("unit%d/%d/%s", unit, size, mode), func(t *testing.T) {
							src := make([]byte, size)
							dst := make([]byte, size)
							for i := range src {
								src[i], dst[i] = byte(i*7+1), byte(i*3)
							}
							want := make([]byte, size)
							for i := range want {
								want[i] = dst[i] + src[i]
							}
							from, to := 0, 1
							if mode == "self" {
								to = 0
							}
							pieces := 0
							recv := func() (transport.Header, int, error) {
								return ts[to].RecvReduce(ctx, from, tag, dst, unit, addBytes(t, dst, unit, &pieces))
							}
							var (
								h   transport.Header
								n   int
								err error
							)
							switch mode {
							case "posted":
								done := make(chan struct{})
								go func() { h, n, err = recv(); close(done) }()
								time.Sleep(2 * time.Millisecond)
								require.NoError(t, ts[from].Send(ctx, to, tag, transport.Header{7}, src))
								<-done
							default:
								sent := make(chan error, 1)
								go func() { sent <- ts[from].Send(ctx, to, tag, transport.Header{7}, src) }()
								if mode == "queued" {
									time.Sleep(2 * time.Millisecond)
								}
								h, n, err = recv()
								require.NoError(t, <-sent)
							}
							require.NoError(t, err)
							require.Equal(t, size, n)
							require.Equal(t, transport.Header{7}, h)
							require.Equal(t, want, dst)
						})
					}
				}
			}
		})
	}
}

// TestRecvReduceLength: a message of another length than the buffer is
// consumed without touching it, posted or queued: a longer one is reported
// with ErrMessageTooLong, a shorter one by its length; the link goes on.
func TestRecvReduceLength(t *testing.T) {
	ts := mesh(t, 2, WithRingSize(4<<10))
	defer ts[1].Close()
	defer ts[0].Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fail := func(d, s []byte) { t.Errorf("combine called with %d bytes", len(s)) }
	for _, posted := range []bool{true, false} {
		for _, size := range []int{4, 400, 40000} {
			t.Run(fmt.Sprintf("posted=%v/%d", posted, size), func(t *testing.T) {
				dst := make([]byte, 4000)
				type res struct {
					n   int
					err error
				}
				rc := make(chan res, 1)
				recv := func() {
					_, n, err := ts[1].RecvReduce(ctx, 0, 3, dst, 4, fail)
					rc <- res{n, err}
				}
				if posted {
					go recv()
					time.Sleep(2 * time.Millisecond)
				}
				require.NoError(t, ts[0].Send(ctx, 1, 3, transport.Header{}, make([]byte, size)))
				if !posted {
					time.Sleep(2 * time.Millisecond)
					go recv()
				}
				r := <-rc
				require.Equal(t, size, r.n)
				if size > len(dst) {
					require.ErrorIs(t, r.err, transport.ErrMessageTooLong)
				} else {
					require.NoError(t, r.err)
				}
				require.Equal(t, make([]byte, len(dst)), dst)
				require.NoError(t, ts[0].Send(ctx, 1, 3, transport.Header{}, []byte("next")))
				m, err := ts[1].Recv(ctx, 0, 3)
				require.NoError(t, err)
				require.Equal(t, "next", string(m.Payload))
			})
		}
	}
	_, _, err := ts[1].RecvReduce(ctx, 0, 3, make([]byte, 6), 4, fail)
	require.ErrorIs(t, err, transport.ErrInvalidArgument)
	_, _, err = ts[1].RecvReduce(ctx, 0, 3, make([]byte, 8), 4, nil)
	require.ErrorIs(t, err, transport.ErrInvalidArgument)
}
