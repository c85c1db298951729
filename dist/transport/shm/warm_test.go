//go:build linux

package shm

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
)

// ringState is what a peer's producer and consumer have done with their
// rings: the producer's offset in its lap, its lap restarts and how far
// each side has mapped its ring.
type ringState struct {
	offset, restarts, outWarm, inWarm uint64
}

func stateOf(p *peer) ringState {
	p.wmu.Lock()
	s := ringState{offset: p.out.Offset(), restarts: p.restarts, outWarm: p.outWarm}
	p.wmu.Unlock()
	p.rmu.Lock()
	s.inWarm = p.inWarm
	p.rmu.Unlock()
	return s
}

// pingPong sends n round trips of size-byte messages from rank 0 to rank 1
// and back.
func pingPong(t *testing.T, ts []*Transport, n, size int) {
	t.Helper()
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, size)
		for range n {
			h, k, err := ts[1].RecvInto(ctx, 0, 1, buf)
			if err == nil {
				err = ts[1].Send(ctx, 0, 1, h, buf[:k])
			}
			if err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	p, dst := make([]byte, size), make([]byte, size)
	for i := range n {
		p[0] = byte(i)
		require.NoError(t, ts[0].Send(ctx, 1, 1, transport.Header{}, p))
		k, err := recvInto(ctx, ts[0], 1, dst)
		require.NoError(t, err)
		require.Equal(t, size, k)
		require.Equal(t, byte(i), dst[0])
	}
	require.NoError(t, <-done)
}

func recvInto(ctx context.Context, t *Transport, from int, dst []byte) (int, error) {
	_, n, err := t.RecvInto(ctx, from, 1, dst)
	return n, err
}

// TestSmallRecordsRecycleRing: round trips of small messages keep to the
// first part of each ring (the producer restarts its lap once it is
// recycleMin bytes in and finds the ring drained), and each side maps only
// that part, a warmChunk at a time.
func TestSmallRecordsRecycleRing(t *testing.T) {
	ts := mesh(t, 2)
	defer ts[1].Close()
	defer ts[0].Close()
	const size = 1000 // 1088-byte records: 20000 of them go 21 MiB through each ring
	pingPong(t, ts, 1, size)
	first := stateOf(ts[0].peers[1].Load())
	assert.Equal(t, uint64(warmChunk), first.outWarm, "mapped ahead of the first record")
	pingPong(t, ts, 20000, size)
	assertRecycled(t, ts)
}

// assertRecycled checks that both ranks of ts restarted their rings and
// kept to, and mapped, only the first part of them. A look that finds the
// peer's last record not yet released is tried again recycleEvery bytes
// later: typically within the first MiB; without restarts, the 16-21 MiB
// the tests send would map the whole ring.
func assertRecycled(t *testing.T, ts []*Transport) {
	t.Helper()
	for r, tr := range ts {
		s := stateOf(tr.peers[1-r].Load())
		t.Logf("rank %d: %+v", r, s)
		assert.NotZero(t, s.restarts, "rank %d never restarted its ring", r)
		assert.Less(t, s.offset, uint64(DefaultRingSize/2), "rank %d went past the recycled part", r)
		assert.Less(t, s.outWarm, uint64(DefaultRingSize/2), "rank %d mapped more than it wrote", r)
		assert.Less(t, s.inWarm, uint64(DefaultRingSize/2), "rank %d mapped more than it read", r)
	}
}

// TestLargeRecordWarmsRing: the first record of warmMin bytes or more maps
// the whole ring on both sides.
func TestLargeRecordWarmsRing(t *testing.T) {
	ts := mesh(t, 2)
	defer ts[1].Close()
	defer ts[0].Close()
	pingPong(t, ts, 3, 8)
	s := stateOf(ts[0].peers[1].Load())
	assert.Equal(t, uint64(warmChunk), s.outWarm)
	pingPong(t, ts, 2, warmMin)
	for r, tr := range ts {
		s := stateOf(tr.peers[1-r].Load())
		assert.Equal(t, uint64(DefaultRingSize), s.outWarm, "rank %d", r)
		assert.Equal(t, uint64(DefaultRingSize), s.inWarm, "rank %d", r)
	}
}

// TestExchangeRecyclesRing: two ranks that each send before they receive,
// as an all-reduce's exchange does, both keep to the first part of their
// rings: at each look the other still reads the last record, and the
// sender waits for it (drained) rather than going on through the ring.
func TestExchangeRecyclesRing(t *testing.T) {
	ts := mesh(t, 2)
	defer ts[1].Close()
	defer ts[0].Close()
	const size, n = 8 << 10, 2000 // 16 MiB through each ring
	ctx := context.Background()
	errs := make(chan error, 2)
	for r := range 2 {
		go func() {
			p, dst := make([]byte, size), make([]byte, size)
			for i := range n {
				p[0] = byte(i)
				if err := ts[r].Send(ctx, 1-r, 1, transport.Header{}, p); err != nil {
					errs <- err
					return
				}
				k, err := recvInto(ctx, ts[r], 1-r, dst)
				if err == nil && (k != size || dst[0] != byte(i)) {
					err = fmt.Errorf("rank %d: message %d: %d bytes starting %d", r, i, k, dst[0])
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	assertRecycled(t, ts)
}
