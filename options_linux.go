//go:build linux

package gdist

import (
	"github.com/gdist/gdist/dist/transport/hybrid"
	"github.com/gdist/gdist/dist/transport/shm"
	"github.com/gdist/gdist/internal/options"
)

// WithSHMOptions passes opts to the shared-memory links InitFromEnv sets
// up between the ranks of a host, after the options InitFromEnv derives
// from the environment (token, GDIST_HEARTBEAT_TIMEOUT, GDIST_MAX_FRAME,
// ...), so they win. Given several times, the lists add up. The transport
// validates them: InitFromEnv fails with its error (matching
// shm.ErrInvalidArgument) for a bad one, unless GDIST_TRANSPORT=auto falls
// back to TCP on that host (with a warning). A nil option is refused.
// (Linux only.)
func WithSHMOptions(opts ...shm.Option) Option {
	return func(c *config) error {
		if err := options.NoNil("gdist: WithSHMOptions", opts, ErrInvalidArgument); err != nil {
			return err
		}
		c.hybridOpts = append(c.hybridOpts, hybrid.WithSHM(opts...))
		return nil
	}
}
