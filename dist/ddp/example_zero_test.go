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
	"github.com/gdist/gdist/models/mlp"
	"github.com/gdist/gdist/train/optim"
)

// Two ranks train an MLP under ZeRO-2: each rank's Adam keeps the moments of
// half the parameters, and the ranks end with the same parameters.
func ExampleWithZeRO() {
	const ranks, rows = 2, 2
	sizes := []int{4, 8, 3}
	ts, err := transport.NewLocal(ranks)
	if err != nil {
		panic(err)
	}
	var mu sync.Mutex // Gorgonia graph construction is not goroutine-safe
	var wg sync.WaitGroup
	lines := make([]string, ranks)
	for r := range ranks {
		wg.Go(func() {
			pg, err := dist.New(ts[r])
			if err != nil {
				log.Fatal(err)
			}
			defer pg.Close()
			mu.Lock()
			g := gorgonia.NewGraph()
			m, err := mlp.New(g, mlp.Config{Sizes: sizes, Batch: rows, Dtype: tensor.Float64, Seed: 1})
			mu.Unlock()
			if err != nil {
				log.Fatal(err)
			}
			ps := m.Learnables()
			d, err := ddp.Wrap(context.Background(), pg, ps, ddp.WithZeRO(2))
			if err != nil {
				log.Fatal(err)
			}
			defer d.Close()
			mu.Lock()
			x, y := m.NewInputs()
			logits, err := m.ForwardHooked(x, d.Hook)
			if err != nil {
				log.Fatal(err)
			}
			loss, err := mlp.Loss(logits, y)
			if err != nil {
				log.Fatal(err)
			}
			if _, err := gorgonia.Grad(loss, ps...); err != nil {
				log.Fatal(err)
			}
			mu.Unlock()
			xv := make([]float64, rows*sizes[0])
			for i := range xv {
				xv[i] = float64((i+r*len(xv))%5) / 5
			}
			yv := make([]float64, rows*sizes[2])
			for i := range rows {
				yv[i*sizes[2]+(i+r)%sizes[2]] = 1
			}
			if err := gorgonia.Let(x, tensor.New(tensor.WithShape(rows, sizes[0]), tensor.WithBacking(xv))); err != nil {
				log.Fatal(err)
			}
			if err := gorgonia.Let(y, tensor.New(tensor.WithShape(rows, sizes[2]), tensor.WithBacking(yv))); err != nil {
				log.Fatal(err)
			}
			vm := gorgonia.NewTapeMachine(g) // no dual values under ZeRO
			defer vm.Close()
			adam, err := optim.NewAdam(optim.WithLearnRate(0.05))
			if err != nil {
				log.Fatal(err)
			}
			solver := d.Solver(adam) // steps this rank's pieces, then all-gathers the parameters
			for range 20 {
				if err := vm.RunAll(); err != nil {
					log.Fatal(err)
				}
				if err := solver.Step(gorgonia.NodesToValueGrads(ps)); err != nil {
					log.Fatal(err)
				}
				vm.Reset()
			}
			moments := 0
			for _, p := range adam.State().Params {
				moments += len(p.Slots[0].F64)
			}
			c, err := ddp.ChecksumOf(ps)
			if err != nil {
				log.Fatal(err)
			}
			lines[r] = fmt.Sprintf("rank %d: Adam's moments for %d of the 67 parameters; parameters fnv64a %016x", r, moments, c.Hash)
		})
	}
	wg.Wait()
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// rank 0: Adam's moments for 34 of the 67 parameters; parameters fnv64a 35181552ebf06c92
	// rank 1: Adam's moments for 33 of the 67 parameters; parameters fnv64a 35181552ebf06c92
}
