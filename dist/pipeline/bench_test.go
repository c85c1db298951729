package pipeline

import (
	"context"
	"fmt"
	"testing"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/pipeline/pipelinetest"
	"github.com/gdist/gdist/dist/transport/transporttest"
)

// BenchmarkTrainStep is one training step of bench/pipeline's default model
// (an MLP of 8 layers of 256, float32, batch 128) on one stage, in m
// micro-batches: the cost of splitting a batch, with no communication.
// One op = one step of 128 samples; compare B/op and allocs/op across m.
func BenchmarkTrainStep(b *testing.B) {
	const layers, width, batch = 8, 256, 128
	sizes := make([]int, layers+1)
	for i := range sizes {
		sizes[i] = width
	}
	for _, m := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("m=%d", m), func(b *testing.B) {
			pg, err := dist.New(transporttest.Locals(b, 1)[0])
			if err != nil {
				b.Fatal(err)
			}
			defer pg.Close()
			ctx := context.Background()
			rows := batch / m
			pl, err := New(ctx, pg, func(g *gorgonia.ExprGraph) (Stage, error) {
				return pipelinetest.NewMLPStage(g, sizes, 0, layers, rows, tensor.Float32), nil
			}, WithMicroBatches(m), WithLoss(pipelinetest.MSE), WithInference(false))
			if err != nil {
				b.Fatal(err)
			}
			defer pl.Close()
			d := Data{
				Input:  func(mb int, in *tensor.Dense) error { return nil },
				Target: func(mb int, t *tensor.Dense) error { return nil },
			}
			for range 2 {
				if _, err := pl.TrainStep(ctx, d); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := pl.TrainStep(ctx, d); err != nil {
					b.Fatal(err)
				}
				pl.ZeroGrad()
			}
		})
	}
}
