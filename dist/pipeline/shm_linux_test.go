//go:build linux

package pipeline

import (
	"context"
	"crypto/rand"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/shm"
)

// shmTransports returns n ranks over shared memory in this process.
func shmTransports(tb testing.TB, n int) []transport.Transport {
	tb.Helper()
	token := []byte(rand.Text())
	name := "@gdist-pipeline-test-" + rand.Text()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ts := make([]transport.Transport, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			var tr *shm.Transport
			tr, errs[i] = shm.Rendezvous(ctx, i, n, name, shm.WithToken(token))
			if errs[i] == nil {
				ts[i] = tr
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(tb, err)
	}
	return ts
}
