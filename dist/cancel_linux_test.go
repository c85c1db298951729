//go:build linux

package dist

import (
	"context"
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport/hybrid"
)

// TestBothCancelSHM is TestBothCancelLocal over the hybrid transport,
// whose links between ranks of one host are shared memory (issue 21: 53
// in 600 over shm, 20 in 600 hybrid did not report their own
// cancellation).
func TestBothCancelSHM(t *testing.T) {
	runBothCancel(t, cancelTrials(t, 100), func(t *testing.T) []*ProcessGroup {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		master := ln.Addr().String()
		require.NoError(t, ln.Close())
		ts := startRanks(t, 2, func(ctx context.Context, r int) (*hybrid.Transport, error) {
			return hybrid.Rendezvous(ctx, r, 2, master, hybrid.WithInsecure())
		})
		for _, tr := range ts {
			require.Equal(t, hybrid.ViaSHM, tr.Via(1-tr.Rank()), "a shared-memory link")
		}
		return tcpCluster(t, ts).gs
	})
}
