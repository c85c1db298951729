package dist

import (
	"context"
	"reflect"
	"sync"
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
type p2pJoins struct {
	mu     sync.Mutex
	tick   uint64
	slots  [joinSlots]p2pJoin
	closed bool
}

// p2pJoin is one joined context: ctx ends with parent or with the job's
// failure.
type p2pJoin struct {
	parent  context.Context // nil: the slot is free
	ctx     context.Context
	cancel  context.CancelFunc
	stop    func() bool // unregisters cancel from the failure context
	unwatch func() bool // unregisters ended from ctx
	users   int
	used    uint64 // tick of the last hold, for choosing a slot to reuse
}

// p2pHold is one point-to-point call's use of a joined context; release
// ends it. The zero value holds nothing.
type p2pHold struct {
	j    *p2pJoins
	slot int // index in j.slots plus one; 0: not a kept join
	// A join made for this call alone, when every slot is busy or the
	// caller's context cannot be compared: release undoes it.
	cancel context.CancelFunc
	stop   func() bool
}

// hold returns a context that ends with parent or with fail (the job's
// failure context), reusing a kept join of parent if there is one.
func (j *p2pJoins) hold(parent, fail context.Context) (context.Context, p2pHold) {
	if reflect.TypeOf(parent).Kind() == reflect.Pointer {
		j.mu.Lock()
		if !j.closed {
			j.tick++
			pick := -1
			for i := range j.slots {
				s := &j.slots[i]
				if s.parent == parent {
					s.users++
					s.used = j.tick
					c := s.ctx
					j.mu.Unlock()
					return c, p2pHold{j: j, slot: i + 1}
				}
				if s.users == 0 && (pick < 0 || s.parent == nil || (j.slots[pick].parent != nil && s.used < j.slots[pick].used)) {
					pick = i
				}
			}
			if pick >= 0 {
				s := &j.slots[pick]
				s.free()
				c, cancel := context.WithCancel(parent)
				*s = p2pJoin{parent: parent, ctx: c, cancel: cancel, stop: context.AfterFunc(fail, cancel), users: 1, used: j.tick}
				i := pick
				s.unwatch = context.AfterFunc(c, func() { j.ended(i, c) })
				j.mu.Unlock()
				return c, p2pHold{j: j, slot: i + 1}
			}
		}
		j.mu.Unlock()
	}
	c, cancel := context.WithCancel(parent)
	return c, p2pHold{cancel: cancel, stop: context.AfterFunc(fail, cancel)}
}

// release ends the call's use of its context.
func (h p2pHold) release() {
	switch {
	case h.slot > 0:
		j := h.j
		j.mu.Lock()
		if !j.closed {
			s := &j.slots[h.slot-1]
			s.users--
			if s.users == 0 && s.ctx.Err() != nil {
				s.free()
			}
		}
		j.mu.Unlock()
	case h.cancel != nil:
		h.stop()
		h.cancel()
	}
}

// ended runs when slot i's context c has ended: the slot is freed unless a
// call still uses it (its release frees it then) or it was reused already.
func (j *p2pJoins) ended(i int, c context.Context) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if s := &j.slots[i]; !j.closed && s.ctx == c && s.users == 0 {
		s.free()
	}
}

// close undoes every join; later holds make joins for one call each.
func (j *p2pJoins) close() {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.closed = true
	for i := range j.slots {
		j.slots[i].free()
	}
}

// free undoes the join in s, if any, and empties the slot. j.mu is held.
func (s *p2pJoin) free() {
	if s.parent == nil {
		return
	}
	s.unwatch()
	s.stop()
	s.cancel()
	*s = p2pJoin{}
}
