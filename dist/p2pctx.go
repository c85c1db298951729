package dist

import (
	"context"
	"reflect"
	"sync"
	"sync/atomic"
)

// joinSlots is how many joined contexts a job keeps for reuse: enough for
// the few contexts a program's point-to-point calls run under at once (a
// pipeline call's, a sender goroutine's, the caller's own).
const joinSlots = 8

// p2pJoins keeps contexts that join a caller's context with the job's
// failure context, for point-to-point calls under the same caller context
// to reuse. A join is undone (its registrations released) when its caller
// context ends or the job fails and nobody uses it, when a new caller
// context needs its slot and nobody uses it, and when the job closes.
// Only pointer-typed contexts are kept (every cancellable context of
// package context is one): comparing other dynamic types could panic.
//
// A call under a context that has a join takes it without a lock (an
// atomic count of its users); making, reusing and undoing joins happens
// under mu.
type p2pJoins struct {
	mu     sync.Mutex
	slots  [joinSlots]atomic.Pointer[p2pJoin]
	last   atomic.Pointer[p2pJoin] // the join the last hold found: most calls repeat it
	tick   atomic.Uint64
	closed bool // guarded by mu
}

// p2pJoin is one joined context: ctx ends with parent or with the job's
// failure. Its fields are set before it is published in a slot and never
// change, but users and used.
type p2pJoin struct {
	parent  context.Context
	ctx     context.Context
	cancel  context.CancelFunc
	stop    func() bool // unregisters cancel from the failure context
	unwatch func() bool // unregisters the slot's release from ctx
	users   atomic.Int64
	used    atomic.Uint64 // tick of the last hold, for choosing a slot to reuse
}

// Flags of a join's users count. joinDead marks it once it is undone: no
// hold takes it. joinEnded marks a join whose context ended while it was
// in use: the last user's release retires it.
const (
	joinDead  = 1 << 62
	joinEnded = 1 << 61
)

// take counts one more user, unless the join is undone. One atomic add:
// an undone join's count is never looked at again, so a failed take
// leaves it as it is.
func (e *p2pJoin) take() bool { return e.users.Add(1)&joinDead == 0 }

// undo releases the join's registrations; its users count is marked dead.
func (e *p2pJoin) undo() {
	e.unwatch()
	e.stop()
	e.cancel()
}

// p2pHold is one point-to-point call's use of a joined context; release
// ends it. The zero value holds nothing.
type p2pHold struct {
	j *p2pJoins
	e *p2pJoin // a kept join; nil: none
	// A join made for this call alone, when every slot is busy or the
	// caller's context cannot be compared: release undoes it.
	cancel context.CancelFunc
	stop   func() bool
}

// hold returns a context that ends with parent or with fail (the job's
// failure context), reusing a kept join of parent if there is one.
func (j *p2pJoins) hold(parent, fail context.Context) (context.Context, p2pHold) {
	// The join the last hold found first, before the type check: a kept
	// join's parent is pointer-typed, so comparing it cannot panic.
	if e := j.last.Load(); e != nil && e.parent == parent && e.take() {
		if e.used.Load() != j.tick.Load() { // another join was used since
			e.used.Store(j.tick.Add(1))
		}
		return e.ctx, p2pHold{j: j, e: e}
	}
	if reflect.TypeOf(parent).Kind() == reflect.Pointer {
		if e := j.find(parent); e != nil {
			return e.ctx, p2pHold{j: j, e: e}
		}
		if e := j.add(parent, fail); e != nil {
			return e.ctx, p2pHold{j: j, e: e}
		}
	}
	c, cancel := context.WithCancel(parent)
	return c, p2pHold{cancel: cancel, stop: context.AfterFunc(fail, cancel)}
}

// find takes the kept join of parent, if there is one.
func (j *p2pJoins) find(parent context.Context) *p2pJoin {
	if e := j.last.Load(); e != nil && e.parent == parent && e.take() {
		if e.used.Load() != j.tick.Load() { // another join was used since
			e.used.Store(j.tick.Add(1))
		}
		return e
	}
	for i := range j.slots {
		if e := j.slots[i].Load(); e != nil && e.parent == parent && e.take() {
			e.used.Store(j.tick.Add(1))
			j.last.Store(e)
			return e
		}
	}
	return nil
}

// add makes a join of parent and keeps it, in a free slot or in place of
// the least recently used join nobody uses; it returns nil if every slot is
// in use or the job closed.
func (j *p2pJoins) add(parent, fail context.Context) *p2pJoin {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return nil
	}
	if e := j.find(parent); e != nil { // made meanwhile
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
		if e.users.Load() == 0 && (pick < 0 || e.used.Load() < oldest) {
			pick, oldest = i, e.used.Load()
		}
	}
	if pick < 0 {
		return nil
	}
	if old := j.slots[pick].Load(); old != nil {
		if !old.users.CompareAndSwap(0, joinDead) {
			return nil // taken meanwhile: this call joins for itself
		}
		j.last.CompareAndSwap(old, nil)
		old.undo()
	}
	c, cancel := context.WithCancel(parent)
	e := &p2pJoin{parent: parent, ctx: c, cancel: cancel, stop: context.AfterFunc(fail, cancel)}
	e.users.Store(1)
	e.used.Store(j.tick.Add(1))
	e.unwatch = context.AfterFunc(c, func() { j.retire(e) })
	j.slots[pick].Store(e)
	return e
}

// retire undoes e if its context has ended and nobody uses it; if it is
// in use, it marks it joinEnded, and the last user's release retires it.
func (j *p2pJoins) retire(e *p2pJoin) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if e.ctx.Err() == nil {
		return
	}
	for {
		u := e.users.Load()
		if u&joinDead != 0 {
			return
		}
		if u&^joinEnded != 0 { // in use
			if e.users.CompareAndSwap(u, u|joinEnded) {
				return
			}
			continue
		}
		if e.users.CompareAndSwap(u, joinDead) {
			break
		}
	}
	j.last.CompareAndSwap(e, nil)
	e.undo()
	for i := range j.slots {
		if j.slots[i].Load() == e {
			j.slots[i].Store(nil)
		}
	}
}

// release ends the call's use of its context.
func (h p2pHold) release() {
	switch {
	case h.e != nil:
		if h.e.users.Add(-1) == joinEnded {
			h.j.retire(h.e)
		}
	case h.cancel != nil:
		h.stop()
		h.cancel()
	}
}

// close undoes every join; later holds make joins for one call each.
func (j *p2pJoins) close() {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.closed = true
	j.last.Store(nil)
	for i := range j.slots {
		if e := j.slots[i].Load(); e != nil {
			e.users.Or(joinDead)
			e.undo()
			j.slots[i].Store(nil)
		}
	}
}
