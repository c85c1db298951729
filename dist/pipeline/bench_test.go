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

// The benchmarks' model is bench/pipeline's default: an MLP of 8 layers
// of 256, float32, batch 128.
const benchLayers, benchWidth, benchBatch = 8, 256, 128

func benchSizes() []int {
	sizes := make([]int, benchLayers+1)
	for i := range sizes {
		sizes[i] = benchWidth
	}
	return sizes
}

// benchPipeline returns one training step of the benchmark model on one
// stage in m micro-batches (TrainStep, then ZeroGrad, which a solver's
// Step does), after two warm-up steps.
func benchPipeline(b *testing.B, m int) func() {
	pg, err := dist.New(transporttest.Locals(b, 1)[0])
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pg.Close() })
	ctx := context.Background()
	rows := benchBatch / m
	pl, err := New(ctx, pg, func(g *gorgonia.ExprGraph) (Stage, error) {
		return pipelinetest.NewMLPStage(g, benchSizes(), 0, benchLayers, rows, tensor.Float32), nil
	}, WithMicroBatches(m), WithLoss(pipelinetest.MSE), WithInference(false))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pl.Close() })
	d := Data{
		Input:  func(mb int, in *tensor.Dense) error { return nil },
		Target: func(mb int, t *tensor.Dense) error { return nil },
	}
	step := func() {
		if _, err := pl.TrainStep(ctx, d); err != nil {
			b.Fatal(err)
		}
		pl.ZeroGrad()
	}
	step()
	step()
	return step
}

// benchPlain returns one training step of the benchmark model on plain
// Gorgonia: the whole model and batch in one graph on a
// gorgonia.TapeMachine (RunAll, Reset).
func benchPlain(b *testing.B) func() {
	g := gorgonia.NewGraph()
	st := pipelinetest.NewMLPStage(g, benchSizes(), 0, benchLayers, benchBatch, tensor.Float32)
	x := gorgonia.NewMatrix(g, tensor.Float32, gorgonia.WithShape(benchBatch, benchWidth), gorgonia.WithName("x"),
		gorgonia.WithValue(tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(benchBatch, benchWidth))))
	y := gorgonia.NewMatrix(g, tensor.Float32, gorgonia.WithShape(benchBatch, benchWidth), gorgonia.WithName("y"),
		gorgonia.WithValue(tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(benchBatch, benchWidth))))
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
	b.Cleanup(func() { vm.Close() })
	return func() {
		if err := vm.RunAll(); err != nil {
			b.Fatal(err)
		}
		vm.Reset()
	}
}

// BenchmarkTrainStep is one training step of the benchmark model on one
// stage, in m micro-batches: the cost of splitting a batch, with no
// communication. One op = one step of 128 samples; compare B/op and
// allocs/op across m.
func BenchmarkTrainStep(b *testing.B) {
	for _, m := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("m=%d", m), func(b *testing.B) {
			step := benchPipeline(b, m)
			b.ReportAllocs()
			cpu0 := benchutil.CPUTime()
			for b.Loop() {
				step()
			}
			reportCPU(b, cpu0)
		})
	}
}

// BenchmarkPlain is BenchmarkTrainStep's step on plain Gorgonia, the
// baseline a pipeline stage's per-micro-batch costs add to.
func BenchmarkPlain(b *testing.B) {
	step := benchPlain(b)
	b.ReportAllocs()
	cpu0 := benchutil.CPUTime()
	for b.Loop() {
		step()
	}
	reportCPU(b, cpu0)
}

// BenchmarkOverPlain runs, in turn, one step on plain Gorgonia and one on
// a pipeline stage in m micro-batches, so that both see the same machine,
// and reports the stage's time over plain Gorgonia's (x-plain) and the
// difference per micro-batch (ns-over-plain/mb): the fixed cost of a
// micro-batch.
func BenchmarkOverPlain(b *testing.B) {
	for _, m := range []int{4, 16, 32} {
		b.Run(fmt.Sprintf("m=%d", m), func(b *testing.B) {
			plain, pipe := benchPlain(b), benchPipeline(b, m)
			var tPlain, tPipe time.Duration
			for b.Loop() {
				t0 := time.Now()
				plain()
				t1 := time.Now()
				pipe()
				tPlain += t1.Sub(t0)
				tPipe += time.Since(t1)
			}
			b.ReportMetric(float64(tPipe)/float64(tPlain), "x-plain")
			b.ReportMetric(float64(tPipe-tPlain)/float64(b.N*m), "ns-over-plain/mb")
		})
	}
}

// reportCPU reports the process's CPU time per op since cpu0 (cpu-ns/op):
// on a shared machine it varies less than the wall time, which counts the
// time the process waited for a CPU.
func reportCPU(b *testing.B, cpu0 time.Duration) {
	if cpu := benchutil.CPUTime(); cpu > 0 {
		b.ReportMetric(float64((cpu-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
}
