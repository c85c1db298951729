package dist_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/transport"
)

// Four in-process ranks that report two hosts of two ranks each: the
// all-reduce sums within each host, then between the hosts' leaders (ranks
// 0 and 2), then copies the result within each host. Mean divides by the
// world size once. dist.WithHierarchical(false) (or GDIST_HIERARCHICAL=0)
// would run the flat ring instead, with the same result.
func ExampleWithHierarchical() {
	ts, err := transport.NewLocal(4, transport.WithHosts([]int{0, 0, 1, 1}))
	if err != nil {
		panic(err)
	}
	var wg sync.WaitGroup
	for _, t := range ts {
		g, err := dist.New(t, dist.WithHierarchical(true))
		if err != nil {
			panic(err)
		}
		wg.Go(func() {
			defer g.Close()
			grad := []float32{float32(g.Rank()), 1}
			if err := g.AllReduce(context.Background(), dist.F32(grad), dist.Mean); err != nil {
				panic(err)
			}
			if g.Rank() == 0 {
				fmt.Println(grad)
			}
		})
	}
	wg.Wait()
	// Output: [1.5 1]
}
