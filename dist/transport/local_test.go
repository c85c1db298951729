package transport_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/transporttest"
)

func TestLocalConformance(t *testing.T) {
	transporttest.Run(t, func(t *testing.T, n int) []transport.Transport {
		return transporttest.Locals(t, n)
	}, transporttest.WithLimited(func(t *testing.T, n, limit int) []transport.Transport {
		return transporttest.Locals(t, n, transport.WithLocalQueueLimit(limit))
	}))
}

func TestNewLocalRefuses(t *testing.T) {
	_, err := transport.NewLocal(0)
	require.ErrorIs(t, err, transport.ErrInvalidArgument)
	_, err = transport.NewLocal(2, transport.WithLocalQueueLimit(-1))
	require.ErrorIs(t, err, transport.ErrInvalidArgument)
	_, err = transport.NewLocal(2, nil)
	require.ErrorIs(t, err, transport.ErrInvalidArgument)
}

// TestLocalSteadyStateNoAlloc: Send+Recv+Release and Send+RecvInto of
// 16 KiB in process do not allocate once the buffer pool is warm.
func TestLocalSteadyStateNoAlloc(t *testing.T) {
	ls := transporttest.NewLocal(t, 2)
	defer ls[0].Close()
	defer ls[1].Close()
	ctx := context.Background()
	p := make([]byte, 16<<10)
	dst := make([]byte, 16<<10)
	round := func() {
		if err := ls[0].Send(ctx, 1, 3, transport.Header{1}, p); err != nil {
			panic(err)
		}
		m, err := ls[1].Recv(ctx, 0, 3)
		if err != nil {
			panic(err)
		}
		ls[1].Release(m.Payload)
		if err := ls[0].Send(ctx, 1, 3, transport.Header{2}, p); err != nil {
			panic(err)
		}
		if _, _, err := ls[1].RecvInto(ctx, 0, 3, dst); err != nil {
			panic(err)
		}
	}
	for range 10 {
		round()
	}
	require.Zero(t, testing.AllocsPerRun(1000, round))
}

// distinctTags sends one 64-byte message on each of n distinct tags from
// rank 0 to rank 1 (half received with Recv, half with RecvInto) and
// returns the heap growth.
func distinctTags(tb testing.TB, ts []*transport.Local, n int) int64 {
	ctx := context.Background()
	p := make([]byte, 64)
	dst := make([]byte, 64)
	run := func(lo, hi uint32) {
		for tag := lo; tag < hi; tag++ {
			if err := ts[0].Send(ctx, 1, tag, transport.Header{}, p); err != nil {
				tb.Fatal(err)
			}
			if tag&1 == 0 {
				m, err := ts[1].Recv(ctx, 0, tag)
				if err != nil {
					tb.Fatal(err)
				}
				ts[1].Release(m.Payload)
			} else if _, _, err := ts[1].RecvInto(ctx, 0, tag, dst); err != nil {
				tb.Fatal(err)
			}
		}
	}
	run(0, 1024)
	before := transporttest.HeapInUse()
	run(1024, 1024+uint32(n))
	return transporttest.HeapInUse() - before
}

// TestLocalDistinctTagsNoLeak: a drained queue is removed, so a million
// distinct tags (100,000 with -short) leave the heap where it was.
func TestLocalDistinctTagsNoLeak(t *testing.T) {
	n := 1_000_000
	if testing.Short() {
		n = 100_000
	}
	ls := transporttest.NewLocal(t, 2)
	defer ls[0].Close()
	defer ls[1].Close()
	growth := distinctTags(t, ls, n)
	t.Logf("Local: %d distinct tags: heap growth %d bytes (%.1f B/tag)", n, growth, float64(growth)/float64(n))
	assert.Less(t, growth, int64(2<<20))
}

// BenchmarkLocalDistinctTags: one message per distinct tag; reports the
// heap growth per run of 1,000,000 tags.
func BenchmarkLocalDistinctTags(b *testing.B) {
	ls := transporttest.NewLocal(b, 2)
	defer ls[0].Close()
	defer ls[1].Close()
	b.ReportAllocs()
	var growth int64
	for b.Loop() {
		growth = distinctTags(b, ls, 1_000_000)
	}
	b.ReportMetric(float64(growth), "heap-growth-B")
}

func BenchmarkLocalSendRecv(b *testing.B) {
	ls := transporttest.NewLocal(b, 2)
	defer ls[0].Close()
	defer ls[1].Close()
	ctx := context.Background()
	p := make([]byte, 16<<10)
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	for b.Loop() {
		if err := ls[0].Send(ctx, 1, 3, transport.Header{}, p); err != nil {
			b.Fatal(err)
		}
		m, err := ls[1].Recv(ctx, 0, 3)
		if err != nil {
			b.Fatal(err)
		}
		ls[1].Release(m.Payload)
	}
}

func TestLocalHosts(t *testing.T) {
	ls := transporttest.NewLocal(t, 3)
	for _, l := range ls {
		assert.Equal(t, []int{0, 0, 0}, l.Hosts(), "default: one host")
		assert.True(t, l.SharedMemory(0) && l.SharedMemory(1) && l.SharedMemory(2), "in one process")
		require.NoError(t, l.Close())
	}

	given := []int{0, 1, 0, 2, 1}
	ls = transporttest.NewLocal(t, 5, transport.WithHosts(given))
	given[1] = 7 // the option copied the slice
	for _, l := range ls {
		var tp transport.Topology = l
		hosts := tp.Hosts()
		assert.Equal(t, []int{0, 1, 0, 2, 1}, hosts)
		hosts[0] = 9 // a fresh copy each time
		assert.Equal(t, 0, tp.Hosts()[0])
		var sm transport.SharedMemory = l
		for r := range 5 {
			same := []int{0, 1, 0, 2, 1}[r] == []int{0, 1, 0, 2, 1}[l.Rank()]
			assert.Equal(t, same, sm.SharedMemory(r), "rank %d to %d", l.Rank(), r)
		}
		assert.False(t, sm.SharedMemory(-1))
		assert.False(t, sm.SharedMemory(5))
		require.NoError(t, l.Close())
	}
}

func TestWithHostsRefuses(t *testing.T) {
	for _, hosts := range [][]int{
		{0, 0},       // too short for 3 ranks
		{0, 0, 0, 0}, // too long
		{1, 0, 0},    // rank 0 not on host 0
		{0, 2, 1},    // host 2 before host 1
		{0, -1, 0},   // negative
	} {
		_, err := transport.NewLocal(3, transport.WithHosts(hosts))
		require.ErrorIs(t, err, transport.ErrInvalidArgument, "%v", hosts)
	}
}
