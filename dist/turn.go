package dist

// Turn-taking: the collectives of a group run one at a time, in the order
// their sequence numbers were handed out, each under the group's reusable
// op context. Groups take turns independently of each other.

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"
)

type turnWaiter struct {
	seq uint64
	ch  chan struct{}
}

// opState describes the running collective.
type opState struct {
	seq  uint64
	fp   uint64
	kind opKind
	site uint32 // call-site hash (debug detail mode), else 0
	wire uint64 // the sequence field of its messages' headers (algorithms.go)
}

// opCtx is the context the running collective hands to the transport: it is
// done when the job is aborted (which is also what the collective's
// timeout, the caller's cancellation and Close do) or the group closed, and
// otherwise carries the caller's values and the collective's deadline. One
// is reused for every collective of a group, so running one allocates
// nothing.
type opCtx struct {
	g        *ProcessGroup
	parent   context.Context
	deadline time.Time
}

func (c *opCtx) Deadline() (time.Time, bool) { return c.deadline, true }
func (c *opCtx) Done() <-chan struct{}       { return c.g.stop }
func (c *opCtx) Err() error {
	select {
	case <-c.g.stop:
		return context.Canceled
	default:
		return nil
	}
}
func (c *opCtx) Value(key any) any {
	// Contexts derived from this one may ask after the collective ended, from
	// the context package's goroutine, while exec resets parent: read it under
	// the group's lock.
	c.g.d.mu.Lock()
	parent := c.parent
	c.g.d.mu.Unlock()
	if parent == nil {
		return nil
	}
	return parent.Value(key)
}

// runSync runs c on the caller's goroutine once its turn comes.
func (g *ProcessGroup) runSync(ctx context.Context, c *call) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("dist: %s: %w", g.opName(c.kind), err)
	}
	d := g.d
	d.mu.Lock()
	if g.closed {
		d.mu.Unlock()
		return fmt.Errorf("dist: %s: %w", g.opName(c.kind), ErrClosed)
	}
	seq := g.next
	g.next++
	d.mu.Unlock()
	var queued time.Time
	if d.obs.on() {
		queued = time.Now()
	}
	return g.exec(ctx, seq, c, nil, queued)
}

// exec waits for turn seq, runs c and passes the turn on. An async call's
// Work w (nil for a sync call) is finished before the turn passes, so that
// a collective that completes after it sees it done.
// queued (zero when observability is off) is when the caller issued c.
func (g *ProcessGroup) exec(ctx context.Context, seq uint64, c *call, w *Work, queued time.Time) error {
	d := g.d
	if err := g.waitTurn(ctx, seq, c.kind); err != nil {
		err = ownCtxEnded(ctx, err)
		if w != nil {
			w.finish(err)
		}
		return err
	}
	d.mu.Lock()
	if d.cause != nil || g.closed {
		d.mu.Unlock()
		err := ownCtxEnded(ctx, g.derive(seq, g.opName(c.kind)))
		if w != nil {
			w.finish(err)
		}
		d.mu.Lock()
		g.endTurnLocked(seq)
		d.mu.Unlock()
		return err
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(d.cfg.timeout)
	}
	g.cur = opState{seq: seq, fp: c.fingerprint(), kind: c.kind, site: c.site, wire: wireSeq(seq, c.site)}
	g.octx.parent, g.octx.deadline = ctx, deadline
	g.running, g.runCtx = true, ctx
	g.stallCount = 0
	g.prog.self.started = mark{seq: seq, kind: c.kind, at: time.Now()}
	d.mu.Unlock()

	g.timer.Reset(time.Until(deadline))
	if ctx.Done() != nil {
		if w == nil { // an async call's ctx is watched from enqueue on
			g.watchCtx(ctx)
		}
		if ctx.Err() != nil { // ended before the watch could see it running
			g.onCancel()
		}
	}
	var start time.Time
	if d.obs.on() {
		start = time.Now()
	}
	err := g.dispatch(&g.octx, c)
	g.timer.Stop()
	if err != nil {
		err = g.opFailed(seq, c.kind, err)
	} else if g.failedHere(seq) {
		// This rank failed the job during the collective (its context
		// ended, or it timed out) and told its peers so, although its own
		// part completed: it reports the failure too, as they do.
		err = g.derive(seq, g.opName(c.kind))
	}
	err = ownCtxEnded(ctx, err)
	if d.obs.on() {
		g.observe(c, seq, queued, start, time.Now(), err)
	}

	if w != nil {
		w.finish(err)
	}
	d.mu.Lock()
	g.running, g.runCtx = false, nil
	g.octx.parent = nil
	g.prog.self.finished = mark{seq: seq, kind: c.kind, at: time.Now()}
	g.endTurnLocked(seq)
	d.mu.Unlock()
	return err
}

// waitTurn waits until collective seq may run. If ctx ends or the group is
// closed first, the turn is given up; since the members will run that
// collective, giving it up aborts the job.
func (g *ProcessGroup) waitTurn(ctx context.Context, seq uint64, kind opKind) error {
	d := g.d
	d.mu.Lock()
	if g.serving == seq {
		d.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	g.waiters = append(g.waiters, turnWaiter{seq, ch})
	d.mu.Unlock()
	var err error
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-g.done:
		err = ErrClosed
	}
	d.mu.Lock()
	if i := slices.IndexFunc(g.waiters, func(w turnWaiter) bool { return w.seq == seq }); i >= 0 {
		g.waiters = slices.Delete(g.waiters, i, i+1)
	}
	g.abandonLocked(seq)
	d.mu.Unlock()
	if errors.Is(err, ErrClosed) {
		return fmt.Errorf("dist: %s: %w", g.opName(kind), ErrClosed)
	}
	return g.giveUp(kind, seq, err)
}

