package ddp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/internal/vec"
)

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
)

// ddpIDs numbers DDP instances so that their hook ops hash differently.
var ddpIDs atomic.Uint64

// DDP is a data-parallel wrapper around a model's parameters: it keeps every
// rank's parameters identical by averaging their gradients over the ranks
// before each optimiser step. See the package documentation.
//
// A DDP serves one TapeMachine running one graph; its methods are safe to
// call from any goroutine.
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
	cur           Stats     // being accumulated
	last          Stats     // of the last Sync
	trace         func(ev event)
}

// slot locates a parameter's gradient inside its bucket.
type slot struct {
	bucket, off, n int
}

// bucket is a group of consecutive parameters (in reverse order) whose
// gradients are all-reduced together.
type bucket struct {
	params  []int // parameter indices
	f32     []float32
	f64     []float64
	scratch []float32 // F64 parameters with compression: float32 staging
	wire    []byte    // compressed payload
	nGrad   int       // parameters of the bucket with a gradient node
	pending int       // of those, gradients not yet arrived in this pass

	work     *dist.Work // nil at world size 1
	launched bool       // work started (or skipped at world size 1) this step
	launchAt time.Time
	doneAt   time.Time     // set by the watcher before it closes finished
	finished chan struct{} // closed once the all-reduce is done and doneAt set
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
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
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
	f32, f64, err := floatsOf(p.Value())
	if err != nil {
		return fmt.Errorf("%s: %w", p.Name(), err)
	}
	if len(f32)+len(f64) != p.Shape().TotalSize() && !(p.IsScalar() && len(f32)+len(f64) == 1) {
		return fmt.Errorf("%s: value has %d elements, shape %v: %w", p.Name(), len(f32)+len(f64), p.Shape(), dist.ErrInvalidArgument)
	}
	return nil
}

// numel is the number of elements of p.
func numel(p *gorgonia.Node) int {
	if p.IsScalar() {
		return 1
	}
	return p.Shape().TotalSize()
}

// buildBuckets assigns parameters, in reverse order, to buckets of at most
// firstBucketCap (the first) or bucketCap bytes and of one dtype.
func (d *DDP) buildBuckets() {
	var cur *bucket
	var curDT tensor.Dtype
	var curBytes, curN int
	flush := func() {
		if cur == nil {
			return
		}
		if curDT == tensor.Float32 {
			cur.f32 = make([]float32, curN)
		} else {
			cur.f64 = make([]float64, curN)
			if d.cfg.compress {
				cur.scratch = make([]float32, curN)
			}
		}
		if d.cfg.compress {
			cur.wire = make([]byte, curN*d.cfg.wire.Size())
		}
		d.bkts = append(d.bkts, cur)
		cur = nil
	}
	for i := len(d.params) - 1; i >= 0; i-- {
		p := d.params[i]
		n := numel(p)
		size := n * int(p.Dtype().Size())
		limit := d.cfg.bucketCap
		if len(d.bkts) == 0 {
			limit = d.cfg.firstBucketCap
		}
		if cur != nil && (p.Dtype() != curDT || curBytes+size > limit) {
			flush()
			limit = d.cfg.bucketCap
		}
		if cur == nil {
			cur, curDT, curBytes, curN = &bucket{}, p.Dtype(), 0, 0
		}
		d.slots[i] = slot{bucket: len(d.bkts), off: curN, n: n}
		cur.params = append(cur.params, i)
		curBytes += size
		curN += n
	}
	flush()
}

