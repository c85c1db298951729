//go:build !linux

package pipeline

import (
	"testing"

	"github.com/gdist/gdist/dist/transport"
)

// shmTransports skips: shared memory is Linux only.
func shmTransports(tb testing.TB, n int) []transport.Transport {
	tb.Skip("shared memory needs Linux")
	return nil
}
