//go:build !linux

package gdist

import "github.com/gdist/gdist/dist/transport/hybrid"

// shmEnvOptions: no shared-memory transport on this system.
func shmEnvOptions(lookup func(string) (string, bool)) ([]hybrid.Option, error) {
	if _, _, _, err := envHeartbeat(lookup); err != nil {
		return nil, err
	}
	if _, _, err := envSize(lookup, EnvMaxFrame); err != nil {
		return nil, err
	}
	return nil, nil
}
