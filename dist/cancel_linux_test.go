//go:build linux

package dist

import "testing"

// TestBothCancelSHM is TestBothCancelLocal over the hybrid transport,
// whose links between ranks of one host are shared memory (issue 21: 53
// in 600 over shm, 20 in 600 hybrid did not report their own
// cancellation).
func TestBothCancelSHM(t *testing.T) {
	runBothCancel(t, cancelTrials(t, 100), func(t *testing.T) []*ProcessGroup {
		return tcpCluster(t, hybridPair(t)).gs
	})
}
