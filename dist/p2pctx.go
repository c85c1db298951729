package dist

import (
	"context"
	"sync"
	"sync/atomic"
)

// joinSlots is how many joined contexts a job keeps for reuse: enough for
// the few contexts a program's point-to-point calls run under at once (a
// pipeline call's, a sender goroutine's, the caller's own).
const joinSlots = 8

// orphanMax bounds the joins a job has let go of without undoing them
// (see p2pJoins).
const orphanMax = 2 * joinSlots

// p2pJoins keeps contexts that join a caller's context with the job's
// failure context, for point-to-point calls under the same caller context
// to reuse. A join is found by the caller context's Done channel, which
// contexts that end together share (a context.WithValue of another has
// its parent's): one pointer comparison, which no dynamic type can make
// panic.
//
// A call under a context that has a join uses it without a lock and
// without counting itself: a join is undone (its registrations released,
// its context cancelled) only once its context has ended — with the
// caller's or with the job's failure or close, when every call under it
// ends anyway. A new caller context takes a free slot, or the least
// recently used one, whose join is then let go of (an orphan) but not
// undone, since calls may still run under it: it is undone when its
// context ends. Orphans are counted; while orphanMax of them wait for
// their contexts to end, a call under a context without a slot joins for
// itself alone. Making and undoing joins happens under mu.
type p2pJoins struct {
	mu      sync.Mutex
	slots   [joinSlots]atomic.Pointer[p2pJoin]
	last    atomic.Pointer[p2pJoin] // the join the last hold found: most calls repeat it
	tick    atomic.Uint64
	orphans int  // joins let go of and not yet undone (guarded by mu)
	closed  bool // guarded by mu
}

// p2pJoin is one joined context: ctx ends with parent or with the job's
// failure. Its fields are set before it is published in a slot and never
// change, but used, dead and orphan.
type p2pJoin struct {
	done    <-chan struct{} // the parent's Done
	ctx     context.Context
	cancel  context.CancelFunc
	stop    func() bool   // unregisters cancel from the failure context
	unwatch func() bool   // unregisters retire from ctx
	used    atomic.Uint64 // tick of the last hold, for choosing a slot to reuse
	dead    bool          // undone (guarded by mu)
	orphan  bool          // let go of from its slot, not yet undone (guarded by mu)
}

// undo releases the join's registrations and cancels its context.
func (e *p2pJoin) undo() {
	e.unwatch()
	e.stop()
	e.cancel()
}

// p2pHold is one point-to-point call's use of a context joined for it
// alone (when the caller's context has no kept join and none can be
// kept); release undoes that join. The zero value, for a call under a
// kept join or the failure context itself, holds nothing.
type p2pHold struct {
	cancel context.CancelFunc
	stop   func() bool
}

// hold returns a context that ends with parent or with fail (the job's
// failure context), reusing a kept join of a context with parent's Done
// channel (done) if there is one.
func (j *p2pJoins) hold(parent context.Context, done <-chan struct{}, fail context.Context) (context.Context, p2pHold) {
	// The join the last hold found first: most calls repeat it.
	if e := j.last.Load(); e != nil && e.done == done {
		j.touch(e)
		return e.ctx, p2pHold{}
	}
	if e := j.find(done); e != nil {
		return e.ctx, p2pHold{}
	}
	if e := j.add(parent, done, fail); e != nil {
		return e.ctx, p2pHold{}
	}
	c, cancel := context.WithCancel(parent)
	return c, p2pHold{cancel: cancel, stop: context.AfterFunc(fail, cancel)}
}

// touch marks e as used now, for the choice of a slot to reuse; it stores
// only when another join was used since.
func (j *p2pJoins) touch(e *p2pJoin) {
	if e.used.Load() != j.tick.Load() {
		e.used.Store(j.tick.Add(1))
	}
}

// find returns the kept join of a context whose Done is done, if there is
// one.
func (j *p2pJoins) find(done <-chan struct{}) *p2pJoin {
	for i := range j.slots {
		if e := j.slots[i].Load(); e != nil && e.done == done {
			j.touch(e)
			j.last.Store(e)
			return e
		}
	}
	return nil
}

// add makes a join of parent and keeps it, in a free slot or in place of
// the least recently used join (let go of as an orphan); it returns nil if
// the job closed or orphanMax orphans wait for their contexts to end.
func (j *p2pJoins) add(parent context.Context, done <-chan struct{}, fail context.Context) *p2pJoin {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return nil
	}
	if e := j.find(done); e != nil { // made meanwhile
		return e
	}
	pick := -1
	var oldest uint64
	for i := range j.slots {
		e := j.slots[i].Load()
		if e == nil {
			pick = i
			break
		}
		if pick < 0 || e.used.Load() < oldest {
			pick, oldest = i, e.used.Load()
		}
	}
	if old := j.slots[pick].Load(); old != nil {
		if j.orphans >= orphanMax {
			return nil // this call joins for itself
		}
		old.orphan = true
		j.orphans++
		j.last.CompareAndSwap(old, nil)
	}
	c, cancel := context.WithCancel(parent)
	e := &p2pJoin{done: done, ctx: c, cancel: cancel, stop: context.AfterFunc(fail, cancel)}
	e.used.Store(j.tick.Add(1))
	e.unwatch = context.AfterFunc(c, func() { j.retire(e) })
	j.slots[pick].Store(e)
	return e
}

// retire undoes e once its context has ended, and lets go of its slot.
func (j *p2pJoins) retire(e *p2pJoin) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if e.ctx.Err() == nil || e.dead {
		return
	}
	e.dead = true
	if e.orphan {
		j.orphans--
	}
	j.last.CompareAndSwap(e, nil)
	e.undo()
	for i := range j.slots {
		if j.slots[i].Load() == e {
			j.slots[i].Store(nil)
		}
	}
}

// release ends the call's use of its context. (Small enough to be
// inlined: most calls hold nothing.)
func (h p2pHold) release() {
	if h.cancel != nil {
		h.undo()
	}
}

func (h p2pHold) undo() {
	h.stop()
	h.cancel()
}

// close undoes every kept join; later holds make joins for one call
// each. Orphans are undone as their contexts end, which the job's close
// does (it cancels the failure context first).
func (j *p2pJoins) close() {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.closed = true
	j.last.Store(nil)
	for i := range j.slots {
		if e := j.slots[i].Load(); e != nil {
			if !e.dead { // (a kept join is never an orphan)
				e.dead = true
				e.undo()
			}
			j.slots[i].Store(nil)
		}
	}
}
