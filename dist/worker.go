package dist

// The worker runs a group's async collectives in issue order, each under
// the context it was started with. It starts with the group's first async
// call, so a group that never makes one costs no goroutine.

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// worker runs async collectives in the order they were issued, until the
// group closes.
func (g *ProcessGroup) worker() {
	defer g.wg.Done()
	d := g.d
	for {
		d.mu.Lock()
		for len(g.queue) == 0 {
			if g.closed {
				d.mu.Unlock()
				return
			}
			d.mu.Unlock()
			select {
			case <-g.wake:
			case <-g.done:
			}
			d.mu.Lock()
		}
		w := g.queue[0]
		// Shift rather than reslice, so that the queue's array is reused and
		// a steady stream of async calls does not grow a new one.
		g.queue = slices.Delete(g.queue, 0, 1)
		d.mu.Unlock()
		g.exec(w.ctx, w.seq, &w.c, w, w.queued) // finishes w
	}
}

// enqueue hands c to the worker and returns its Work. Like runSync it
// refuses a ctx that is already done without taking a turn. A cancellable
// ctx is watched until the Work finishes (see cancelQueued); a running
// collective's context is watched by exec only for sync calls.
func (g *ProcessGroup) enqueue(ctx context.Context, c call, check error) *Work {
	d := g.d
	w := &Work{c: c, ctx: ctx, done: make(chan struct{}), name: g.opName(c.kind)}
	if d.obs.on() {
		w.queued = time.Now()
	}
	if ctx == nil {
		w.finish(fmt.Errorf("dist: %s: %w: nil context", w.name, ErrInvalidArgument))
		return w
	}
	if check != nil {
		w.finish(check)
		return w
	}
	w.c.site = g.callSite()
	if err := ctx.Err(); err != nil {
		w.finish(fmt.Errorf("dist: %s: %w", w.name, err))
		return w
	}
	d.mu.Lock()
	if g.closed {
		d.mu.Unlock()
		w.finish(fmt.Errorf("dist: %s: %w", w.name, ErrClosed))
		return w
	}
	w.seq = g.next
	g.next++
	g.queue = append(g.queue, w)
	if ctx.Done() != nil {
		// Set under the lock: the worker, which finishes w (and so calls
		// stop), takes w from the queue under it too.
		w.stop = context.AfterFunc(ctx, func() { g.cancelQueued(w) })
	}
	if !g.workerOn {
		g.workerOn = true
		g.wg.Add(1)
		go g.worker()
	}
	d.mu.Unlock()
	select {
	case g.wake <- struct{}{}:
	default:
	}
	return w
}

// cancelQueued runs when the context of async collective w ends before w
// finished. If w is still queued, it gives up w's turn and aborts the job,
// as a sync collective does when its context ends while it waits for its
// turn. Otherwise the worker has taken w: waitTurn watches the context while
// w waits for its turn, and onCancel aborts the job if w is running.
func (g *ProcessGroup) cancelQueued(w *Work) {
	d := g.d
	d.mu.Lock()
	i := slices.Index(g.queue, w)
	if i < 0 || d.cause != nil {
		// Taken by the worker, or the job has failed already, in which
		// case the worker fails w promptly with the derived error.
		d.mu.Unlock()
		g.onCancel()
		return
	}
	g.queue = slices.Delete(g.queue, i, i+1)
	g.abandonLocked(w.seq)
	d.mu.Unlock()
	w.finish(g.giveUp(w.c.kind, w.seq, w.ctx.Err()))
}
