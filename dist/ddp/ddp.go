package ddp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/internal/shard"
)

// This file holds the DDP's lifetime: Wrap, the initial broadcast, the
// accessors, its error state and Close. Bucket layout is in bucket.go, the
// hooks in hook.go, the launch of all-reduces during backprop in launch.go
// and the wait for them in sync.go.

// Errors of package ddp. Errors raised while a machine runs (in a hook op)
// reach RunAll wrapped by Gorgonia, which does not support errors.Is; the
// DDP keeps the first such error and Sync (and Solver.Step) return it
// matchably.
var (
	// ErrNotParam is returned for a node that is not one of the wrapped
	// parameters.
	ErrNotParam = errors.New("ddp: node is not a wrapped parameter")
	// ErrNotHooked is returned by Sync when a parameter receives gradient
	// that did not flow through its hook (it was used in the forward pass
	// directly, at least once): that gradient would not be averaged and the
	// ranks would drift apart.
	ErrNotHooked = errors.New("ddp: parameter used without its hook")
	// ErrNoGradients is returned by Sync when no backward pass ran since the
	// last Sync.
	ErrNoGradients = errors.New("ddp: no backward pass since the last sync")
	// ErrIncompletePass is returned by Sync when a backward pass produced only
	// some of the gradients (a run failed half way).
	ErrIncompletePass = errors.New("ddp: backward pass incomplete")
	// ErrSyncPending is returned when a backward pass starts while the
	// gradients of an earlier, synchronised pass are still waiting for Sync
	// (or Solver.Step). To accumulate gradients over several passes, run all
	// but the last with SetSync(false), or use WithAccumulation.
	ErrSyncPending = errors.New("ddp: backward pass started before the previous gradients were synchronised")
	// ErrDuplicateGradient is returned when a parameter's gradient arrives
	// twice in one backward pass (for example two machines running one graph).
	ErrDuplicateGradient = errors.New("ddp: gradient produced twice in one backward pass")
	// ErrClosed is returned by every call of a closed DDP (Hook, Sync,
	// Solver.Step) and reaches RunAll from a backward pass through its
	// hooks. It wraps dist.ErrClosed, so either sentinel matches.
	ErrClosed = fmt.Errorf("ddp: closed: %w", dist.ErrClosed)
	// ErrUnsupported is returned for a use the DDP's mode does not support,
	// such as accumulating gradients (SetSync(false)) under ZeRO-2.
	ErrUnsupported = errors.New("ddp: not supported in this mode")
)

// ddpIDs numbers DDP instances so that their hook ops hash differently.
var ddpIDs atomic.Uint64

// DDP is a data-parallel wrapper around a model's parameters: it keeps every
// rank's parameters identical by averaging their gradients over the ranks
// before each optimiser step. See the package documentation.
//
// A DDP serves one TapeMachine running one graph; its methods are safe to
// call from any goroutine. Close it when training ends, before the group.
type DDP struct {
	pg     *dist.ProcessGroup
	id     uint64
	cfg    config
	params gorgonia.Nodes
	index  map[*gorgonia.Node]int
	slots  []slot // per parameter: where its gradient lives
	bkts   []*bucket

	mu sync.Mutex
	// Guarded by mu.
	hooks         gorgonia.Nodes // forward hook nodes, nil until created
	gradNodes     gorgonia.Nodes // the hooks' gradient nodes, nil until created
	firstHook     int            // index of the first hook created, or -1
	nGrad         int            // parameters with a gradient node
	ready         []bool         // gradient of this pass has arrived
	nReady        int
	passStart     time.Time // first forward hook of the current pass
	syncPass      bool      // this pass is synchronised (not SetSync(false), last of an accumulation cycle)
	launchNow     bool      // this pass launches buckets during backprop
	syncedPending bool      // a synchronised pass completed; Sync has not run yet
	passes        int       // completed backward passes since the last Sync
	nextLaunch    int       // buckets [0, nextLaunch) are launched
	sync          bool      // SetSync
	stepCalls     int       // Solver.Step calls skipped in this accumulation cycle
	err           error     // first hard failure; sticks
	closed        bool      // Close has begun
	cur           Stats     // being accumulated
	last          Stats     // of the last Sync
	trace         func(ev event)
	gradNorm      float64 // of the last Sync, before clipping (WithMaxGradNorm)

	// ZeRO (zero.go). segs is fixed at Wrap; views and viewBase are
	// guarded by mu.
	segs     []segment
	views    []gorgonia.ValueGrad
	viewBase []uintptr
	stages   [2]staging

	closeOnce sync.Once
	closeErr  error
}

