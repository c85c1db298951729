package ddp

// Launch: the hooks' gradient ops report gradients here, and a bucket's
// all-reduce starts as soon as its gradients are complete.

import (
	"context"
	"fmt"
	"time"

	"gorgonia.org/gorgonia"

	"github.com/gdist/gdist/dist"
)

// launchCtx is the context of the bucket all-reduces. They start inside a
// backward pass (or in Sync, which must not let its ctx cancel them; see
// there), where no caller's context reaches, so they run under the group's
// default timeout (dist.WithTimeout) and end early only when the group is
// aborted or closed. Close waits for them.
var launchCtx = context.Background()

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
	if err := d.closedLocked("backward pass"); err != nil {
		return false, err
	}
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
		if d.cfg.zero == 2 && !d.sync {
			return false, d.failLocked(fmt.Errorf("ddp: a pass with SetSync(false) under ZeRO-2, which frees the gradients outside this rank's shard after every pass and so cannot accumulate them (ZeRO-1 can): %w", ErrUnsupported))
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
	if d.cfg.zero == 2 && !b.filled {
		// ZeRO-2: the bucket's first gradient of the pass; take a buffer.
		if err := d.acquireLocked(b, false); err != nil {
			return false, d.failLocked(err)
		}
		b.filled = true
	}
	// The first pass since the last Sync overwrites the slot (the buckets
	// keep the previous step's averages); later passes add to it.
	if err := addInto(b, s, g, d.passes == 0); err != nil {
		return false, d.failLocked(fmt.Errorf("ddp: gradient of %s: %w", d.params[i].Name(), err))
	}
	d.ready[i] = true
	d.nReady++
	if b.pending == b.nGrad {
		b.firstAt = now
	}
	b.pending--
	if b.pending == 0 {
		b.readyAt = now
	}
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
			return
		}
		if d.pg.WorldSize() > 1 {
			w = d.pg.AllReduceAsync(launchCtx, dist.Typed(b.wire, d.cfg.wire), dist.Sum)
		}
		bytes = len(b.wire)
	case d.cfg.zero > 0:
		if d.cfg.zero == 2 && !b.filled {
			// No gradient reached the bucket in this pass: reduce zeros.
			if err := d.acquireLocked(b, true); err != nil {
				d.failLocked(err)
				return
			}
			b.filled = true
		}
		w, bytes = d.reduceScatterLocked(b)
	case d.pg.WorldSize() == 1:
		// Nothing to exchange: the sum over one rank is the bucket.
		bytes = 4*len(b.f32) + 8*len(b.f64)
	case b.f32 != nil:
		w = d.pg.AllReduceAsync(launchCtx, dist.F32(b.f32), dist.Sum)
		bytes = 4 * len(b.f32)
	default:
		w = d.pg.AllReduceAsync(launchCtx, dist.F64(b.f64), dist.Sum)
		bytes = 8 * len(b.f64)
	}
	b.work, b.launched = w, true
	d.cur.Buckets++
	d.cur.Bytes += int64(bytes)
	d.emitLocked("launch", -1, bi, now)
}
