package gdist_test

import (
	"context"
	"fmt"
	"log"

	"github.com/gdist/gdist"
	"github.com/gdist/gdist/dist"
)

// Without a launcher's environment (no RANK, WORLD_SIZE, MASTER_ADDR, ...)
// the process is a world of one on the in-process transport, so a program
// written for a job also runs alone. Under gdistrun -n 4 the same code
// would print four lines, one per rank, with the mean of their gradients.
func ExampleInitFromEnv() {
	ctx := context.Background()
	g, err := gdist.InitFromEnv(ctx)
	if err != nil {
		log.Fatal(err) // errors.Is(err, dist.ErrEnv): a variable is missing or malformed
	}
	defer g.Close()

	grad := []float32{1, 2, 3}
	if err := g.AllReduce(ctx, dist.F32(grad), dist.Mean); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("rank %d of %d (local rank %d): %v\n", g.Rank(), g.WorldSize(), g.LocalRank(), grad)
	// Output: rank 0 of 1 (local rank 0): [1 2 3]
}
