package ddp

import (
	"context"
	"fmt"
	"time"

	"gorgonia.org/gorgonia"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/internal/shard"
	"github.com/gdist/gdist/dist/timeline"
)

// Stats describes one synchronisation (one optimiser step) as seen by this
// rank. Durations are wall-clock.
type Stats struct {
	// Passes is the number of backward passes whose gradients were
	// synchronised (more than 1 with accumulation or SetSync(false)).
	Passes int
	// Buckets is the number of all-reduces (one per bucket).
	Buckets int
	// Bytes is the size of the all-reduced buffers in their wire format.
	// A ring all-reduce sends about 2(n-1)/n of it per rank. Under ZeRO
	// it is the size of the reduce-scattered (padded) buckets, each rank
	// sending (n-1)/n of it, and as much again in the parameters'
	// all-gather.
	Bytes int64
	// Compute is forward plus backward time: from the first hook's forward
	// to the last parameter gradient, summed over the passes.
	Compute time.Duration
	// Comm is the time the all-reduces ran. They run one after another on
	// the group, so bucket i counts from max(its launch, end of bucket i-1)
	// to its end.
	Comm time.Duration
	// Exposed is the time Sync spent waiting for all-reduces: communication
	// not hidden behind the backward pass. Comm - Exposed was overlapped.
	Exposed time.Duration
	// Gather is, under ZeRO, the time the Solver's step spent all-gathering
	// the updated parameters (none of it overlaps computation).
	Gather time.Duration
}

// Stats returns the statistics of the last successful Sync (zero before the
// first one).
func (d *DDP) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.last
}

// Sync finishes the gradient synchronisation of the backward passes run
// since the last Sync: it starts the all-reduces not started yet (all of
// them with WithOverlap(false) or after passes with SetSync(false)), waits
// for every bucket, and writes the averaged gradients into each parameter's
// gradient (param.Grad(), the value solvers read), overwriting what Gorgonia
// accumulated there. Call it after RunAll and before the optimiser step; the
// Solver returned by DDP.Solver does.
//
// Every rank must call Sync after the same passes. If ctx ends first, Sync
// returns an error wrapping ctx.Err() and may be called again; the
// all-reduces go on. A failed all-reduce breaks the DDP (see Err).
func (d *DDP) Sync(ctx context.Context) error {
	d.mu.Lock()
	if err := d.closedLocked("sync"); err != nil {
		d.mu.Unlock()
		return err
	}
	if d.err != nil {
		defer d.mu.Unlock()
		return d.err
	}
	if d.nReady != 0 {
		defer d.mu.Unlock()
		return d.failLocked(fmt.Errorf("ddp: %d of %d gradients arrived: %w", d.nReady, d.nGrad, ErrIncompletePass))
	}
	if d.passes == 0 {
		d.mu.Unlock()
		return ErrNoGradients
	}
	for i, p := range d.params {
		if deriv := p.Deriv(); deriv != nil && deriv != d.gradNodes[i] {
			defer d.mu.Unlock()
			return d.failLocked(fmt.Errorf("ddp: parameter %s: %w", p.Name(), ErrNotHooked))
		}
	}
	d.launchReadyLocked(true)
	d.mu.Unlock()

	start := time.Now()
	for _, b := range d.bkts {
		select {
		case <-b.done():
		case <-ctx.Done():
			return fmt.Errorf("ddp: sync: %w", ctx.Err())
		}
	}
	exposed := time.Since(start)

	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.closedLocked("sync"); err != nil { // closed while we waited
		return err
	}
	for bi, b := range d.bkts {
		if !b.launched { // failed before launch; d.err is set
			return d.err
		}
		if b.work == nil { // world size 1: nothing to all-reduce
			continue
		}
		if err := b.work.Err(); err != nil {
			return d.failLocked(fmt.Errorf("ddp: %s of bucket %d: %w", d.collName(), bi, err))
		}
	}
	if d.cfg.zero > 0 {
		d.averageShardsLocked()
	} else if err := d.writeGradsLocked(); err != nil {
		return d.failLocked(err)
	}
	if d.cfg.maxGradNorm > 0 {
		if err := d.clipLocked(ctx); err != nil {
			return d.failLocked(err)
		}
	}
	// Comm: the all-reduces ran one after another in launch (= bucket) order.
	var comm time.Duration
	var prevDone time.Time
	for _, b := range d.bkts {
		s := b.launchAt
		if prevDone.After(s) {
			s = prevDone
		}
		at := b.doneAt()
		comm += at.Sub(s)
		prevDone = at
	}
	d.cur.Comm = comm
	d.cur.Exposed = exposed
	d.pg.Metrics().DDPStep(comm, exposed)
	if tl := d.pg.Timeline(); tl != nil {
		d.timelineLocked(tl, start, exposed)
	}
	d.last = d.cur
	d.cur = Stats{}
	d.passes = 0
	d.nextLaunch = 0
	d.syncedPending = false
	// The buckets keep the averages: the next pass overwrites them (see
	// gradReady), which saves clearing them here.
	for _, b := range d.bkts {
		b.work, b.launched, b.filled = nil, false, false
	}
	for k := range d.stages { // every reduce-scatter has finished
		d.stages[k].user, d.stages[k].work = nil, nil
	}
	return nil
}

