package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"time"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/ddp"
	"github.com/gdist/gdist/dist/fsdp"
	"github.com/gdist/gdist/internal/benchutil"
	"github.com/gdist/gdist/models/mlp"
	"github.com/gdist/gdist/train/optim"
)

// modes are the ways the ranks hold the training state.
var modes = []string{"ddp", "zero1", "zero2", "full"}

// job is one measured configuration, handed to every rank as JSON.
type job struct {
	// Mode is the mode whose memory is measured (one of modes); Modes are
	// the modes whose step times are compared (Rounds > 0).
	Mode      string   `json:"mode"`
	Modes     []string `json:"modes"`
	Sizes     []int    `json:"sizes"`
	Batch     int      `json:"batch"` // per rank
	Steps     int      `json:"steps"` // memory: steps probed
	Rounds    int      `json:"rounds"`
	Warmup    int      `json:"warmup"`     // time: untimed steps of every mode first
	BucketCap int      `json:"bucket_cap"` // DDP and ZeRO bucket cap in bytes; 0: ddp's defaults
	// NoPrefetch is fsdp.WithPrefetch(false) for full sharding.
	NoPrefetch bool   `json:"no_prefetch"`
	Transport  string `json:"transport"`
}

// outcome is what one rank measured. Bytes are counted from the tensors
// and buffers the rank holds after its last step.
type outcome struct {
	Rank   int `json:"rank"`
	World  int `json:"world"`
	Params int `json:"params"` // elements of the model
	// Params is the parameter values held: the model's tensors (DDP,
	// ZeRO) or this rank's pieces (full sharding); Gathered the gather
	// buffers of full sharding.
	ParamBytes, GatheredBytes int64
	// GradBytes is the gradient the solver reads: the parameters' dual
	// values (DDP) or this rank's averaged pieces (ZeRO, full sharding);
	// BucketBytes the bucket buffers (DDP, ZeRO-1) or the two staging
	// buffers (ZeRO-2, full sharding).
	GradBytes, BucketBytes int64
	// OptBytes is the solver's state (Adam's moments), from its tensors.
	OptBytes int64
	// MachineGradBytes is the parameter gradients the TapeMachine holds as
	// node values (Gorgonia's registers), whatever the mode.
	MachineGradBytes int64
	// PeakHeap is the largest live heap (after a collection) seen after a
	// pass or a step.
	PeakHeap uint64
	// Wall and CPU are, per mode of a time job, every round's step time
	// and the CPU time the process used during it, in milliseconds.
	Wall, CPU map[string][]float64
}

// graphMu serialises Gorgonia graph construction (tests run ranks in one
// process).
var graphMu sync.Mutex

// trainer is one mode's MLP on a rank: its wrapper, machine and solver.
type trainer struct {
	mode   string
	params gorgonia.Nodes
	d      *ddp.DDP
	f      *fsdp.FSDP
	vm     gorgonia.VM
	adam   *optim.Adam
	solver gorgonia.Solver
	xs, ys []float32
	bx, by [][]float32 // a few fixed random batches, different on every rank
	n      int         // steps taken
}

