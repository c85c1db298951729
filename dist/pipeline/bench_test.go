package pipeline

import (
	"context"
	"fmt"
	"testing"
	"time"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/pipeline/pipelinetest"
	"github.com/gdist/gdist/dist/transport/transporttest"
	"github.com/gdist/gdist/internal/benchutil"
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
			cpu0 := benchutil.CPUTime()
			for b.Loop() {
				if _, err := pl.TrainStep(ctx, d); err != nil {
					b.Fatal(err)
				}
				pl.ZeroGrad()
			}
			reportCPU(b, cpu0)
		})
	}
}

// BenchmarkPlain is BenchmarkTrainStep's step on plain Gorgonia: the whole
// model and batch in one graph on a gorgonia.TapeMachine (RunAll, Reset),
// the baseline a pipeline stage's per-micro-batch costs add to.
func BenchmarkPlain(b *testing.B) {
	const layers, width, batch = 8, 256, 128
	sizes := make([]int, layers+1)
	for i := range sizes {
		sizes[i] = width
	}
	g := gorgonia.NewGraph()
	st := pipelinetest.NewMLPStage(g, sizes, 0, layers, batch, tensor.Float32)
	x := gorgonia.NewMatrix(g, tensor.Float32, gorgonia.WithShape(batch, width), gorgonia.WithName("x"),
		gorgonia.WithValue(tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(batch, width))))
	y := gorgonia.NewMatrix(g, tensor.Float32, gorgonia.WithShape(batch, width), gorgonia.WithName("y"),
		gorgonia.WithValue(tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(batch, width))))
	out, err := st.Forward(x)
	if err != nil {
		b.Fatal(err)
	}
	loss, err := pipelinetest.MSE(out, y)
	if err != nil {
		b.Fatal(err)
	}
	params := st.Learnables()
	if _, err := gorgonia.Grad(loss, params...); err != nil {
		b.Fatal(err)
	}
	vm := gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(params...))
	defer vm.Close()
	b.ReportAllocs()
	cpu0 := benchutil.CPUTime()
	for b.Loop() {
		if err := vm.RunAll(); err != nil {
			b.Fatal(err)
		}
		vm.Reset()
	}
	reportCPU(b, cpu0)
}

// reportCPU reports the process's CPU time per op since cpu0 (cpu-ns/op):
// on a shared machine it varies less than the wall time, which counts the
// time the process waited for a CPU.
func reportCPU(b *testing.B, cpu0 time.Duration) {
	if cpu := benchutil.CPUTime(); cpu > 0 {
		b.ReportMetric(float64((cpu-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
}