// broadcast copies rank 0's parameter values to every rank, one collective
// per bucket.
func (d *DDP) broadcast(ctx context.Context) error {
	for bi, b := range d.bkts {
		for _, i := range b.params {
			if err := d.copyParam(i, b, true); err != nil {
				return err
			}
		}
		var err error
		if b.f32 != nil {
			err = d.pg.Broadcast(ctx, b.f32, 0)
		} else {
			err = d.pg.BroadcastF64(ctx, b.f64, 0)
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
	}
	return nil
}

// copyParam copies parameter i's value into its bucket slot (toBucket) or
// back.
func (d *DDP) copyParam(i int, b *bucket, toBucket bool) error {
	s := d.slots[i]
	f32, f64, err := floatsOf(d.params[i].Value())
	if err != nil {
		return fmt.Errorf("ddp: parameter %s: %w", d.params[i].Name(), err)
	}
	switch {
	case b.f32 != nil && toBucket:
		copy(b.f32[s.off:s.off+s.n], f32)
	case b.f32 != nil:
		copy(f32, b.f32[s.off:s.off+s.n])
	case toBucket:
		copy(b.f64[s.off:s.off+s.n], f64)
	default:
		copy(f64, b.f64[s.off:s.off+s.n])
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

// Hook returns hook(p), the node to use in the forward pass in place of the
// parameter p. It is the identity on values; the gradient that flows back
// through it is p's gradient, and the hook's gradient op hands it to the DDP,
// which all-reduces a bucket as soon as its last gradient has arrived.
//
// For that all-reduce to overlap the rest of the backward pass, call Hook
// where p is used, right before the op that consumes it, not for all
// parameters up front: the TapeMachine executes nodes in creation order and
// gorgonia.Backpropagate creates the hook's gradient op when it reaches the
// hook node, walking the graph in reverse creation order — a hook created
// before the whole forward pass is reached last, so its gradient op would
// run at the very end of backprop. Results are the same either way.
//
// The hook and its gradient op copy their input into an output buffer that
// every pass reuses, so a training step allocates nothing per parameter:
// hook(p).Value() and the gradient node's value are valid until the next
// pass, like any value a TapeMachine may reuse.
//
// Hook returns the same node for every call with the same parameter, so a
// parameter used twice (weight tying) has one hook, created at its first use.
// Like all graph construction it must not run concurrently with other
// Gorgonia graph building.
func (d *DDP) Hook(p *gorgonia.Node) (*gorgonia.Node, error) {
	i, ok := d.index[p]
	if !ok {
		return nil, fmt.Errorf("ddp: hook of %v: %w", p, ErrNotParam)
	}
	d.mu.Lock()
	h := d.hooks[i]
	d.mu.Unlock()
	if h != nil {
		return h, nil
	}
	h, err := gorgonia.ApplyOp(&hookOp{d: d, i: i}, p)
	if err != nil {
		return nil, fmt.Errorf("ddp: hook of %s: %w", p.Name(), err)
	}
	d.mu.Lock()
	d.hooks[i] = h
	if d.firstHook < 0 {
		d.firstHook = i
	}
	d.mu.Unlock()
	return h, nil
}

// Hooked returns Hook(p) for every parameter, in parameter order. It suits
// models that take all their parameters up front (for example
// mlp.Model.ForwardWith); the training result is the same as with Hook at
// every use, but the all-reduces cannot overlap backprop (see Hook).
func (d *DDP) Hooked() (gorgonia.Nodes, error) {
	out := make(gorgonia.Nodes, len(d.params))
	for i, p := range d.params {
		h, err := d.Hook(p)
		if err != nil {
			return nil, err
		}
		out[i] = h
	}
	return out, nil
}

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

// forwardSeen is called by parameter i's hook when the forward pass runs it.
func (d *DDP) forwardSeen(i int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now()
	if i == d.firstHook && d.nReady == 0 {
		d.passStart = now
	}
	d.emitLocked("forward", i, -1, now)
}

// gradReady is called by parameter i's hook gradient op with the gradient g
// of this backward pass. It reports whether it started an all-reduce.
func (d *DDP) gradReady(i int, g gorgonia.Value) (launched bool, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.err != nil {
		return false, d.err
	}
	first := d.nextLaunch
	defer func() { launched = d.nextLaunch > first && d.pg.WorldSize() > 1 }()
	now := time.Now()
	if d.nReady == 0 {
		if d.syncedPending {
			return false, d.failLocked(ErrSyncPending)
		}
		d.syncPass = d.sync && (d.cfg.accumulation == 1 || d.stepCalls == d.cfg.accumulation-1)
		d.launchNow = d.cfg.overlap && d.syncPass
		for _, b := range d.bkts {
			b.pending = b.nGrad
		}
		if d.passStart.IsZero() {
			d.passStart = now
		}
	}
	if d.ready[i] {
		return false, d.failLocked(fmt.Errorf("ddp: parameter %s: %w", d.params[i].Name(), ErrDuplicateGradient))
	}
	s := d.slots[i]
	b := d.bkts[s.bucket]
	// The first pass since the last Sync overwrites the slot (the buckets
	// keep the previous step's averages); later passes add to it.
	if err := addInto(b, s, g, d.passes == 0); err != nil {
		return false, d.failLocked(fmt.Errorf("ddp: gradient of %s: %w", d.params[i].Name(), err))
	}
	d.ready[i] = true
	d.nReady++
	b.pending--
	d.emitLocked("grad", i, s.bucket, now)
	if d.launchNow {
		d.launchReadyLocked(false)
	}
	if d.nReady == d.nGrad {
		d.cur.Compute += now.Sub(d.passStart)
		d.passes++
		d.cur.Passes++
		clear(d.ready)
		d.nReady = 0
		d.passStart = time.Time{}
		d.syncedPending = d.syncPass
		if d.launchNow {
			d.launchReadyLocked(true)
		}
		d.emitLocked("pass", -1, -1, now)
	}
	return false, nil
}

// addInto adds gradient g into slot s of bucket b, or copies it there if
// overwrite is set.
func addInto(b *bucket, s slot, g gorgonia.Value, overwrite bool) error {
	f32, f64, err := floatsOf(g)
	if err != nil {
		return err
	}
	if len(f32)+len(f64) != s.n {
		return fmt.Errorf("%d gradient elements, want %d: %w", len(f32)+len(f64), s.n, dist.ErrInvalidArgument)
	}
	switch {
	case b.f32 != nil && f32 != nil && overwrite:
		copy(b.f32[s.off:s.off+s.n], f32)
	case b.f64 != nil && f64 != nil && overwrite:
		copy(b.f64[s.off:s.off+s.n], f64)
	case b.f32 != nil && f32 != nil:
		vec.AddF32(b.f32[s.off:s.off+s.n], f32)
	case b.f64 != nil && f64 != nil:
		vec.AddF64(b.f64[s.off:s.off+s.n], f64)
	default:
		return fmt.Errorf("gradient dtype %v differs from the parameter's: %w", g.Dtype(), dist.ErrUnsupportedDType)
	}
	return nil
}

// launchReadyLocked starts the all-reduce of every bucket, in order, whose
// gradients are complete (all of them if all is set), stopping at the first
// incomplete one so that every rank issues them in the same order.
func (d *DDP) launchReadyLocked(all bool) {
	for d.nextLaunch < len(d.bkts) {
		b := d.bkts[d.nextLaunch]
		if !all && b.pending > 0 {
			return
		}
		d.launchLocked(d.nextLaunch)
		d.nextLaunch++
	}
}

// divisorLocked is what the summed gradients are divided by: the world size,
// times the number of accumulated passes under WithAccumulation. inPass
// counts a pass in progress (a launch from the backward pass).
func (d *DDP) divisorLocked(inPass bool) float64 {
	div := float64(d.pg.WorldSize())
	if d.cfg.accumulation > 1 {
		p := d.passes
		if inPass {
			p++
		}
		div *= float64(max(p, 1))
	}
	return div
}

// closedChan is the finished channel of a bucket with nothing to wait for.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// launchLocked starts the all-reduce of bucket bi (at world size 1 there is
// nothing to exchange and the bucket is done at once).
func (d *DDP) launchLocked(bi int) {
	b := d.bkts[bi]
	now := time.Now()
	b.launchAt = now
	var w *dist.Work
	var bytes int
	switch {
	case d.cfg.compress:
		// Divide before narrowing so that F16 sums stay in range.
		div := d.divisorLocked(d.nReady > 0)
		var src []float32
		if b.f32 != nil {
			src = b.f32
			for k, v := range src {
				src[k] = float32(float64(v) / div)
			}
		} else {
			src = b.scratch
			for k, v := range b.f64 {
				src[k] = float32(v / div)
			}
		}
		if err := dist.EncodeFloat32(b.wire, src, d.cfg.wire); err != nil {
			d.failLocked(fmt.Errorf("ddp: compress bucket %d: %w", bi, err))
			b.finished = closedChan
			return
		}
		if d.pg.WorldSize() > 1 {
			w = d.pg.AllReduceTypedAsync(b.wire, d.cfg.wire, dist.Sum)
		}
		bytes = len(b.wire)
	case d.pg.WorldSize() == 1:
		// Nothing to exchange: the sum over one rank is the bucket.
		bytes = 4*len(b.f32) + 8*len(b.f64)
	case b.f32 != nil:
		w = d.pg.AllReduceAsync(b.f32, dist.Sum)
		bytes = 4 * len(b.f32)
	default:
		w = d.pg.AllReduceF64Async(b.f64, dist.Sum)
		bytes = 8 * len(b.f64)
	}
	b.work, b.launched = w, true
	d.cur.Buckets++
	d.cur.Bytes += int64(bytes)
	d.emitLocked("launch", -1, bi, now)
	if w == nil { // world size 1: done already
		b.doneAt = now
		b.finished = closedChan
		return
	}
	b.finished = make(chan struct{})
	// The watcher records when the all-reduce finished; it exits when the
	// Work completes, which every collective does (at the latest when the
	// group's timeout fires or the group closes).
	go func(b *bucket, w *dist.Work) {
		<-w.Done()
		t := time.Now()
		d.mu.Lock()
		b.doneAt = t
		d.mu.Unlock()
		close(b.finished)
	}(b, w)
}

// floatsOf returns the backing slice of a Float32 or Float64 tensor or scalar
// value (exactly one of f32, f64 is non-nil).
func floatsOf(v gorgonia.Value) (f32 []float32, f64 []float64, err error) {
	switch x := v.(type) {
	case *gorgonia.F32:
		return unsafe.Slice((*float32)(x), 1), nil, nil
	case *gorgonia.F64:
		return nil, unsafe.Slice((*float64)(x), 1), nil
	case tensor.Tensor:
		if x.RequiresIterator() {
			return nil, nil, fmt.Errorf("value is a non-contiguous view: %w", dist.ErrInvalidArgument)
		}
		switch data := x.Data().(type) {
		case []float32:
			return data[:x.Size()], nil, nil
		case []float64:
			return nil, data[:x.Size()], nil
		}
	}
	if v == nil {
		return nil, nil, fmt.Errorf("no value: %w", dist.ErrInvalidArgument)
	}
	return nil, nil, fmt.Errorf("value of type %T (%v): %w", v, v.Dtype(), dist.ErrUnsupportedDType)
}
