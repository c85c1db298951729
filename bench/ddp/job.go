package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"runtime/trace"
	"sync"
	"time"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/ddp"
	"github.com/gdist/gdist/internal/benchutil"
	"github.com/gdist/gdist/internal/rawtcp"
	"github.com/gdist/gdist/models/mlp"
)

// job is one measured configuration, handed to every rank (as JSON in the
// environment when ranks are processes).
type job struct {
	Name           string  `json:"name"`
	Sizes          []int   `json:"sizes"`
	Batch          int     `json:"batch"` // per rank
	Steps          int     `json:"steps"` // timed steps
	Warmup         int     `json:"warmup"`
	Plain          bool    `json:"plain"`            // no DDP: a plain Gorgonia training loop (world size 1)
	NoOverlap      bool    `json:"no_overlap"`       // ddp.WithOverlap(false)
	Upfront        bool    `json:"upfront"`          // hooks for all parameters before the forward pass (ddp.Hooked)
	BucketCap      int     `json:"bucket_cap"`       // bytes; 0: ddp's default
	FirstBucketCap int     `json:"first_bucket_cap"` // bytes; 0: ddp's default
	Compress       string  `json:"compress"`         // "", "f16", "bf16"
	LinkMBps       float64 `json:"link_mbps"`        // outgoing bandwidth per rank in MB/s; 0: unlimited
	Raw            bool    `json:"raw"`              // also measure the raw-socket baseline (TCP, 2 ranks)
	CPUProfile     string  `json:"cpu_profile"`      // write a CPU profile of the timed steps here
	SocketBuffer   int     `json:"socket_buffer"`    // tcp.WithSocketBuffer; 0: kernel auto-tuning
	Trace          string  `json:"trace"`            // write an execution trace of the timed steps here
	Small          *int    `json:"small,omitempty"`  // dist.WithSmallThreshold; nil: the default
	Transport      string  `json:"transport"`        // tcp (or ""), shm or auto: see validTransports
}

// outcome is what one rank measured.
type outcome struct {
	Rank    int     `json:"rank"`
	World   int     `json:"world"`
	Procs   int     `json:"procs"` // GOMAXPROCS
	Steps   int     `json:"steps"`
	Elapsed float64 `json:"elapsed"` // seconds for the timed steps
	CPU     float64 `json:"cpu"`     // CPU seconds the process used during them
	// Sums over the timed steps, in seconds.
	Compute float64         `json:"compute"` // forward + backward (DDP's Stats.Compute; RunAll when plain)
	Comm    float64         `json:"comm"`
	Exposed float64         `json:"exposed"`
	Buckets int             `json:"buckets"`
	Bytes   int64           `json:"bytes"` // all-reduced bytes per step
	Params  int             `json:"params"`
	Raw     *rawtcp.Figures `json:"raw,omitempty"`
	// Transport is the Go type of the transport the group ran over.
	Transport string `json:"transport"`
}

// perStep returns a per-step mean in milliseconds.
func (o outcome) perStep(sec float64) float64 { return 1e3 * sec / float64(max(o.Steps, 1)) }

// graphMu serialises Gorgonia graph construction.
var graphMu sync.Mutex

