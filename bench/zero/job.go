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
	"github.com/gdist/gdist/models/mlp"
	"github.com/gdist/gdist/train/optim"
)

// modes are the ways the ranks hold the training state.
var modes = []string{"ddp", "zero1", "zero2", "full"}

// job is one measured configuration, handed to every rank as JSON.
type job struct {
	Mode      string `json:"mode"` // one of modes
	Sizes     []int  `json:"sizes"`
	Batch     int    `json:"batch"` // per rank
	Steps     int    `json:"steps"` // timed (or probed) steps
	Warmup    int    `json:"warmup"`
	BucketCap int    `json:"bucket_cap"` // DDP and ZeRO bucket cap in bytes; 0: ddp's defaults
	// Probe measures memory: a garbage collection and a heap reading after
	// every forward-backward pass and every step (not timed).
	Probe     bool   `json:"probe"`
	Transport string `json:"transport"`
}

// outcome is what one rank measured. Bytes are counted from the tensors
// and buffers the rank holds after its last step.
type outcome struct {
	Rank    int     `json:"rank"`
	World   int     `json:"world"`
	Steps   int     `json:"steps"`
	Elapsed float64 `json:"elapsed"` // seconds for the timed steps
	Params  int     `json:"params"`  // elements of the model
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
	// pass or a step (Probe only).
	PeakHeap uint64
}

// graphMu serialises Gorgonia graph construction (tests run ranks in one
// process).
var graphMu sync.Mutex

// runJob builds the job's MLP on pg under the job's mode, trains it on
// synthetic data for Warmup+Steps steps and measures.
func runJob(ctx context.Context, pg *dist.ProcessGroup, j job) (outcome, error) {
	o := outcome{Rank: pg.Rank(), World: pg.WorldSize(), Steps: j.Steps}
	if len(j.Sizes) < 2 || j.Batch < 1 || j.Steps < 1 || j.Warmup < 0 {
		return o, fmt.Errorf("bench: bad job %+v", j)
	}
	graphMu.Lock()
	g := gorgonia.NewGraph()
	m, err := mlp.New(g, mlp.Config{Sizes: j.Sizes, Batch: j.Batch, Seed: 1})
	graphMu.Unlock()
	if err != nil {
		return o, err
	}
	params := m.Learnables()
	for _, p := range params {
		o.Params += p.Shape().TotalSize()
	}
	var (
		d      *ddp.DDP
		f      *fsdp.FSDP
		hook   func(*gorgonia.Node) (*gorgonia.Node, error)
		failed func() error
	)
	switch j.Mode {
	case "full":
		var units []gorgonia.Nodes
		for l := 0; l+1 < len(params); l += 2 {
			units = append(units, params[l:l+2])
		}
		if f, err = fsdp.Wrap(ctx, pg, units); err != nil {
			return o, err
		}
		defer f.Close()
		hook, failed = f.Hook, f.Err
	case "ddp", "zero1", "zero2":
		opts := []ddp.Option{ddp.WithZeRO(map[string]int{"ddp": 0, "zero1": 1, "zero2": 2}[j.Mode])}
		if j.BucketCap > 0 {
			opts = append(opts, ddp.WithBucketCap(j.BucketCap), ddp.WithFirstBucketCap(min(j.BucketCap, ddp.DefaultFirstBucketCap)))
		}
		if d, err = ddp.Wrap(ctx, pg, params, opts...); err != nil {
			return o, err
		}
		defer d.Close()
		hook, failed = d.Hook, d.Err
	default:
		return o, fmt.Errorf("bench: mode %q", j.Mode)
	}

	in, classes := j.Sizes[0], j.Sizes[len(j.Sizes)-1]
	xs := make([]float32, j.Batch*in)
	ys := make([]float32, j.Batch*classes)
	vm, err := func() (gorgonia.VM, error) {
		graphMu.Lock()
		defer graphMu.Unlock()
		x, y := m.NewInputs()
		if err := gorgonia.Let(x, tensor.New(tensor.WithShape(j.Batch, in), tensor.WithBacking(xs))); err != nil {
			return nil, err
		}
		if err := gorgonia.Let(y, tensor.New(tensor.WithShape(j.Batch, classes), tensor.WithBacking(ys))); err != nil {
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
		if _, err := gorgonia.Grad(loss, params...); err != nil {
			return nil, err
		}
		// Only plain DDP hands the solver the parameters' dual values.
		if j.Mode == "ddp" {
			return gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(params...)), nil
		}
		return gorgonia.NewTapeMachine(g), nil
	}()
	if err != nil {
		return o, err
	}
	defer vm.Close()
	adam, err := optim.NewAdam(optim.WithLearnRate(1e-3))
	if err != nil {
		return o, err
	}
	var solver gorgonia.Solver
	if f != nil {
		solver = f.Solver(adam)
	} else {
		solver = d.Solver(adam)
	}

	// Synthetic data: a few fixed random batches, different on every rank.
	const nb = 8
	rng := rand.New(rand.NewPCG(uint64(pg.Rank()), 7))
	bx := make([][]float32, nb)
	by := make([][]float32, nb)
	for k := range nb {
		bx[k] = make([]float32, len(xs))
		for i := range bx[k] {
			bx[k][i] = rng.Float32()
		}
		by[k] = make([]float32, len(ys))
		for r := range j.Batch {
			by[k][r*classes+rng.IntN(classes)] = 1
		}
	}
	probe := func() {
		if !j.Probe {
			return
		}
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		o.PeakHeap = max(o.PeakHeap, ms.HeapAlloc)
	}
	var start time.Time
	for i := range j.Warmup + j.Steps {
		if i == j.Warmup {
			if err := pg.Barrier(ctx); err != nil {
				return o, err
			}
			start = time.Now()
		}
		if err := ctx.Err(); err != nil {
			return o, err
		}
		copy(xs, bx[i%nb])
		copy(ys, by[i%nb])
		if err := vm.RunAll(); err != nil {
			if ferr := failed(); ferr != nil {
				return o, ferr
			}
			return o, err
		}
		probe()
		if i == j.Warmup+j.Steps-1 {
			o.MachineGradBytes = machineGrads(params)
		}
		if err := solver.Step(gorgonia.NodesToValueGrads(params)); err != nil {
			return o, err
		}
		vm.Reset()
		probe()
	}
	o.Elapsed = time.Since(start).Seconds()

	for _, p := range adam.State().Params {
		for _, s := range p.Slots {
			o.OptBytes += int64(4*len(s.F32) + 8*len(s.F64))
		}
	}
	if f != nil {
		mem := f.Memory()
		o.ParamBytes, o.GatheredBytes = mem.ParamShards, mem.Gathered
		o.GradBytes, o.BucketBytes = mem.GradShards, mem.Staged
		return o, nil
	}
	mem := d.Memory()
	o.BucketBytes = mem.Buckets
	o.GradBytes = mem.Shards
	for _, p := range params {
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
