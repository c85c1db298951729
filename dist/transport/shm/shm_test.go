//go:build linux

package shm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/transporttest"
)

var testToken = []byte("shm-test-token-0123456789")

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// jobName returns a fresh abstract socket name.
func jobName(t testing.TB) string {
	t.Helper()
	var b [8]byte
	rand.Read(b[:])
	return "@gdist-shm-test-" + hex.EncodeToString(b[:])
}

// mesh starts an n-rank job in one process with Rendezvous.
func mesh(t testing.TB, n int, opts ...Option) []*Transport {
	t.Helper()
	name := jobName(t)
	ts := make([]*Transport, n)
	errs := make([]error, n)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			o := append([]Option{WithToken(testToken), WithLogger(quiet())}, opts...)
			ts[i], errs[i] = Rendezvous(ctx, i, n, name, o...)
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

// TestConformanceSmallRing runs the suite with the smallest ring, so that
// nearly every message streams through it in many chunks and wraps.
func TestConformanceSmallRing(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	transporttest.Run(t, func(t *testing.T, n int) []transport.Transport {
		return asTransports(mesh(t, n, WithRingSize(4<<10), WithSpin(0)))
	}, transporttest.WithLimited(func(t *testing.T, n, limit int) []transport.Transport {
		return asTransports(mesh(t, n, WithQueueLimit(limit), WithRingSize(4<<10)))
	}))
}

// TestRegionsResident: both ends of every link have all of the pair's
// pages mapped and resident when the rendezvous returns (MAP_POPULATE), so
// the first lap of a ring costs no page faults.
func TestRegionsResident(t *testing.T) {
	ts := mesh(t, 3)
	t.Cleanup(func() {
		for _, tr := range ts {
			tr.Close()
		}
	})
	for i, tr := range ts {
		for r := range ts {
			if r == i {
				continue
			}
			region := tr.peers[r].Load().region
			vec := make([]byte, (len(region)+os.Getpagesize()-1)/os.Getpagesize())
			_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&region[0])), uintptr(len(region)), uintptr(unsafe.Pointer(&vec[0])))
			require.Zero(t, errno, "mincore")
			missing := 0
			for _, v := range vec {
				if v&1 == 0 {
					missing++
				}
			}
			require.Zero(t, missing, "rank %d's region for rank %d: %d of %d pages not resident", i, r, missing, len(vec))
		}
	}
}
