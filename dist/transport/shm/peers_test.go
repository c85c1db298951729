//go:build linux

package shm

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
)

// subset starts the ranks r with peers[r] of a world of len(peers) under
// name, in one process, each with RendezvousPeers; ts[r] is nil outside
// the subset.
func subset(t *testing.T, name string, peers []bool) []*Transport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ts := make([]*Transport, len(peers))
	errs := make([]error, len(peers))
	var wg sync.WaitGroup
	for r, in := range peers {
		if !in {
			continue
		}
		wg.Go(func() {
			ts[r], errs[r] = RendezvousPeers(ctx, r, len(peers), name, peers, WithToken(testToken), WithLogger(quiet()))
		})
	}
	wg.Wait()
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	return ts
}

// TestRendezvousPeers: two disjoint subsets of a world of 4 (two simulated
// hosts: ranks 0 and 2, ranks 1 and 3) link within themselves only.
func TestRendezvousPeers(t *testing.T) {
	a := subset(t, jobName(t), []bool{true, false, true, false})
	b := subset(t, jobName(t), []bool{false, true, false, true})
	defer func() {
		for _, tr := range append(a, b...) {
			if tr != nil {
				tr.Close()
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, c := range []struct {
		ts       []*Transport
		from, to int
	}{{a, 0, 2}, {a, 2, 0}, {b, 1, 3}, {b, 3, 1}} {
		require.True(t, c.ts[c.from].HasLink(c.to))
		require.NoError(t, c.ts[c.from].Send(ctx, c.to, 7, transport.Header{1}, []byte{byte(c.from)}))
		m, err := c.ts[c.to].Recv(ctx, c.from, 7)
		require.NoError(t, err)
		assert.Equal(t, []byte{byte(c.from)}, m.Payload)
		assert.Equal(t, transport.Header{1}, m.Header)
	}
	for _, c := range []struct {
		ts       []*Transport
		from, to int
	}{{a, 0, 1}, {a, 2, 3}, {b, 1, 0}, {b, 3, 2}} {
		assert.False(t, c.ts[c.from].HasLink(c.to))
		assert.ErrorIs(t, c.ts[c.from].Send(ctx, c.to, 7, transport.Header{}, nil), ErrNoLink)
		_, err := c.ts[c.from].Recv(ctx, c.to, 7)
		assert.ErrorIs(t, err, ErrNoLink)
	}
}

// TestRendezvousPeersAlone: a subset of one rank needs no socket.
func TestRendezvousPeersAlone(t *testing.T) {
	tr, err := RendezvousPeers(context.Background(), 1, 3, jobName(t), []bool{false, true, false}, WithToken(testToken))
	require.NoError(t, err)
	assert.False(t, tr.HasLink(0))
	assert.True(t, tr.HasLink(1))
	require.NoError(t, tr.Close())
}

// TestRendezvousPeersRefusesOutsider: a rank outside a listener's subset
// is refused even with the right token, and the subset still links.
func TestRendezvousPeersRefusesOutsider(t *testing.T) {
	name := jobName(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	host := []bool{true, false, true}
	var ts [3]*Transport
	var errs [3]error
	var wg sync.WaitGroup
	wg.Go(func() {
		ts[0], errs[0] = RendezvousPeers(ctx, 0, 3, name, host, WithToken(testToken), WithLogger(quiet()))
	})
	// Rank 1 claims rank 0 is on its host; rank 0 does not agree.
	_, errs[1] = RendezvousPeers(ctx, 1, 3, name, []bool{true, true, false}, WithToken(testToken), WithLogger(quiet()))
	wg.Go(func() {
		ts[2], errs[2] = RendezvousPeers(ctx, 2, 3, name, host, WithToken(testToken), WithLogger(quiet()))
	})
	wg.Wait()
	require.ErrorIs(t, errs[1], ErrProtocol, "the outsider is refused")
	require.NoError(t, errs[0])
	require.NoError(t, errs[2])
	require.True(t, ts[0].HasLink(2))
	require.NoError(t, ts[0].Close())
	require.NoError(t, ts[2].Close())
}

func TestRendezvousPeersConfig(t *testing.T) {
	ctx := context.Background()
	for _, peers := range [][]bool{nil, {true}, {false, true}, {true, true, true}} {
		_, err := RendezvousPeers(ctx, 0, 2, jobName(t), peers, WithToken(testToken))
		require.ErrorIs(t, err, ErrInvalidArgument, "%v", peers)
	}
	_, err := Rendezvous(ctx, 0, 0, jobName(t), WithToken(testToken))
	require.ErrorIs(t, err, ErrInvalidArgument)
}
