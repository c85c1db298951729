package ddp_test

import (
	"context"
	"fmt"
	"log"
	"sync"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/ddp"
	"github.com/gdist/gdist/dist/transport"
)

// Two ranks in one process fit y = 2x with a one-weight linear model, each on
// its half of the batch. Rank 1 starts from a different weight; Wrap
// broadcasts rank 0's, and the averaged gradients keep the ranks identical.
func Example() {
	const ranks, local = 2, 2
	xs := []float64{1, 2, 3, 4} // the global batch; rank r takes rows [2r, 2r+2)
	ts, err := transport.NewLocal(ranks)
	if err != nil {
		panic(err)
	}
	var mu sync.Mutex // Gorgonia graph construction is not goroutine-safe
	var wg sync.WaitGroup
	weights := make([]float64, ranks)
	for r := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pg, err := dist.New(ts[r])
			if err != nil {
				log.Fatal(err)
			}
			defer pg.Close()

			mu.Lock()
			g := gorgonia.NewGraph()
			w := gorgonia.NewScalar(g, tensor.Float64, gorgonia.WithName("w"), gorgonia.WithValue(float64(r)))
			mu.Unlock()
			d, err := ddp.Wrap(context.Background(), pg, gorgonia.Nodes{w})
			if err != nil {
				log.Fatal(err)
			}
			defer d.Close() // runs before pg.Close: the group outlives the DDP

			mu.Lock()
			x := gorgonia.NewVector(g, tensor.Float64, gorgonia.WithShape(local), gorgonia.WithName("x"),
				gorgonia.WithValue(tensor.New(tensor.WithBacking(append([]float64(nil), xs[r*local:(r+1)*local]...)))))
			hw, err := d.Hook(w) // at the point of use
			if err != nil {
				log.Fatal(err)
			}
			pred := gorgonia.Must(gorgonia.Mul(x, hw))
			diff := gorgonia.Must(gorgonia.Sub(pred, gorgonia.Must(gorgonia.Mul(x, gorgonia.NewConstant(2.0)))))
			loss := gorgonia.Must(gorgonia.Mean(gorgonia.Must(gorgonia.Square(diff)))) // a mean over the local batch
			if _, err := gorgonia.Grad(loss, w); err != nil {
				log.Fatal(err)
			}
			mu.Unlock()

			vm := gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(w))
			defer vm.Close()
			solver := d.Solver(gorgonia.NewVanillaSolver(gorgonia.WithLearnRate(0.05)))
			for range 20 {
				if err := vm.RunAll(); err != nil {
					log.Fatal(err)
				}
				if err := solver.Step(gorgonia.NodesToValueGrads(gorgonia.Nodes{w})); err != nil {
					log.Fatal(err)
				}
				vm.Reset()
			}
			weights[r] = w.Value().Data().(float64)
		}()
	}
	wg.Wait()
	fmt.Printf("rank 0: w=%.4f\nrank 1: w=%.4f\n", weights[0], weights[1])
	// Output:
	// rank 0: w=2.0000
	// rank 1: w=2.0000
}
