package fsdp

// What the hook ops do when a machine runs them: gather a unit before its
// forward, prefetch the next, stage gradients, and at the end of a unit's
// backward reduce-scatter its gradients and gather the unit before it.

import (
	"context"
	"fmt"
	"time"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/internal/shard"
)

// launchCtx is the context of the collectives started inside a pass, where
// no caller's context reaches: the group's default timeout bounds them (as
// DDP's bucket all-reduces), and they end early if the group fails.
var launchCtx = context.Background()

// forward is hook(p_i)'s forward: on entering a unit, gather it (waiting
// for its prefetch) and start gathering the next; return p_i's tensor over
// the gather buffer.
func (f *FSDP) forward(i int) (gorgonia.Value, error) {
	u := f.units[f.unitOf[i]]
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.checkLocked("forward pass"); err != nil {
		return nil, err
	}
	if u.pos != f.fwdAt {
		if u.pos < f.fwdAt || f.inBack {
			// A new pass: the previous one's backward did not run or
			// did not finish.
			return nil, f.failLocked(fmt.Errorf("fsdp: a forward pass began before the previous pass's backward and step: %w", ErrIncompletePass))
		}
		if f.passes > 0 {
			return nil, f.failLocked(fmt.Errorf("fsdp: a forward pass began before the step of the previous one (FSDP does not accumulate gradients over passes): %w", ErrIncompletePass))
		}
		f.fwdAt = u.pos
		f.launchGatherLocked(u)
		if err := f.waitGatherLocked(u); err != nil {
			return nil, err
		}
		if f.cfg.prefetch && u.pos+1 < len(f.order) {
			f.launchGatherLocked(f.order[u.pos+1])
		}
	}
	b := &f.pslots[f.slot(u.pos)]
	if b.owner != u || b.ver != f.version {
		return nil, f.failLocked(fmt.Errorf("fsdp: forward of %s (unit %d): %w", f.params[i].Name(), u.k, ErrNotResident))
	}
	return b.views[i], nil
}

// backward is the gradient op of hook(p_i): stage p_i's gradient g; at the
// unit's first hook (the last of its gradient ops to run) reduce-scatter the
// unit's gradients and make sure the unit before it is gathered.
func (f *FSDP) backward(i int, g gorgonia.Value) error {
	u := f.units[f.unitOf[i]]
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.checkLocked("backward pass"); err != nil {
		return err
	}
	if !f.inBack {
		f.inBack = true
		for _, v := range f.units {
			v.pending, v.reduced = v.nGrad, false
		}
	}
	if b := &f.pslots[f.slot(u.pos)]; b.owner != u || b.ver != f.version {
		return f.failLocked(fmt.Errorf("fsdp: gradient of %s (unit %d): %w", f.params[i].Name(), u.k, ErrNotResident))
	}
	if u.pending == u.nGrad {
		if err := f.acquireGradsLocked(u); err != nil {
			return err
		}
	}
	s := u.spans[i-u.params[0]]
	st := f.stagingOf(u)
	g32, g64, err := shard.Floats(g)
	if err != nil || len(g32)+len(g64) != s.Len {
		return f.failLocked(fmt.Errorf("fsdp: gradient of %s: %d elements (%v), want %d: %w", f.params[i].Name(), len(g32)+len(g64), err, s.Len, ErrInvalidArgument))
	}
	if (g32 != nil) != (u.dt == tensor.Float32) {
		return f.failLocked(fmt.Errorf("fsdp: gradient of %s is %v: %w", f.params[i].Name(), g.Dtype(), dist.ErrUnsupportedDType))
	}
	if g32 != nil {
		copy(st.f32[s.Off:s.Off+s.Len], g32)
	} else {
		copy(st.f64[s.Off:s.Off+s.Len], g64)
	}
	u.pending--
	if i != u.first {
		return nil
	}
	if u.pending != 0 {
		return f.failLocked(fmt.Errorf("fsdp: unit %d: %d gradients arrived after that of its first parameter %s: %w", u.k, u.pending, f.params[i].Name(), ErrIncompletePass))
	}
	f.reduceLocked(u, st)
	if u.pos > 0 {
		prev := f.order[u.pos-1]
		f.launchGatherLocked(prev)
		if err := f.waitGatherLocked(prev); err != nil {
			return err
		}
		if f.cfg.prefetch && u.pos > 1 {
			f.launchGatherLocked(f.order[u.pos-2])
		}
		return nil
	}
	// The first unit's backward ends the pass.
	f.passes++
	f.inBack, f.fwdAt = false, -1
	return nil
}

