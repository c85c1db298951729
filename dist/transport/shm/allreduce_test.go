//go:build linux

package shm_test

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/shm"
)

// TestAllReduceZeroAllocs: a steady-state dist all-reduce over shm
// allocates nothing, counting both ranks and the transports' goroutines,
// and sums correctly; small, through the ring (1 MiB and 16 MiB) and by
// single copy.
func TestAllReduceZeroAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, c := range []struct {
		length int
		opts   []shm.Option
	}{{4096, nil}, {1 << 18, nil}, {4 << 20, nil}, {1 << 18, []shm.Option{shm.WithSingleCopy(128 << 10)}}} {
		length := c.length
		t.Run(fmt.Sprint(length, len(c.opts)), func(t *testing.T) {
			var b [8]byte
			crand.Read(b[:])
			name := "@gdist-shm-ar-" + hex.EncodeToString(b[:])
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			pgs := make([]*dist.ProcessGroup, 2)
			var wg sync.WaitGroup
			for r := range 2 {
				wg.Go(func() {
					tr, err := shm.Rendezvous(ctx, r, 2, name, append([]shm.Option{shm.WithToken([]byte("tok"))}, c.opts...)...)
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
						done <- pgs[r].AllReduce(ctx, dist.F32(bufs[r]), dist.Sum)
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

// TestAllReduceSameBits: an all-reduce over shm, which combines segments
// where they lie in shared memory (RecvReduce), gives every rank the same
// bits as the same all-reduce over the in-process transport, which copies
// them out first; 2 and 3 ranks, ring and recursive doubling, sum and mean.
func TestAllReduceSameBits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, world := range []int{2, 3} {
		for _, length := range []int{1000, 300000, 1<<20 + 3} {
			t.Run(fmt.Sprint(world, "/", length), func(t *testing.T) {
				input := func(r int) []float32 {
					rng := rand.New(rand.NewPCG(uint64(r), uint64(length)))
					v := make([]float32, length)
					for i := range v {
						v[i] = float32(rng.NormFloat64())
					}
					return v
				}
				run := func(pgs []*dist.ProcessGroup, op dist.ReduceOp) [][]float32 {
					out := make([][]float32, world)
					var wg sync.WaitGroup
					errs := make([]error, world)
					for r := range world {
						out[r] = input(r)
						wg.Go(func() { errs[r] = pgs[r].AllReduce(ctx, dist.F32(out[r]), op) })
					}
					wg.Wait()
					for _, err := range errs {
						require.NoError(t, err)
					}
					return out
				}
				var b [8]byte
				crand.Read(b[:])
				name := "@gdist-shm-bits-" + hex.EncodeToString(b[:])
				shmPG := make([]*dist.ProcessGroup, world)
				var wg sync.WaitGroup
				errs := make([]error, world)
				for r := range world {
					wg.Go(func() {
						tr, err := shm.Rendezvous(ctx, r, world, name, shm.WithToken([]byte("tok")), shm.WithSingleCopy(256<<10))
						if err == nil {
							shmPG[r], err = dist.New(tr)
						}
						errs[r] = err
					})
				}
				wg.Wait()
				for _, err := range errs {
					require.NoError(t, err)
				}
				ls, err := transport.NewLocal(world)
				require.NoError(t, err)
				localPG := make([]*dist.ProcessGroup, world)
				for r := range world {
					localPG[r], err = dist.New(ls[r])
					require.NoError(t, err)
				}
				for _, op := range []dist.ReduceOp{dist.Sum, dist.Mean} {
					got, want := run(shmPG, op), run(localPG, op)
					for r := range world {
						require.Equal(t, want[0], got[r], "rank %d, %v", r, op)
						require.Equal(t, want[r], want[0])
					}
				}
				for r := range world {
					require.NoError(t, shmPG[r].Close())
					require.NoError(t, localPG[r].Close())
				}
			})
		}
	}
}