// giveUp fails the job because collective seq's context ended (with err)
// before its turn came, and returns the error the collective reports:
// that failure, or the job's earlier one.
func (g *ProcessGroup) giveUp(kind opKind, seq uint64, err error) error {
	name := g.opName(kind)
	e := fmt.Errorf("dist: %s #%d: gave up waiting for earlier collectives: %w", name, seq, err)
	a := &AbortError{Kind: KindCancelled, Rank: g.d.rank, Reporter: g.d.rank, Op: name, Seq: seq, Err: err,
		Msg: "gave up waiting for earlier collectives: " + err.Error()}
	if errors.Is(err, context.DeadlineExceeded) {
		a.Kind = KindTimeout
	}
	cause := &ownError{a: a, err: e}
	if g.d.fail(a, cause) {
		return cause
	}
	return withCtxErr(err, g.derive(seq, name))
}

// abandonLocked gives up turn seq, which nobody waits for: if it has come
// already it is passed on, else it is skipped when it comes.
func (g *ProcessGroup) abandonLocked(seq uint64) {
	if g.serving == seq {
		g.endTurnLocked(seq)
		return
	}
	if g.abandoned == nil {
		g.abandoned = make(map[uint64]struct{})
	}
	g.abandoned[seq] = struct{}{}
}

// endTurnLocked passes the turn from seq to the next collective that has not
// been given up, and wakes it.
func (g *ProcessGroup) endTurnLocked(seq uint64) {
	g.serving = seq + 1
	for {
		if _, ok := g.abandoned[g.serving]; !ok {
			break
		}
		delete(g.abandoned, g.serving)
		g.serving++
	}
	for i, w := range g.waiters {
		if w.seq == g.serving {
			close(w.ch)
			g.waiters = slices.Delete(g.waiters, i, i+1)
			break
		}
	}
}

// onTimer fires at the running collective's deadline.
func (g *ProcessGroup) onTimer() {
	d := g.d
	d.mu.Lock()
	if !g.running || time.Now().Before(g.octx.deadline) || d.cause != nil {
		d.mu.Unlock()
		return
	}
	cur, started := g.cur, g.prog.self.started.at
	d.mu.Unlock()
	_ = g.timedOut(cur, started)
}

// timedOut fails the job because collective cur of g, started at started,
// ran out of time: the cause names the ranks it was waiting for and where
// they were. The first of them is the culprit (this rank if it knew of
// none).
func (g *ProcessGroup) timedOut(cur opState, started time.Time) bool {
	te := &TimeoutError{Op: g.opName(cur.kind), Seq: cur.seq, After: time.Since(started),
		Waiting: g.waitingFor(cur.seq), Queued: g.d.queued()}
	a := &AbortError{Kind: KindTimeout, Rank: g.d.rank, Reporter: g.d.rank, Op: te.Op, Seq: cur.seq, Msg: te.Error(), Err: te}
	if len(te.Waiting) > 0 {
		a.Rank = te.Waiting[0].Rank
	}
	return g.failRunning(cur.seq, a, &ownError{a: a, err: te})
}

// failRunning is fail for a failure of collective seq that this rank
// decided on its own (a timeout or cancellation), if seq is still running.
func (g *ProcessGroup) failRunning(seq uint64, a *AbortError, cause error) bool {
	d := g.d
	d.mu.Lock()
	if !g.running || g.cur.seq != seq || d.cause != nil {
		d.mu.Unlock()
		return false
	}
	d.setCauseLocked(a, cause)
	d.mu.Unlock()
	d.aborted(a)
	return true
}

// watchCtx arranges for onCancel to run when ctx ends. The registration
// (context.AfterFunc, which allocates) is kept for the next collective, so a
// loop of collectives under one context allocates nothing after the first.
func (g *ProcessGroup) watchCtx(ctx context.Context) {
	g.d.mu.Lock()
	defer g.d.mu.Unlock()
	// Only pointers are compared: comparing other dynamic types could panic,
	// and every cancellable context of package context is a pointer.
	if g.watched != nil && reflect.TypeOf(ctx).Kind() == reflect.Pointer && ctx == g.watched {
		return
	}
	if g.unwatch != nil {
		g.unwatch()
	}
	g.watched, g.unwatch = ctx, context.AfterFunc(ctx, g.onCancelFn)
}

// onCancel runs when the running collective's context ends.
func (g *ProcessGroup) onCancel() {
	d := g.d
	d.mu.Lock()
	if !g.running || g.runCtx == nil || d.cause != nil || g.runCtx.Err() == nil {
		d.mu.Unlock()
		return
	}
	cur, started, err := g.cur, g.prog.self.started.at, g.runCtx.Err()
	d.mu.Unlock()
	if errors.Is(err, context.DeadlineExceeded) {
		_ = g.timedOut(cur, started)
		return
	}
	name := g.opName(cur.kind)
	a := &AbortError{Kind: KindCancelled, Rank: d.rank, Reporter: d.rank, Op: name, Seq: cur.seq,
		Err: err, Msg: err.Error()}
	_ = g.failRunning(cur.seq, a, &ownError{a: a, err: fmt.Errorf("dist: %s #%d: %w", name, cur.seq, err)})
}
