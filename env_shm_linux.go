//go:build linux

package gdist

import (
	"time"

	"github.com/gdist/gdist/dist/transport/hybrid"
	"github.com/gdist/gdist/dist/transport/shm"
)

// shmEnvOptions returns the options of the shared-memory links the
// environment asks for: the heartbeat (GDIST_HEARTBEAT_TIMEOUT,
// GDIST_HEARTBEAT_INTERVAL) and the maximum frame (GDIST_MAX_FRAME), as
// for TCP. A malformed value is an error matching dist.ErrEnv that names the
// variable.
func shmEnvOptions(lookup func(string) (string, bool)) ([]hybrid.Option, error) {
	var opts []shm.Option
	if interval, timeout, ok, err := envHeartbeat(lookup); err != nil {
		return nil, err
	} else if ok {
		if interval == 0 { // derived as TCP derives it
			interval = min(timeout/8, time.Second)
		}
		opts = append(opts, shm.WithHeartbeat(interval, timeout))
	}
	if n, ok, err := envSize(lookup, EnvMaxFrame); err != nil {
		return nil, err
	} else if ok {
		opts = append(opts, shm.WithMaxFrame(n))
	}
	if len(opts) == 0 {
		return nil, nil
	}
	return []hybrid.Option{hybrid.WithSHM(opts...)}, nil
}
