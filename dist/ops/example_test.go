package ops_test

import (
	"fmt"
	"log"
	"sync"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/ops"
	"github.com/gdist/gdist/dist/transport"
)

// Two ranks in one process all-reduce a vector inside their graphs and
// differentiate through the collective.
func ExampleAllReduce() {
	ts, err := transport.NewLocal(2)
	if err != nil {
		panic(err)
	}
	var mu sync.Mutex // Gorgonia graph construction is not goroutine-safe
	var wg sync.WaitGroup
	out := make([]string, 2)
	for r := range 2 {
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
			x := gorgonia.NewVector(g, tensor.Float64, gorgonia.WithShape(2), gorgonia.WithName("x"),
				gorgonia.WithValue(tensor.New(tensor.WithBacking([]float64{float64(r + 1), 10}))))
			y, err := ops.AllReduce(pg, x, dist.Sum) // x_0 + x_1 on both ranks
			if err != nil {
				log.Fatal(err)
			}
			w := gorgonia.NewConstant(tensor.New(tensor.WithBacking([]float64{float64(r + 1), 1})))
			loss := gorgonia.Must(gorgonia.Sum(gorgonia.Must(gorgonia.HadamardProd(y, w))))
			if _, err := gorgonia.Grad(loss, x); err != nil {
				log.Fatal(err)
			}
			var yv gorgonia.Value
			gorgonia.Read(y, &yv)
			mu.Unlock()

			vm := gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(x))
			defer vm.Close()
			if err := vm.RunAll(); err != nil {
				log.Fatal(err)
			}
			gx, _ := x.Grad()
			// The gradient of Σ_r loss_r w.r.t. x_r is Σ_r w_r.
			out[r] = fmt.Sprintf("rank %d: y=%v dx=%v", r, yv.Data(), gx.Data())
		}()
	}
	wg.Wait()
	fmt.Println(out[0])
	fmt.Println(out[1])
	// Output:
	// rank 0: y=[3 20] dx=[3 2]
	// rank 1: y=[3 20] dx=[3 2]
}
