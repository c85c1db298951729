package pipeline

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/tcp"
	"github.com/gdist/gdist/dist/transport/transporttest"
)

// TestInferLoopNoLeak: 100,000 pipelined inference calls on two stages (a
// fresh tag per call and micro-batch, as the pipeline always uses) leave
// the heap within 2 MiB of where it was after warm-up. (10,000 with -short.)
func TestInferLoopNoLeak(t *testing.T) {
	calls := 100_000
	if testing.Short() {
		calls = 10_000
	}
	const p, rows = 2, 2
	var growth int64
	heap := func() int64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return int64(ms.HeapAlloc)
	}
	var bar sync.WaitGroup // both ranks measure at the same points
	bar.Add(p)
	var bar2 sync.WaitGroup
	bar2.Add(p)
	var before int64
	errs := runRanks(t, p, func(pg *dist.ProcessGroup) error {
		ctx := context.Background()
		pl, err := New(ctx, pg, mlpBuilder(testSizes, p, pg.Rank(), rows, tensor.Float64))
		if err != nil {
			return err
		}
		defer pl.Close()
		d := mlpData(0, rows, nil)
		for range 1000 {
			if err := pl.Infer(ctx, d); err != nil {
				return err
			}
		}
		bar.Done()
		bar.Wait()
		if pg.Rank() == 0 {
			before = heap()
		}
		bar2.Done()
		bar2.Wait()
		for range calls {
			if err := pl.Infer(ctx, d); err != nil {
				return err
			}
		}
		return nil
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	growth = heap() - before
	t.Logf("%d pipelined Infer calls, 2 stages, Local: heap growth %d bytes (%.1f B/call)", calls, growth, float64(growth)/float64(calls))
	assert.Less(t, growth, int64(2<<20))
}

// BenchmarkHiddenState measures the pipeline's hidden-state path alone: a
// stage sends a micro-batch's activations (sendData) and the next stage
// receives them into its stage buffer (recvInto), each micro-batch on a
// fresh tag as the schedule uses. One op = one micro-batch; both ranks run
// concurrently, the receiver posting before the sender sends when it keeps
// up. Over Local, over TCP on loopback and over shared memory.
func BenchmarkHiddenState(b *testing.B) {
	for _, kind := range []string{"local", "tcp", "shm"} {
		for _, n := range []int{4 << 10, 32 << 10, 256 << 10} { // float32s: 16 KiB, 128 KiB and 1 MiB
			b.Run(fmt.Sprintf("%s/%dKiB", kind, n*4>>10), func(b *testing.B) {
				pgs := benchGroups(b, kind)
				src := make([]float32, n)
				dst := make([]float32, n)
				ctx := context.Background()
				iters := b.N
				errc := make(chan error, 1)
				b.SetBytes(int64(4 * n))
				b.ReportAllocs()
				b.ResetTimer()
				go func() {
					for i := range iters {
						if err := sendData(ctx, pgs[0], 1, uint32(i)&0xFFFFF, src); err != nil {
							errc <- err
							return
						}
					}
					errc <- nil
				}()
				for i := range iters {
					if err := recvInto(ctx, pgs[1], 0, uint32(i)&0xFFFFF, dst); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				if err := <-errc; err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}

// benchGroups returns 2 ranks' groups over the transport of the given kind
// (local, tcp or shm), closed when the test ends.
func benchGroups(b testing.TB, kind string) []*dist.ProcessGroup {
	var ts []transport.Transport
	switch kind {
	case "local":
		ts = transporttest.Locals(b, 2)
	case "shm":
		ts = shmTransports(b, 2)
	default:
		lns := make([]net.Listener, 2)
		addrs := make([]string, 2)
		for i := range lns {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(b, err)
			lns[i], addrs[i] = ln, ln.Addr().String()
		}
		ts = make([]transport.Transport, 2)
		token := rand.Text() // a fresh job token
		errs := make([]error, 2)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		for i := range 2 {
			wg.Go(func() {
				var tr *tcp.Transport
				tr, errs[i] = tcp.New(ctx, i, 2, lns[i], addrs, tcp.WithToken([]byte(token)))
				if errs[i] == nil {
					ts[i] = tr
				}
			})
		}
		wg.Wait()
		for _, err := range errs {
			require.NoError(b, err)
		}
	}
	pgs := make([]*dist.ProcessGroup, 2)
	for i, tr := range ts {
		pg, err := dist.New(tr)
		require.NoError(b, err)
		pgs[i] = pg
	}
	b.Cleanup(func() {
		var wg sync.WaitGroup
		for _, pg := range pgs {
			wg.Go(func() { pg.Close() })
		}
		wg.Wait()
	})
	return pgs
}

// TestHiddenStateZeroAllocs: in steady state, sending a micro-batch's
// activations through a call's sender and receiving them into a stage's
// input (recvInto), under a cancellable context and on a fresh tag per
// micro-batch as the schedules do, allocates nothing: over Local, TCP and
// shared memory, 16 KiB and 128 KiB messages.
func TestHiddenStateZeroAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, kind := range []string{"local", "tcp", "shm"} {
		for _, n := range []int{4 << 10, 32 << 10} {
			t.Run(fmt.Sprintf("%s/%dKiB", kind, n*4>>10), func(t *testing.T) {
				pgs := benchGroups(t, kind)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				snd := startSender(ctx, pgs[0], 4, func(error) { cancel() })
				defer func() { require.NoError(t, snd.finish()) }()
				// As a slot's tensors give them (tensor.Dense.Data), boxed once.
				var src, dst any = make([]float32, n), make([]float32, n)
				done := make(chan struct{}, 1)
				mb := 0
				step := func() {
					tag := DefaultTagBase + tagData + uint32(mb%4096)
					mb++
					snd.send(1, tag, src, done)
					if err := recvInto(ctx, pgs[1], 0, tag, dst); err != nil {
						panic(err)
					}
					<-done
				}
				for range 100 {
					step()
				}
				assert.Zero(t, testing.AllocsPerRun(200, step), "allocations per micro-batch")
			})
		}
	}
}
