//go:build !linux

package hybrid

import (
	"context"
	"errors"
)

const shmSupported = false

var errNoSHM = errors.New("hybrid: no shared-memory transport on this system")

func startSHM(ctx context.Context, rank, world int, name string, peers []bool, token []byte, cfg *config) (shmLink, error) {
	return nil, errNoSHM
}