// writeGradsLocked writes the averaged gradients from the buckets into the
// parameters' gradient values.
func (d *DDP) writeGradsLocked() error {
	div := d.divisorLocked(false)
	for bi, b := range d.bkts {
		if d.cfg.compress {
			if b.f32 != nil {
				if err := dist.DecodeFloat32(b.f32, b.wire, d.cfg.wire); err != nil {
					return fmt.Errorf("ddp: bucket %d: %w", bi, err)
				}
			} else {
				if err := dist.DecodeFloat32(b.scratch, b.wire, d.cfg.wire); err != nil {
					return fmt.Errorf("ddp: bucket %d: %w", bi, err)
				}
				for k, v := range b.scratch {
					b.f64[k] = float64(v)
				}
			}
		}
		for _, i := range b.params {
			if d.gradNodes[i] == nil {
				continue // no gradient flows to this parameter
			}
			p := d.params[i]
			gv, err := p.Grad()
			if err != nil {
				return fmt.Errorf("ddp: gradient of %s (bind dual values with gorgonia.BindDualValues): %w", p.Name(), err)
			}
			f32, f64, err := shard.Floats(gv)
			if err != nil {
				return fmt.Errorf("ddp: gradient of %s: %w", p.Name(), err)
			}
			s := d.slots[i]
			if len(f32)+len(f64) != s.n {
				return fmt.Errorf("ddp: gradient of %s has %d elements, want %d", p.Name(), len(f32)+len(f64), s.n)
			}
			switch {
			case d.cfg.compress && f32 != nil: // already divided before compression
				copy(f32, b.f32[s.off:s.off+s.n])
			case d.cfg.compress:
				copy(f64, b.f64[s.off:s.off+s.n])
			case f32 != nil:
				shard.ScaleInto(f32, b.f32[s.off:s.off+s.n], float32(div))
			default:
				shard.ScaleInto(f64, b.f64[s.off:s.off+s.n], div)
			}
		}
	}
	return nil
}

// Solver returns a gorgonia.Solver that synchronises gradients (Sync) and
// then calls inner. It fits the usual loop:
//
//	vm.RunAll(); solver.Step(gorgonia.NodesToValueGrads(params)); vm.Reset()
//
// With WithAccumulation(k) it calls Sync and inner only on every k-th Step.
func (d *DDP) Solver(inner gorgonia.Solver) *Solver {
	return &Solver{d: d, inner: inner}
}

// Solver is a gorgonia.Solver that averages gradients over the ranks before
// the inner solver's step. Its Step has no context: waits use the group's
// default timeout (dist.WithTimeout). Call DDP.Sync with a context, then the
// inner solver, for finer control.
type Solver struct {
	d     *DDP
	inner gorgonia.Solver
}

var _ gorgonia.Solver = (*Solver)(nil)

// Step implements gorgonia.Solver. Every entry of model that is a
// *gorgonia.Node must be a parameter of the DDP (else an error wrapping
// ErrNotParam: its gradient would not be averaged).
func (s *Solver) Step(model []gorgonia.ValueGrad) error {
	d := s.d
	d.mu.Lock()
	err := d.closedLocked("solver step")
	d.mu.Unlock()
	if err != nil {
		return err
	}
	for _, vg := range model {
		if n, ok := vg.(*gorgonia.Node); ok {
			if _, ok := d.index[n]; !ok {
				return fmt.Errorf("ddp: solver step on %s: %w", n.Name(), ErrNotParam)
			}
		}
	}
	if k := d.cfg.accumulation; k > 1 {
		d.mu.Lock()
		d.stepCalls++
		skip := d.stepCalls < k
		if !skip {
			d.stepCalls = 0
		}
		d.mu.Unlock()
		if skip {
			return nil
		}
	}
	// No context of its own: the group's default timeout bounds the
	// all-reduces and so this wait.
	ctx := context.Background()
	if err := d.Sync(ctx); err != nil {
		return err
	}
	if d.cfg.zero == 0 {
		return s.inner.Step(model)
	}
	d.mu.Lock()
	views, err := d.viewsLocked()
	d.mu.Unlock()
	if err != nil {
		return err
	}
	if err := s.inner.Step(views); err != nil {
		return fmt.Errorf("ddp: step of this rank's shard: %w", err)
	}
	return d.gatherParams(ctx)
}

// timelineLocked puts this step's buckets on the group's timeline: when each
// bucket's gradients arrived during backprop, its all-reduce from launch to
// finish, and the time Sync waited (the exposed communication).
func (d *DDP) timelineLocked(tl *timeline.Recorder, waitStart time.Time, exposed time.Duration) {
	for bi, b := range d.bkts {
		if !b.firstAt.IsZero() {
			tl.Add(timeline.Event{Lane: "ddp backward", Name: fmt.Sprintf("bucket %d gradients", bi), Cat: "ddp",
				Start: b.firstAt, End: b.readyAt, Args: [4]timeline.Arg{
					{Key: "bucket", Int: int64(bi)}, {Key: "params", Int: int64(len(b.params))}}})
		}
		if b.work != nil {
			tl.Add(timeline.Event{Lane: "ddp all-reduce", Name: fmt.Sprintf("bucket %d all-reduce", bi), Cat: "ddp",
				Start: b.launchAt, End: b.doneAt(), Args: [4]timeline.Arg{
					{Key: "bucket", Int: int64(bi)}, {Key: "bytes", Int: int64(4*len(b.f32) + 8*len(b.f64))},
					{Key: "launched_after_backward_us", Int: b.launchAt.Sub(b.readyAt).Microseconds()}}})
		}
		b.firstAt, b.readyAt = time.Time{}, time.Time{}
	}
	tl.Add(timeline.Event{Lane: "ddp wait", Name: "exposed communication", Cat: "ddp",
		Start: waitStart, End: waitStart.Add(exposed), Args: [4]timeline.Arg{{Key: "us", Int: exposed.Microseconds()}}})
}