// event is what the trace hook of tests sees.
type event struct {
	kind   string // "forward", "grad", "launch", "pass"
	param  int
	bucket int
	at     time.Time
}

// Wrap prepares params (a model's learnable nodes, all in one graph, Float32
// or Float64, with values bound) for data-parallel training on pg and
// broadcasts their values from rank 0, so that every rank starts from the
// same model. Every rank must call Wrap with the same parameters (shapes and
// order) and options. It blocks until the broadcast is done or ctx ends.
//
// params is copied; the nodes stay the caller's. Use Hook for every use of a
// parameter in the forward pass.
func Wrap(ctx context.Context, pg *dist.ProcessGroup, params gorgonia.Nodes, opts ...Option) (*DDP, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if pg == nil {
		return nil, fmt.Errorf("ddp: nil process group: %w", dist.ErrInvalidArgument)
	}
	if len(params) == 0 {
		return nil, fmt.Errorf("ddp: no parameters: %w", dist.ErrInvalidArgument)
	}
	d := &DDP{
		pg:        pg,
		id:        ddpIDs.Add(1),
		cfg:       cfg,
		params:    append(gorgonia.Nodes(nil), params...),
		index:     make(map[*gorgonia.Node]int, len(params)),
		slots:     make([]slot, len(params)),
		hooks:     make(gorgonia.Nodes, len(params)),
		gradNodes: make(gorgonia.Nodes, len(params)),
		ready:     make([]bool, len(params)),
		firstHook: -1,
		sync:      true,
	}
	for i, p := range d.params {
		if err := checkParam(p, d.params[0]); err != nil {
			return nil, fmt.Errorf("ddp: parameter %d: %w", i, err)
		}
		if _, dup := d.index[p]; dup {
			return nil, fmt.Errorf("ddp: parameter %d (%s) appears twice: %w", i, p.Name(), dist.ErrInvalidArgument)
		}
		d.index[p] = i
	}
	d.buildBuckets()
	if err := d.broadcast(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

func checkParam(p, first *gorgonia.Node) error {
	switch {
	case p == nil:
		return fmt.Errorf("nil node: %w", dist.ErrInvalidArgument)
	case !p.IsVar():
		return fmt.Errorf("%s is not an input (variable) node: %w", p.Name(), dist.ErrInvalidArgument)
	case p.Graph() != first.Graph():
		return fmt.Errorf("%s is in another graph than %s: %w", p.Name(), first.Name(), dist.ErrInvalidArgument)
	case p.Dtype() != tensor.Float32 && p.Dtype() != tensor.Float64:
		return fmt.Errorf("%s is %v: %w", p.Name(), p.Dtype(), dist.ErrUnsupportedDType)
	case p.Value() == nil:
		return fmt.Errorf("%s has no value (create it with gorgonia.WithValue or WithInit): %w", p.Name(), dist.ErrInvalidArgument)
	}
	f32, f64, err := shard.Floats(p.Value())
	if err != nil {
		return fmt.Errorf("%s: %w", p.Name(), err)
	}
	if len(f32)+len(f64) != p.Shape().TotalSize() && !(p.IsScalar() && len(f32)+len(f64) == 1) {
		return fmt.Errorf("%s: value has %d elements, shape %v: %w", p.Name(), len(f32)+len(f64), p.Shape(), dist.ErrInvalidArgument)
	}
	return nil
}

// broadcast copies rank 0's parameter values to every rank, one collective
// per bucket.
func (d *DDP) broadcast(ctx context.Context) error {
	for bi, b := range d.bkts {
		if d.cfg.zero > 0 {
			if err := d.acquireLocked(b, true); err != nil {
				return err
			}
		}
		for _, i := range b.params {
			if err := d.copyParam(i, b, true); err != nil {
				return err
			}
		}
		var err error
		if b.dt == tensor.Float32 {
			err = d.pg.Broadcast(ctx, dist.F32(b.f32), 0)
		} else {
			err = d.pg.Broadcast(ctx, dist.F64(b.f64), 0)
		}
		if err != nil {
			return fmt.Errorf("ddp: broadcast of bucket %d: %w", bi, err)
		}
		for _, i := range b.params {
			if err := d.copyParam(i, b, false); err != nil {
				return err
			}
		}
		clear(b.f32)
		clear(b.f64)
		if b.stage != nil {
			b.stage.user = nil // free for the next bucket
		}
	}
	return nil
}

// Params returns the wrapped parameters in the order given to Wrap. The
// slice is new; the nodes are the caller's.
func (d *DDP) Params() gorgonia.Nodes { return append(gorgonia.Nodes(nil), d.params...) }

// Buckets returns the parameter indices of every bucket, in all-reduce
// order: bucket 0 holds the last parameters. The slices are new.
func (d *DDP) Buckets() [][]int {
	out := make([][]int, len(d.bkts))
	for i, b := range d.bkts {
		out[i] = append([]int(nil), b.params...)
	}
	return out
}

// ProcessGroup returns the group the DDP communicates on.
func (d *DDP) ProcessGroup() *dist.ProcessGroup { return d.pg }

// SetSync turns gradient synchronisation of the following backward passes on
// (the default) or off, like PyTorch's no_sync. Passes run with sync off only
// add their gradients into the DDP's buffers; the next synchronised pass (or
// Sync) all-reduces the sum. As with Gorgonia's own accumulation of
// gradients over several RunAll calls, the gradients of the passes are
// summed, not averaged (over ranks they are averaged). The setting is read
// when a backward pass starts.
func (d *DDP) SetSync(on bool) {
	d.mu.Lock()
	d.sync = on
	d.mu.Unlock()
}

// Err returns the first error that broke the DDP (a failed all-reduce, a
// misuse detected while a machine ran), or nil. Once set, every later Sync
// and Step return it.
func (d *DDP) Err() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.err
}

// failLocked records err as the DDP's error if it is the first one.
func (d *DDP) failLocked(err error) error {
	if d.err == nil {
		d.err = err
	}
	return d.err
}

func (d *DDP) emitLocked(kind string, param, bucket int, at time.Time) {
	if d.trace != nil {
		d.trace(event{kind: kind, param: param, bucket: bucket, at: at})
	}
}

// Close releases the DDP. It waits for the bucket all-reduces in flight —
// each bounded like every collective the DDP starts, by the group's timeout
// (dist.WithTimeout), or ended sooner if the group is aborted or closed —
// and then drops the DDP's gradient buffers. From the moment Close is
// called, Hook, Hooked, Sync and Solver.Step fail with an error matching
// ErrClosed (and dist.ErrClosed), as does a backward pass through the
// DDP's hooks, and no further all-reduce starts.
//
// Close returns the error of an in-flight all-reduce that failed, else
// nil. It does not close the ProcessGroup, which stays the caller's. It is
// idempotent: a concurrent call waits for the first, and later calls
// return nil.
func (d *DDP) Close() error {
	first := false
	d.closeOnce.Do(func() {
		first = true
		d.mu.Lock()
		d.closed = true
		var inFlight []*dist.Work
		for _, b := range d.bkts {
			if b.work != nil {
				inFlight = append(inFlight, b.work)
			}
			if b.gather != nil {
				inFlight = append(inFlight, b.gather)
			}
		}
		d.mu.Unlock()
		for bi, w := range inFlight {
			<-w.Done()
			if err := w.Err(); err != nil && d.closeErr == nil {
				d.closeErr = fmt.Errorf("ddp: close: collective %d in flight: %w", bi, err)
			}
		}
		d.mu.Lock()
		for _, b := range d.bkts {
			b.release()
		}
		d.stages = [2]staging{}
		d.views = nil
		d.mu.Unlock()
	})
	if !first {
		return nil
	}
	return d.closeErr
}

// collName names the collective a bucket runs, for errors.
func (d *DDP) collName() string {
	if d.cfg.zero > 0 {
		return "reduce-scatter"
	}
	return "all-reduce"
}

// closedLocked returns ErrClosed, wrapped for op, once Close has begun.
func (d *DDP) closedLocked(op string) error {
	if d.closed {
		return fmt.Errorf("ddp: %s: %w", op, ErrClosed)
	}
	return nil
}
