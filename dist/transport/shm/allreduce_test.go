//go:build linux

package shm_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/transport/shm"
)

// TestAllReduceZeroAllocs: a steady-state dist all-reduce over shm
// allocates nothing, counting both ranks and the transports' goroutines,
// and sums correctly; sizes below and above the single-copy threshold.
func TestAllReduceZeroAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, length := range []int{4096, 1 << 18} {
		t.Run(fmt.Sprint(length), func(t *testing.T) {
			var b [8]byte
			rand.Read(b[:])
			name := "@gdist-shm-ar-" + hex.EncodeToString(b[:])
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			pgs := make([]*dist.ProcessGroup, 2)
			var wg sync.WaitGroup
			for r := range 2 {
				wg.Go(func() {
					tr, err := shm.Rendezvous(ctx, r, 2, name, shm.WithToken([]byte("tok")))
					if err != nil {
						panic(err)
					}
					if pgs[r], err = dist.New(tr); err != nil {
						panic(err)
					}
				})
			}
			wg.Wait()
			defer pgs[1].Close()
			defer pgs[0].Close()
			bufs := [2][]float32{make([]float32, length), make([]float32, length)}
			kick := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
			done := make(chan error, 2)
			for r := range 2 {
				go func() {
					for range kick[r] {
						done <- pgs[r].AllReduce(ctx, bufs[r], dist.Sum)
					}
				}()
			}
			defer close(kick[1])
			defer close(kick[0])
			step := func() {
				bufs[0][0], bufs[1][0] = 1, 2
				kick[0] <- struct{}{}
				kick[1] <- struct{}{}
				for range 2 {
					if err := <-done; err != nil {
						panic(err)
					}
				}
				if bufs[0][0] != 3 || bufs[1][0] != 3 {
					panic("wrong sum")
				}
			}
			for range 20 {
				step()
			}
			allocs := testing.AllocsPerRun(100, step)
			t.Logf("allocations per all-reduce: %v", allocs)
			require.Less(t, allocs, 0.5)
		})
	}
}