// newTrainer builds the MLP of sizes under mode on pg. Close it.
func newTrainer(ctx context.Context, pg *dist.ProcessGroup, mode string, sizes []int, batch, bucketCap int, noPrefetch bool) (_ *trainer, err error) {
	if len(sizes) < 2 || batch < 1 {
		return nil, fmt.Errorf("bench: bad model %v, batch %d", sizes, batch)
	}
	graphMu.Lock()
	g := gorgonia.NewGraph()
	m, err := mlp.New(g, mlp.Config{Sizes: sizes, Batch: batch, Seed: 1})
	graphMu.Unlock()
	if err != nil {
		return nil, err
	}
	t := &trainer{mode: mode, params: m.Learnables()}
	defer func() {
		if err != nil {
			t.close()
		}
	}()
	var hook func(*gorgonia.Node) (*gorgonia.Node, error)
	switch mode {
	case "full":
		var units []gorgonia.Nodes
		for l := 0; l+1 < len(t.params); l += 2 {
			units = append(units, t.params[l:l+2])
		}
		if t.f, err = fsdp.Wrap(ctx, pg, units, fsdp.WithPrefetch(!noPrefetch)); err != nil {
			return nil, err
		}
		hook = t.f.Hook
	case "ddp", "zero1", "zero2":
		opts := []ddp.Option{ddp.WithZeRO(map[string]int{"ddp": 0, "zero1": 1, "zero2": 2}[mode])}
		if bucketCap > 0 {
			opts = append(opts, ddp.WithBucketCap(bucketCap), ddp.WithFirstBucketCap(min(bucketCap, ddp.DefaultFirstBucketCap)))
		}
		if t.d, err = ddp.Wrap(ctx, pg, t.params, opts...); err != nil {
			return nil, err
		}
		hook = t.d.Hook
	default:
		return nil, fmt.Errorf("bench: mode %q", mode)
	}
	in, classes := sizes[0], sizes[len(sizes)-1]
	t.xs, t.ys = make([]float32, batch*in), make([]float32, batch*classes)
	graphMu.Lock()
	t.vm, err = t.build(g, m, hook, batch, in, classes)
	graphMu.Unlock()
	if err != nil {
		return nil, err
	}
	if t.adam, err = optim.NewAdam(optim.WithLearnRate(1e-3)); err != nil {
		return nil, err
	}
	if t.f != nil {
		t.solver = t.f.Solver(t.adam)
	} else {
		t.solver = t.d.Solver(t.adam)
	}
	const nb = 8
	rng := rand.New(rand.NewPCG(uint64(pg.Rank()), 7))
	for range nb {
		x := make([]float32, len(t.xs))
		for i := range x {
			x[i] = rng.Float32()
		}
		y := make([]float32, len(t.ys))
		for r := range batch {
			y[r*classes+rng.IntN(classes)] = 1
		}
		t.bx, t.by = append(t.bx, x), append(t.by, y)
	}
	return t, nil
}

// build adds the forward pass, the loss and the gradients to g and returns
// the machine. graphMu is held.
func (t *trainer) build(g *gorgonia.ExprGraph, m *mlp.Model, hook func(*gorgonia.Node) (*gorgonia.Node, error), batch, in, classes int) (gorgonia.VM, error) {
	x, y := m.NewInputs()
	if err := gorgonia.Let(x, tensor.New(tensor.WithShape(batch, in), tensor.WithBacking(t.xs))); err != nil {
		return nil, err
	}
	if err := gorgonia.Let(y, tensor.New(tensor.WithShape(batch, classes), tensor.WithBacking(t.ys))); err != nil {
		return nil, err
	}
	logits, err := m.ForwardHooked(x, hook)
	if err != nil {
		return nil, err
	}
	loss, err := mlp.Loss(logits, y)
	if err != nil {
		return nil, err
	}
	if _, err := gorgonia.Grad(loss, t.params...); err != nil {
		return nil, err
	}
	// Only plain DDP hands the solver the parameters' dual values.
	if t.mode == "ddp" {
		return gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(t.params...)), nil
	}
	return gorgonia.NewTapeMachine(g), nil
}

// pass runs a forward and backward pass on the next batch.
func (t *trainer) pass() error {
	copy(t.xs, t.bx[t.n%len(t.bx)])
	copy(t.ys, t.by[t.n%len(t.by)])
	t.n++
	if err := t.vm.RunAll(); err != nil {
		if t.d != nil && t.d.Err() != nil {
			return t.d.Err()
		}
		if t.f != nil && t.f.Err() != nil {
			return t.f.Err()
		}
		return err
	}
	return nil
}

// update steps the solver after a pass.
func (t *trainer) update() error {
	defer t.vm.Reset()
	return t.solver.Step(gorgonia.NodesToValueGrads(t.params))
}

func (t *trainer) close() {
	if t.vm != nil {
		t.vm.Close()
	}
	if t.d != nil {
		t.d.Close()
	}
	if t.f != nil {
		t.f.Close()
	}
}

