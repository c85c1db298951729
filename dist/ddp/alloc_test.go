package ddp

import (
	"context"
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/transport/transporttest"
)

// stepAllocBytes returns the bytes allocated per steady-state training step
// (RunAll, Step, Reset) of an f32 MLP on one rank, with the DDP (hooks at
// the point of use, its Solver) or without.
func stepAllocBytes(t *testing.T, withDDP bool) float64 {
	t.Helper()
	step := newStep(t, withDDP, []int{64, 128, 32, 10}, 8)
	for range 3 {
		step()
	}
	const n = 20
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range n {
		step()
	}
	runtime.ReadMemStats(&after)
	return float64(after.TotalAlloc-before.TotalAlloc) / n
}

// newStep builds an f32 tanh MLP with Adam on one rank, with the DDP or
// without, and returns a function running one training step.
func newStep(t testing.TB, withDDP bool, sizes []int, batchN int) func() {
	t.Helper()
	_, step := buildStep(t, withDDP, sizes, batchN)
	return step
}

// buildStep is newStep, also returning the machine.
func buildStep(t testing.TB, withDDP bool, sizes []int, batchN int) (gorgonia.VM, func()) {
	t.Helper()
	dt := tensor.Float32
	buildMu.Lock()
	g := gorgonia.NewGraph()
	ps := newParams(g, dt, sizes, 0)
	buildMu.Unlock()

	use := func(i int) (*gorgonia.Node, error) { return ps[i], nil }
	var solver gorgonia.Solver = adam()
	if withDDP {
		pg, err := dist.New(transporttest.NewLocal(t, 1)[0])
		require.NoError(t, err)
		t.Cleanup(func() { pg.Close() })
		d, err := Wrap(context.Background(), pg, ps)
		require.NoError(t, err)
		use = func(i int) (*gorgonia.Node, error) { return d.Hook(ps[i]) }
		solver = d.Solver(solver)
	}
	buildMu.Lock()
	x := gorgonia.NewMatrix(g, dt, gorgonia.WithShape(batchN, sizes[0]), gorgonia.WithName("x"))
	y := gorgonia.NewMatrix(g, dt, gorgonia.WithShape(batchN, sizes[len(sizes)-1]), gorgonia.WithName("y"))
	out, err := forward(x, len(ps), use, nil)
	var loss *gorgonia.Node
	if err == nil {
		loss, err = mseLoss(out, y)
	}
	if err == nil {
		_, err = gorgonia.Grad(loss, ps...)
	}
	buildMu.Unlock()
	require.NoError(t, err)
	xv, yv := batch(dt, 0, 0, batchN, sizes[0], sizes[len(sizes)-1])
	require.NoError(t, gorgonia.Let(x, xv))
	require.NoError(t, gorgonia.Let(y, yv))
	vm := gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(ps...))
	t.Cleanup(func() { vm.Close() })
	model := gorgonia.NodesToValueGrads(ps)
	return vm, func() {
		if err := vm.RunAll(); err != nil {
			t.Fatal(err)
		}
		if err := solver.Step(model); err != nil {
			t.Fatal(err)
		}
		vm.Reset()
	}
}

// TestStepAllocations checks that the DDP allocates nothing in proportion to
// the model per step: its hook ops reuse their output buffers and Sync
// reuses the buckets. (Gorgonia itself allocates most op results anew.)
func TestStepAllocations(t *testing.T) {
	plain := stepAllocBytes(t, false)
	withDDP := stepAllocBytes(t, true)
	paramBytes := 4 * (64*128 + 128 + 128*32 + 32 + 32*10 + 10)
	t.Logf("bytes allocated per step: plain %.0f, DDP on 1 rank %.0f (parameters: %d bytes)", plain, withDDP, paramBytes)
	// Cloning the values in the hooks would add 2x the parameter bytes.
	require.Less(t, withDDP-plain, 0.25*float64(paramBytes), "DDP allocates per step in proportion to the model")
}

// BenchmarkStep times a training step of the MNIST MLP (784-256-128-10,
// f32, batch 64) in one process, plain and with the DDP on one rank: the
// difference is the DDP's own CPU cost per step.
//
//	go test -run X -bench Step -benchmem -count 5 ./dist/ddp
func BenchmarkStep(b *testing.B) {
	for _, withDDP := range []bool{false, true} {
		name := "plain"
		if withDDP {
			name = "ddp-1rank"
		}
		b.Run(name, func(b *testing.B) {
			step := newStep(b, withDDP, []int{784, 256, 128, 10}, 64)
			step()
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				step()
			}
		})
	}
}

// TestHookGradInPlace: the compiler gives every gradient hook its input's
// register (a parameter's gradient feeds only its hook), so the machine
// calls UnsafeDo and the gradients are not copied once more per pass.
func TestHookGradInPlace(t *testing.T) {
	sizes := []int{16, 8, 4}
	vm, step := buildStep(t, true, sizes, 2)
	step() // and it trains
	prog := fmt.Sprint(reflect.ValueOf(vm).MethodByName("Prog").Call(nil)[0].Interface())
	hooks := map[string]bool{} // the program lists its instructions twice
	for _, line := range strings.Split(prog, "\n") {
		f := strings.Split(strings.TrimSpace(line), "\t")
		for i, field := range f {
			if !strings.HasPrefix(field, "DDPHookGrad(") || i+2 >= len(f) {
				continue
			}
			hooks[field] = true
			assert.Equal(t, "["+f[i+2]+"]", f[i+1], "%s does not write its input's register: %s", field, line)
		}
	}
	require.Len(t, hooks, 2*(len(sizes)-1), "hook gradient ops in the program:\n%s", prog)
}
