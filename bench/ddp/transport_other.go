//go:build !linux

package main

import (
	"context"
	"errors"

	"github.com/gdist/gdist/dist/transport"
)

// shmRendezvous: the shared-memory transport needs Linux.
func shmRendezvous(ctx context.Context, rank, world int) (transport.Transport, error) {
	return nil, errors.New("-transport shm: the shared-memory transport needs Linux")
}