// checkLocked returns the error that stops a pass: Close, or an earlier
// failure.
func (f *FSDP) checkLocked(op string) error {
	if err := f.closedLocked(op); err != nil {
		return err
	}
	return f.err
}

// launchGatherLocked starts gathering unit u's parameters of the current
// version into the buffer of its parity, unless they are there or on their
// way.
func (f *FSDP) launchGatherLocked(u *unit) {
	b := &f.pslots[f.slot(u.pos)]
	if b.owner == u && b.ver == f.version {
		return
	}
	b.owner, b.ver = u, f.version
	f.cur.Gathers++
	f.cur.Bytes += int64(u.padded * int(u.dt.Size()))
	if f.pg.WorldSize() == 1 {
		copy(b.f32, u.w32)
		copy(b.f64, u.w64)
		b.work, u.gather = nil, nil
		return
	}
	if u.dt == tensor.Float32 {
		b.work = f.pg.AllGatherAsync(launchCtx, dist.F32(b.f32[:u.padded]), dist.F32(u.w32))
	} else {
		b.work = f.pg.AllGatherAsync(launchCtx, dist.F64(b.f64[:u.padded]), dist.F64(u.w64))
	}
	u.gather = b.work
}

// waitGatherLocked waits, without the lock, for unit u's gather.
func (f *FSDP) waitGatherLocked(u *unit) error {
	w := f.pslots[f.slot(u.pos)].work
	if w == nil {
		return nil
	}
	start := time.Now()
	f.mu.Unlock()
	<-w.Done()
	f.mu.Lock()
	f.cur.GatherWait += time.Since(start)
	if err := f.checkLocked("gather"); err != nil {
		return err
	}
	if err := w.Err(); err != nil {
		return f.failLocked(fmt.Errorf("fsdp: all-gather of unit %d: %w", u.k, err))
	}
	return nil
}

// stagingOf returns the buffer unit u's gradients are staged in.
func (f *FSDP) stagingOf(u *unit) *buffer {
	if u.own != nil {
		return u.own
	}
	return &f.gslots[u.pos%2]
}

// acquireGradsLocked takes unit u's staging buffer for this pass: the
// buffer of its parity once the reduce-scatter of the unit that used it
// last has finished. If that unit has not started its reduce-scatter
// (gradients arriving out of unit order), waiting could deadlock, and u
// gets a staging buffer of its own from then on.
func (f *FSDP) acquireGradsLocked(u *unit) error {
	if u.own == nil {
		b := &f.gslots[u.pos%2]
		if prev := b.owner; prev != nil && prev != u {
			switch {
			case b.work != nil:
				w := b.work
				f.mu.Unlock()
				<-w.Done()
				f.mu.Lock()
				if err := f.checkLocked("backward pass"); err != nil {
					return err
				}
				if err := w.Err(); err != nil {
					return f.failLocked(fmt.Errorf("fsdp: reduce-scatter of unit %d: %w", prev.k, err))
				}
			case !prev.reduced:
				u.own = &buffer{}
				if u.dt == tensor.Float32 {
					u.own.f32 = make([]float32, u.padded)
				} else {
					u.own.f64 = make([]float64, u.padded)
				}
			}
		}
	}
	st := f.stagingOf(u)
	st.owner, st.work = u, nil
	// Parameters without gradient and the padding reduce as zeros.
	from := u.n
	if u.nGrad < len(u.params) {
		from = 0
	}
	if u.dt == tensor.Float32 {
		clear(st.f32[from:u.padded])
	} else {
		clear(st.f64[from:u.padded])
	}
	return nil
}

// reduceLocked starts the reduce-scatter of unit u's staged gradients into
// its gradient piece.
func (f *FSDP) reduceLocked(u *unit, st *buffer) {
	u.reduced = true
	f.cur.Reduces++
	f.cur.Bytes += int64(u.padded * int(u.dt.Size()))
	if f.pg.WorldSize() == 1 {
		copy(u.g32, st.f32[:len(u.g32)])
		copy(u.g64, st.f64[:len(u.g64)])
		u.reduce, st.work = nil, nil
		return
	}
	if u.dt == tensor.Float32 {
		u.reduce = f.pg.ReduceScatterAsync(launchCtx, dist.F32(u.g32), dist.F32(st.f32[:u.padded]), dist.Sum)
	} else {
		u.reduce = f.pg.ReduceScatterAsync(launchCtx, dist.F64(u.g64), dist.F64(st.f64[:u.padded]), dist.Sum)
	}
	st.work = u.reduce
}
