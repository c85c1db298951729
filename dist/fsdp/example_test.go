package fsdp_test

import (
	"context"
	"fmt"
	"log"
	"sync"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/fsdp"
	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/models/mlp"
	"github.com/gdist/gdist/train/optim"
)

// Two ranks in one process train an MLP of two layers, one unit each, on
// their halves of a batch. Each rank keeps half of every layer; the layers
// are gathered as the passes reach them.
func Example() {
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
			ctx := context.Background()

			mu.Lock()
			g := gorgonia.NewGraph()
			m, err := mlp.New(g, mlp.Config{Sizes: sizes, Batch: rows, Dtype: tensor.Float64, Seed: 1})
			mu.Unlock()
			if err != nil {
				log.Fatal(err)
			}
			ps := m.Learnables() // w0, b0, w1, b1
			f, err := fsdp.Wrap(ctx, pg, []gorgonia.Nodes{ps[0:2], ps[2:4]})
			if err != nil {
				log.Fatal(err)
			}
			defer f.Close() // runs before pg.Close

			mu.Lock()
			x, y := m.NewInputs()
			logits, err := m.ForwardHooked(x, f.Hook)
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
			// This rank's rows of a fixed batch.
			xv := make([]float64, rows*sizes[0])
			yv := make([]float64, rows*sizes[2])
			for i := range xv {
				xv[i] = float64((i+r*len(xv))%5) / 5
			}
			for i := range rows {
				yv[i*sizes[2]+(i+r)%sizes[2]] = 1
			}
			if err := gorgonia.Let(x, tensor.New(tensor.WithShape(rows, sizes[0]), tensor.WithBacking(xv))); err != nil {
				log.Fatal(err)
			}
			if err := gorgonia.Let(y, tensor.New(tensor.WithShape(rows, sizes[2]), tensor.WithBacking(yv))); err != nil {
				log.Fatal(err)
			}

			vm := gorgonia.NewTapeMachine(g) // no dual values: FSDP hands the solver its pieces
			defer vm.Close()
			sgd, err := optim.NewSGD(optim.WithLearnRate(0.5))
			if err != nil {
				log.Fatal(err)
			}
			solver := f.Solver(sgd)
			var first, last float64
			for step := range 30 {
				if err := vm.RunAll(); err != nil {
					log.Fatal(err)
				}
				l := loss.Value().Data().(float64)
				if step == 0 {
					first = l
				}
				last = l
				if err := solver.Step(gorgonia.NodesToValueGrads(ps)); err != nil {
					log.Fatal(err)
				}
				vm.Reset()
			}
			full, err := f.FullParams(ctx) // the whole model, gathered: a collective
			if err != nil {
				log.Fatal(err)
			}
			mem := f.Memory()
			lines[r] = fmt.Sprintf("rank %d: loss %.4f -> %.4f; holds %d of the model's %d parameter bytes; w1[0] = %.6f",
				r, first, last, mem.ParamShards, 8*(4*8+8+8*3+3), full[2].Data().([]float64)[0])
		})
	}
	wg.Wait()
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// rank 0: loss 0.9479 -> 0.0993; holds 272 of the model's 536 parameter bytes; w1[0] = -0.801739
	// rank 1: loss 1.0645 -> 0.0899; holds 272 of the model's 536 parameter bytes; w1[0] = -0.801739
}
