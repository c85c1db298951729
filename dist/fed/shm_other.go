//go:build !linux

package fed

import (
	"time"

	"github.com/gdist/gdist/dist/transport/hybrid"
)

// shmHeartbeat: no shared-memory transport on this system.
func shmHeartbeat(interval, timeout time.Duration) []hybrid.Option { return nil }

// shmMaxFrame: no shared-memory transport on this system.
func shmMaxFrame(n int) []hybrid.Option { return nil }

// shmQuiet: no shared-memory transport on this system.
func shmQuiet() []hybrid.Option { return nil }
