//go:build linux

package fed

import (
	"time"

	"github.com/gdist/gdist/dist/transport/hybrid"
	"github.com/gdist/gdist/dist/transport/shm"
)

// shmHeartbeat is WithHeartbeat's part for a link over shared memory.
func shmHeartbeat(interval, timeout time.Duration) []hybrid.Option {
	return []hybrid.Option{hybrid.WithSHM(shm.WithHeartbeat(interval, timeout))}
}

// shmMaxFrame is GDIST_MAX_FRAME's part for a link over shared memory.
func shmMaxFrame(n int) []hybrid.Option {
	return []hybrid.Option{hybrid.WithSHM(shm.WithMaxFrame(n))}
}

// shmQuiet leaves a lost link's report to the federation: the leader logs
// a client that leaves once, the client its reconnection.
func shmQuiet() []hybrid.Option {
	return []hybrid.Option{hybrid.WithSHM(shm.WithQuietLoss())}
}