// runJob builds the job's model on pg, trains it on synthetic data for
// Warmup+Steps steps and reports the timed steps.
func runJob(ctx context.Context, pg *dist.ProcessGroup, j job) (outcome, error) {
	o := outcome{Rank: pg.Rank(), World: pg.WorldSize(), Steps: j.Steps}
	if j.Plain && pg.WorldSize() != 1 {
		return o, errors.New("bench: a plain (no DDP) job needs a world of one")
	}
	if len(j.Sizes) < 2 || j.Batch < 1 || j.Steps < 1 || j.Warmup < 0 {
		return o, fmt.Errorf("bench: bad job %+v", j)
	}
	// Graph construction touches Gorgonia's globals: tests run several
	// ranks in one process. Wrap, a collective, runs outside the lock.
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
	var d *ddp.DDP
	if !j.Plain {
		opts := []ddp.Option{ddp.WithOverlap(!j.NoOverlap)}
		if j.BucketCap > 0 {
			opts = append(opts, ddp.WithBucketCap(j.BucketCap))
		}
		if j.FirstBucketCap > 0 {
			opts = append(opts, ddp.WithFirstBucketCap(j.FirstBucketCap))
		}
		switch j.Compress {
		case "":
		case "f16":
			opts = append(opts, ddp.WithCompression(dist.Float16))
		case "bf16":
			opts = append(opts, ddp.WithCompression(dist.BFloat16))
		default:
			return o, fmt.Errorf("bench: compression %q", j.Compress)
		}
		if d, err = ddp.Wrap(ctx, pg, params, opts...); err != nil {
			return o, err
		}
		o.Buckets = len(d.Buckets())
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
		var logits *gorgonia.Node
		var err error
		switch {
		case j.Plain:
			logits, err = m.Forward(x)
		case j.Upfront:
			var hooked gorgonia.Nodes
			if hooked, err = d.Hooked(); err == nil {
				logits, err = m.ForwardWith(x, hooked)
			}
		default:
			logits, err = m.ForwardHooked(x, d.Hook) // at the point of use
		}
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
		return gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(params...)), nil
	}()
	if err != nil {
		return o, err
	}
	defer vm.Close()
	var solver gorgonia.Solver = gorgonia.NewAdamSolver(gorgonia.WithLearnRate(1e-3))
	if d != nil {
		solver = d.Solver(solver)
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

	var stopProfile func()
	var start time.Time
	var cpu0 time.Duration
	for i := range j.Warmup + j.Steps {
		if i == j.Warmup {
			if err := pg.Barrier(ctx); err != nil {
				return o, err
			}
			if j.CPUProfile != "" {
				f, err := os.Create(j.CPUProfile)
				if err != nil {
					return o, err
				}
				if err := pprof.StartCPUProfile(f); err != nil {
					f.Close()
					return o, err
				}
				stopProfile = func() { pprof.StopCPUProfile(); f.Close() }
			}
			if j.Trace != "" {
				f, err := os.Create(j.Trace)
				if err != nil {
					return o, err
				}
				if err := trace.Start(f); err != nil {
					f.Close()
					return o, err
				}
				prev := stopProfile
				stopProfile = func() {
					trace.Stop()
					f.Close()
					if prev != nil {
						prev()
					}
				}
			}
			start, cpu0 = time.Now(), benchutil.CPUTime()
		}
		if err := ctx.Err(); err != nil {
			return o, err
		}
		copy(xs, bx[i%nb])
		copy(ys, by[i%nb])
		t0 := time.Now()
		if err := vm.RunAll(); err != nil {
			if d != nil && d.Err() != nil {
				return o, d.Err()
			}
			return o, err
		}
		runAll := time.Since(t0)
		if err := solver.Step(gorgonia.NodesToValueGrads(params)); err != nil {
			return o, err
		}
		vm.Reset()
		if i < j.Warmup {
			continue
		}
		if d == nil {
			o.Compute += runAll.Seconds()
			continue
		}
		st := d.Stats()
		o.Compute += st.Compute.Seconds()
		o.Comm += st.Comm.Seconds()
		o.Exposed += st.Exposed.Seconds()
		o.Bytes = st.Bytes
	}
	o.Elapsed = time.Since(start).Seconds()
	o.CPU = (benchutil.CPUTime() - cpu0).Seconds()
	if stopProfile != nil {
		stopProfile()
	}

	if j.Raw && pg.WorldSize() == 2 {
		bytes := o.Bytes
		if bytes == 0 {
			bytes = int64(4 * o.Params)
		}
		r, err := rawBaseline(ctx, pg, int(bytes))
		if err != nil {
			return o, fmt.Errorf("bench: raw-socket baseline: %w", err)
		}
		o.Raw = r
	}
	return o, nil
}
