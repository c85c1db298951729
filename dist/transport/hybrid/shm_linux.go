//go:build linux

package hybrid

import (
	"context"

	"github.com/gdist/gdist/dist/transport/shm"
	"github.com/gdist/gdist/internal/options"
)

// shmSupported reports whether this build has the shared-memory transport.
const shmSupported = true

// WithSHM passes opts to the shared-memory transport, after the options
// Rendezvous derives (token, logger), so they win. Given several times,
// the lists add up. The shared-memory transport validates them, when a
// host has several ranks: Rendezvous fails with its error (matching
// shm.ErrInvalidArgument) for a bad one, in every mode but TCP. (Linux only.)
func WithSHM(opts ...shm.Option) Option {
	return func(c *config) error {
		if err := options.NoNil("hybrid: WithSHM", opts, ErrInvalidArgument); err != nil {
			return err
		}
		for _, o := range opts {
			c.shmOpts = append(c.shmOpts, o)
		}
		return nil
	}
}

// startSHM sets up shared memory among the ranks r with peers[r] under
// the abstract socket name, authenticating with token.
func startSHM(ctx context.Context, rank, world int, name string, peers []bool, token []byte, cfg *config) (shmLink, error) {
	opts := []shm.Option{shm.WithToken(token), shm.WithLogger(cfg.logger)}
	for _, o := range cfg.shmOpts {
		opts = append(opts, o.(shm.Option))
	}
	t, err := shm.RendezvousPeers(ctx, rank, world, name, peers, opts...)
	if err != nil {
		return nil, err
	}
	return t, nil
}

var _ shmLink = (*shm.Transport)(nil)
