package dist

// The worker runs async collectives in issue order, each under the context
// it was started with.

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// worker runs async collectives in the order they were issued.
func (g *ProcessGroup) worker() {
	defer g.wg.Done()
	for {
		g.mu.Lock()
		for len(g.queue) == 0 {
			if g.closed {
				g.mu.Unlock()
				return
			}
			g.mu.Unlock()
			select {
			case <-g.wake:
			case <-g.done:
			}
			g.mu.Lock()
		}
		w := g.queue[0]
		// Shift rather than reslice, so that the queue's array is reused and
		// a steady stream of async calls does not grow a new one.
		g.queue = slices.Delete(g.queue, 0, 1)
		g.mu.Unlock()
		g.exec(w.ctx, w.seq, &w.c, w, w.queued) // finishes w
	}
}

// enqueue hands c to the worker and returns its Work. Like runSync it
// refuses a ctx that is already done without taking a turn. A cancellable
// ctx is watched until the Work finishes (see cancelQueued); a running
// collective's context is watched by exec only for sync calls.
func (g *ProcessGroup) enqueue(ctx context.Context, c call) *Work {
	w := &Work{c: c, ctx: ctx, done: make(chan struct{})}
	if g.obs.on() {
		w.queued = time.Now()
	}
	if ctx == nil {
		w.finish(fmt.Errorf("dist: %s: %w: nil context", c.kind, ErrInvalidArgument))
		return w
	}
	if err := c.check(g); err != nil {
		w.finish(err)
		return w
	}
	w.c.site = g.callSite()
	if err := ctx.Err(); err != nil {
		w.finish(fmt.Errorf("dist: %s: %w", c.kind, err))
		return w
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		w.finish(fmt.Errorf("dist: %s: %w", c.kind, ErrClosed))
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
	g.mu.Unlock()
	select {
	case g.wake <- struct{}{}:
	default:
	}
	return w
}

// cancelQueued runs when the context of async collective w ends before w
// finished. If w is still queued, it gives up w's turn and aborts the group,
// as a sync collective does when its context ends while it waits for its
// turn. Otherwise the worker has taken w: waitTurn watches the context while
// w waits for its turn, and onCancel aborts the group if w is running.
func (g *ProcessGroup) cancelQueued(w *Work) {
	g.mu.Lock()
	i := slices.Index(g.queue, w)
	if i < 0 || g.cause != nil {
		// Taken by the worker, or the group has failed already, in which
		// case the worker fails w promptly with the derived error.
		g.mu.Unlock()
		g.onCancel()
		return
	}
	g.queue = slices.Delete(g.queue, i, i+1)
	g.abandonLocked(w.seq)
	g.mu.Unlock()
	w.finish(g.giveUp(w.c.kind, w.seq, w.ctx.Err()))
}
