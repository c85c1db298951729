package ring

import (
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Bell is a doorbell in shared memory: a futex word its owner parks on and
// a flag saying it is parked, so that the other process makes a system
// call only when someone sleeps. Both words are untrusted: a peer that
// scribbles on them can cost spurious wake-ups or make the owner sleep
// until its timeout, nothing worse.
type Bell struct {
	seq      *atomic.Uint32
	sleeping *atomic.Uint32
}

// futex operations on shared (not process-private) memory.
const (
	futexWait = 0
	futexWake = 1
)

// Ring wakes the owner if it is parked.
func (b Bell) Ring() {
	if b.sleeping.Load() != 0 {
		b.Force()
	}
}

// Force wakes the owner whether or not it says it is parked.
func (b Bell) Force() {
	b.seq.Add(1)
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(b.seq)), futexWake, 1<<30, 0, 0, 0)
}

// Prepare announces that the owner is about to park and returns the value
// to pass to Wait. The owner must check for work after Prepare and before
// Wait: a Ring after Prepare either finds it sleeping or changes the word.
func (b Bell) Prepare() uint32 {
	s := b.seq.Load()
	b.sleeping.Store(1)
	return s
}

// Wait parks the owner until the bell rings, seq is stale or d passes.
// It is a blocking system call: the Go runtime hands the P to another
// thread while it lasts.
func (b Bell) Wait(seq uint32, d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(b.seq)), futexWait, uintptr(seq),
		uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// Done ends a Prepare.
func (b Bell) Done() { b.sleeping.Store(0) }
