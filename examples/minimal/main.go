// Command minimal is a complete data-parallel training program to copy:
// every rank trains the same MLP on batches of its own (is a point inside
// a circle?), DDP averages the gradients during backprop, and all ranks end
// with identical parameters. Run it with: go run ./cmd/gdistrun -n 2 -- go run ./examples/minimal
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"math/rand/v2"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist"
	"github.com/gdist/gdist/dist/ddp"
	"github.com/gdist/gdist/models/mlp"
	"github.com/gdist/gdist/train/optim"
)

const batch, steps = 32, 200 // per rank

func main() {
	if err := run(context.Background()); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context) (err error) {
	pg, err := gdist.InitFromEnv(ctx) // rank, world and rendezvous from gdistrun, torchrun, Slurm or mpirun
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, pg.Close()) }() // Close writes GDIST_TIMELINE: its error counts
	g := gorgonia.NewGraph()
	m, err := mlp.New(g, mlp.Config{Sizes: []int{2, 32, 2}, Batch: batch, Seed: 1})
	if err != nil {
		return err
	}
	d, err := ddp.Wrap(ctx, pg, m.Learnables()) // every rank starts from rank 0's parameters
	if err != nil {
		return err
	}
	defer d.Close()
	x, y := m.NewInputs()
	xs, ys := make([]float32, batch*2), make([]float32, batch*2)
	gorgonia.Let(x, tensor.New(tensor.WithShape(batch, 2), tensor.WithBacking(xs)))
	gorgonia.Let(y, tensor.New(tensor.WithShape(batch, 2), tensor.WithBacking(ys)))
	logits := gorgonia.Must(m.ForwardHooked(x, d.Hook)) // a hook starts each gradient bucket's all-reduce
	loss := gorgonia.Must(mlp.Loss(logits, y))
	var lossVal gorgonia.Value
	gorgonia.Read(loss, &lossVal)
	if _, err := gorgonia.Grad(loss, m.Learnables()...); err != nil {
		return err
	}
	vm := gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(m.Learnables()...))
	defer vm.Close()
	adam, err := optim.NewAdam(optim.WithLearnRate(0.01))
	if err != nil {
		return err
	}
	solver := d.Solver(adam) // waits for the averaged gradients, then steps

	rng := rand.New(rand.NewPCG(1, uint64(pg.Rank()))) // each rank its own data
	for step := 1; step <= steps; step++ {
		for i := range batch {
			a, b := 4*rng.Float32()-2, 4*rng.Float32()-2
			xs[2*i], xs[2*i+1], ys[2*i], ys[2*i+1] = a, b, 0, 1
			if a*a+b*b < 2 {
				ys[2*i], ys[2*i+1] = 1, 0
			}
		}
		if err := vm.RunAll(); err != nil {
			return err
		}
		if err := solver.Step(gorgonia.NodesToValueGrads(m.Learnables())); err != nil {
			return err
		}
		vm.Reset()
		if pg.Rank() == 0 && step%40 == 0 {
			fmt.Printf("step %d/%d  rank 0's loss %.4f\n", step, steps, lossVal.Data())
		}
	}
	sum, err := ddp.ChecksumOf(m.Learnables()) // the final check: a collective comparison of the replicas
	if err != nil {
		return err
	}
	if same, err := ddp.SameReplicas(ctx, pg, sum); err != nil || !same {
		return fmt.Errorf("parameters differ between ranks (%v)", err)
	}
	if pg.Rank() == 0 {
		fmt.Printf("parameters identical on all %d ranks (fnv64a %016x)\n", pg.WorldSize(), sum.Hash)
	}
	return nil
}