// runJob runs j on pg: a memory measurement of j.Mode, or with j.Rounds a
// comparison of the step times of j.Modes.
func runJob(ctx context.Context, pg *dist.ProcessGroup, j job) (outcome, error) {
	if j.Rounds > 0 {
		return timeJob(ctx, pg, j)
	}
	o := outcome{Rank: pg.Rank(), World: pg.WorldSize()}
	if j.Steps < 1 {
		return o, fmt.Errorf("bench: %d steps", j.Steps)
	}
	t, err := newTrainer(ctx, pg, j.Mode, j.Sizes, j.Batch, j.BucketCap, j.NoPrefetch)
	if err != nil {
		return o, err
	}
	defer t.close()
	for _, p := range t.params {
		o.Params += p.Shape().TotalSize()
	}
	probe := func() {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		o.PeakHeap = max(o.PeakHeap, ms.HeapAlloc)
	}
	for i := range j.Steps {
		if err := t.pass(); err != nil {
			return o, err
		}
		probe()
		if i == j.Steps-1 {
			o.MachineGradBytes = machineGrads(t.params)
		}
		if err := t.update(); err != nil {
			return o, err
		}
		probe()
	}
	for _, p := range t.adam.State().Params {
		for _, s := range p.Slots {
			o.OptBytes += int64(4*len(s.F32) + 8*len(s.F64))
		}
	}
	if t.f != nil {
		mem := t.f.Memory()
		o.ParamBytes, o.GatheredBytes = mem.ParamShards, mem.Gathered
		o.GradBytes, o.BucketBytes = mem.GradShards, mem.Staged
		return o, nil
	}
	mem := t.d.Memory()
	o.BucketBytes = mem.Buckets
	o.GradBytes = mem.Shards
	for _, p := range t.params {
		o.ParamBytes += valueBytes(p.Value())
		if j.Mode == "ddp" {
			g, err := p.Grad()
			if err != nil {
				return o, err
			}
			o.GradBytes += valueBytes(g)
		}
	}
	return o, nil
}

// timeJob builds the model under every mode of j.Modes on pg and times
// their steps in rounds, each round one step of every mode (in an order
// that rotates from round to round), each step started by a barrier: the
// modes' steps of a round run seconds apart at most, under the same load.
func timeJob(ctx context.Context, pg *dist.ProcessGroup, j job) (outcome, error) {
	o := outcome{Rank: pg.Rank(), World: pg.WorldSize(), Wall: map[string][]float64{}, CPU: map[string][]float64{}}
	var ts []*trainer
	defer func() {
		for _, t := range ts {
			t.close()
		}
	}()
	for _, mode := range j.Modes {
		t, err := newTrainer(ctx, pg, mode, j.Sizes, j.Batch, j.BucketCap, j.NoPrefetch)
		if err != nil {
			return o, err
		}
		ts = append(ts, t)
	}
	step := func(t *trainer) error {
		if err := t.pass(); err != nil {
			return err
		}
		return t.update()
	}
	for _, t := range ts {
		for range j.Warmup {
			if err := step(t); err != nil {
				return o, err
			}
		}
	}
	for r := range j.Rounds {
		for k := range ts {
			t := ts[(k+r)%len(ts)]
			if err := pg.Barrier(ctx); err != nil {
				return o, err
			}
			t0, c0 := time.Now(), benchutil.CPUTime()
			if err := step(t); err != nil {
				return o, fmt.Errorf("%s: %w", t.mode, err)
			}
			o.Wall[t.mode] = append(o.Wall[t.mode], float64(time.Since(t0))/1e6)
			o.CPU[t.mode] = append(o.CPU[t.mode], float64(benchutil.CPUTime()-c0)/1e6)
		}
	}
	return o, nil
}

// valueBytes is the size of a float32 or float64 tensor's data.
func valueBytes(v gorgonia.Value) int64 {
	if t, ok := v.(tensor.Tensor); ok {
		return int64(t.DataSize() * int(t.Dtype().Size()))
	}
	return int64(v.Dtype().Size())
}

// machineGrads is the bytes of the parameters' gradient node values after
// a pass (each backing array once): what Gorgonia's TapeMachine keeps.
func machineGrads(params gorgonia.Nodes) int64 {
	seen := make(map[uintptr]bool)
	var n int64
	for _, p := range params {
		dn := p.Deriv()
		if dn == nil || dn.Value() == nil {
			continue
		}
		t, ok := dn.Value().(tensor.Tensor)
		if !ok || t.DataSize() == 0 {
			continue
		}
		ptr := t.Uintptr()
		if !seen[ptr] {
			seen[ptr] = true
			n += valueBytes(t)
		}
	}
	return n
}
