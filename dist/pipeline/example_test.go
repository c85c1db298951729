package pipeline_test

import (
	"context"
	"fmt"
	"sync"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/pipeline"
	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/models/transformer"
)

// Two pipeline stages of a small transformer, trained with GPipe on 4
// micro-batches. The ranks run as goroutines on the in-process transport;
// in a real job each is a process started by gdistrun, and gdist.InitFromEnv
// makes its group.
func Example() {
	cfg := transformer.Config{Vocab: 8, Ctx: 6, Dim: 16, Heads: 2, Layers: 2, MLPHidden: 32,
		Dtype: transformer.Float64, Seed: 1}
	const batch, micro = 8, 4 // sequences per step, micro-batches
	n := batch / micro        // sequences per micro-batch
	text := []int{0, 1, 2, 3, 4, 5, 6, 7, 6, 5, 4, 3, 2, 1}
	ids := func(mb int, shift int) []int { // micro-batch mb's tokens, sequence-major
		var out []int
		for s := mb * n; s < (mb+1)*n; s++ {
			for t := range cfg.Ctx {
				out = append(out, text[(s+t+shift)%len(text)])
			}
		}
		return out
	}

	ts, err := transport.NewLocal(2)
	if err != nil {
		panic(err)
	}
	var wg sync.WaitGroup
	for rank := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := dist.New(ts[rank])
			if err != nil {
				panic(err)
			}
			defer g.Close()
			ctx := context.Background()
			// Layers 0..3: embedding, two blocks, head. Rank 0 gets [0, 1],
			// rank 1 gets [2, 3].
			build := func(gr *gorgonia.ExprGraph) (pipeline.Stage, error) {
				return transformer.NewStage(gr, cfg, 2*rank, 2*rank+1, n)
			}
			p, err := pipeline.New(ctx, g, build,
				pipeline.WithMicroBatches(micro), pipeline.WithLoss(transformer.CrossEntropy))
			if err != nil {
				panic(err)
			}
			defer p.Close()
			solver := gorgonia.NewAdamSolver(gorgonia.WithLearnRate(0.01))
			data := pipeline.Data{
				Input:  func(mb int, in *tensor.Dense) error { return transformer.FillOneHot(in, ids(mb, 0)) },
				Target: func(mb int, t *tensor.Dense) error { return transformer.FillOneHot(t, ids(mb, 1)) },
			}
			for step := range 30 {
				loss, err := p.TrainStep(ctx, data)
				if err != nil {
					panic(err)
				}
				if err := solver.Step(gorgonia.NodesToValueGrads(p.Learnables())); err != nil {
					panic(err)
				}
				if p.IsLast() && step%10 == 0 {
					fmt.Printf("step %2d: loss %.2f\n", step, loss)
				}
			}
		}()
	}
	wg.Wait()
	// Output:
	// step  0: loss 2.09
	// step 10: loss 1.02
	// step 20: loss 0.42
}
