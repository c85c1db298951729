//go:build linux

package shm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
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

// resident returns how many of b's pages are in memory (mincore: allocated
// by either side, whether or not this mapping has them yet).
func resident(t *testing.T, b []byte) int {
	t.Helper()
	vec := make([]byte, (len(b)+os.Getpagesize()-1)/os.Getpagesize())
	_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0])))
	require.Zero(t, errno, "mincore")
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// mappedKiB returns the Rss of the mapping that starts at b (what this
// process's page tables hold of it), from /proc/self/smaps.
func mappedKiB(t *testing.T, b []byte) int {
	t.Helper()
	smaps, err := os.ReadFile("/proc/self/smaps")
	require.NoError(t, err)
	start := fmt.Sprintf("%x-", uintptr(unsafe.Pointer(&b[0])))
	in := false
	for _, line := range strings.Split(string(smaps), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			in = strings.HasPrefix(line, start)
			continue
		}
		if v, ok := strings.CutPrefix(line, "Rss:"); in && ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			require.NoError(t, err)
			return kb
		}
	}
	t.Fatalf("no mapping at %s in /proc/self/smaps", start)
	return 0
}

// TestRingsWarm: the first large record through a ring maps all of its
// pages on both sides at once (no page fault per fresh page during its first
// lap), and rings that carry nothing stay unallocated.
func TestRingsWarm(t *testing.T) {
	ts := mesh(t, 3)
	t.Cleanup(func() {
		for _, tr := range ts {
			tr.Close()
		}
	})
	ctx := context.Background()
	page := os.Getpagesize()
	out := ts[0].peers[1].Load()
	in := ts[1].peers[0].Load()
	pages := len(out.outR.DataBytes()) / page
	require.Less(t, resident(t, out.outR.DataBytes()), pages/10, "before any traffic")

	msg := make([]byte, 64<<10)
	require.NoError(t, ts[0].Send(ctx, 1, 5, transport.Header{}, msg))
	m, err := ts[1].Recv(ctx, 0, 5)
	require.NoError(t, err)
	ts[1].Release(m.Payload)

	require.Equal(t, pages, resident(t, out.outR.DataBytes()), "rank 0's ring to rank 1 after a 64 KiB message")
	ringKiB := len(in.inR.DataBytes()) >> 10
	assert.GreaterOrEqual(t, mappedKiB(t, in.region), ringKiB, "rank 1's mapping of that ring")
	assert.GreaterOrEqual(t, mappedKiB(t, out.region), ringKiB, "rank 0's mapping of that ring")
	for _, pr := range []*peer{ts[0].peers[2].Load(), ts[1].peers[2].Load(), ts[1].peers[0].Load()} {
		assert.Less(t, resident(t, pr.outR.DataBytes()), pages/10, "a ring that carried nothing (rank %d's to rank %d)", pr.t.rank, pr.rank)
	}
}
