package dist_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/transport"
)

// world starts n in-process ranks, runs f on each concurrently and closes
// them. Real jobs run one rank per process and use gdist.InitFromEnv.
func world(n int, f func(g *dist.ProcessGroup)) {
	ts, err := transport.NewLocal(n)
	if err != nil {
		panic(err)
	}
	var wg sync.WaitGroup
	for _, t := range ts {
		g, err := dist.New(t)
		if err != nil {
			panic(err)
		}
		wg.Go(func() {
			defer g.Close()
			f(g)
		})
	}
	wg.Wait()
}

func ExampleProcessGroup_AllReduce() {
	world(4, func(g *dist.ProcessGroup) {
		grad := []float32{float32(g.Rank()), 1}
		if err := g.AllReduce(context.Background(), dist.F32(grad), dist.Sum); err != nil {
			panic(err)
		}
		if g.Rank() == 0 {
			fmt.Println(grad)
		}
	})
	// Output: [6 4]
}

func ExampleProcessGroup_AllReduceAsync() {
	world(2, func(g *dist.ProcessGroup) {
		ctx := context.Background() // no deadline: the group's WithTimeout applies
		bucket := []float32{float32(g.Rank() + 1)}
		w := g.AllReduceAsync(ctx, dist.F32(bucket), dist.Mean)
		// ... compute the next bucket while this one travels ...
		if err := w.Wait(ctx); err != nil {
			panic(err)
		}
		if g.Rank() == 0 {
			fmt.Println(bucket, !w.Finished().IsZero())
		}
	})
	// Output: [1.5] true
}

func ExampleTyped() {
	world(2, func(g *dist.ProcessGroup) {
		vals := []float32{0.1, float32(g.Rank())}
		buf := make([]byte, len(vals)*dist.BFloat16.Size())
		if err := dist.EncodeFloat32(buf, vals, dist.BFloat16); err != nil {
			panic(err)
		}
		if err := g.AllReduce(context.Background(), dist.Typed(buf, dist.BFloat16), dist.Sum); err != nil {
			panic(err)
		}
		if err := dist.DecodeFloat32(vals, buf, dist.BFloat16); err != nil {
			panic(err)
		}
		if g.Rank() == 0 {
			fmt.Println(vals) // 0.1 is 0.10009765625 in bfloat16
		}
	})
	// Output: [0.20019531 1]
}

func ExampleProcessGroup_AllGather() {
	world(3, func(g *dist.ProcessGroup) {
		mine := []float32{float32(10 * g.Rank()), float32(10*g.Rank() + 1)}
		all := make([]float32, g.WorldSize()*len(mine))
		if err := g.AllGather(context.Background(), dist.F32(all), dist.F32(mine)); err != nil {
			panic(err)
		}
		if g.Rank() == 2 {
			fmt.Println(all)
		}
	})
	// Output: [0 1 10 11 20 21]
}

func ExampleProcessGroup_Broadcast() {
	world(3, func(g *dist.ProcessGroup) {
		params := make([]float32, 2)
		if g.Rank() == 1 {
			params[0], params[1] = 0.5, -2
		}
		if err := g.Broadcast(context.Background(), dist.F32(params), 1); err != nil {
			panic(err)
		}
		if g.Rank() == 2 {
			fmt.Println(params)
		}
	})
	// Output: [0.5 -2]
}

func ExampleProcessGroup_FederatedAverage() {
	world(3, func(g *dist.ProcessGroup) {
		model := []float32{float32(g.Rank() * 3)}
		n, err := g.FederatedAverage(context.Background(), model, time.Now().Add(10*time.Second))
		if err != nil {
			panic(err)
		}
		if g.Rank() == 0 {
			fmt.Println(n, "ranks averaged:", model)
		}
	})
	// Output: 3 ranks averaged: [3]
}

func ExampleDesyncError() {
	world(2, func(g *dist.ProcessGroup) {
		// Rank 1 passes a shorter vector: both ranks get a *DesyncError,
		// which unwraps to a *LengthMismatchError.
		err := g.AllReduce(context.Background(), dist.F32(make([]float32, 4-g.Rank())), dist.Sum)
		var lm *dist.LengthMismatchError
		if g.Rank() == 0 && errors.As(err, &lm) {
			fmt.Printf("%s: want %d elements, rank 1 has %d\n", lm.Op, lm.Want, lm.Got)
		}
	})
	// Output: all_reduce: want 4 elements, rank 1 has 3
}

// A layer above the group (a training loop, a pipeline) fails the whole
// job with Abort. Rank 1 aborts and closes at once; the others' collectives
// fail naming rank 1 and carrying its cause, never a bare "peer closed".
func ExampleProcessGroup_Abort() {
	world(3, func(g *dist.ProcessGroup) {
		if g.Rank() == 1 {
			g.Abort("train", errors.New("loss is NaN"))
			return // and Close, deferred by world
		}
		err := g.AllReduce(context.Background(), dist.F32(make([]float32, 4)), dist.Sum)
		var (
			pe *dist.PeerError
			a  *dist.AbortError
		)
		if g.Rank() == 0 && errors.As(err, &pe) && errors.As(err, &a) {
			fmt.Printf("rank 0: peer %d failed: kind %q, op %s, message %q, aborted: %v\n",
				pe.Rank, a.Kind, a.Op, a.Msg, errors.Is(err, dist.ErrAborted))
		}
	})
	// Output:
	// rank 0: peer 1 failed: kind "user error", op train, message "loss is NaN", aborted: true
}
