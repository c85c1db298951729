package launch

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// allowedCPUs returns the CPUs the launcher may run on, in increasing order.
func allowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("launch: sched_getaffinity: %w", err)
	}
	var cpus []int
	for c := range len(set) * 64 {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}

// startOn runs start (an exec.Cmd's Start) with the calling thread bound
// to cpu, so that the child inherits the binding from its first
// instruction, with every thread it makes; the thread's binding is put
// back afterwards. cpu < 0 starts unbound.
func startOn(cpu int, start func() error) error {
	if cpu < 0 {
		return start()
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return fmt.Errorf("bind to CPU %d: sched_getaffinity: %w", cpu, err)
	}
	one.Set(cpu)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		return fmt.Errorf("bind to CPU %d: sched_setaffinity: %w", cpu, err)
	}
	err := start()
	// Putting back a mask just read cannot fail short of a kernel bug; if it
	// did, this thread would merely run the launcher's goroutines on one CPU.
	// It must not end with the goroutine (Pdeathsig is per thread: the
	// child would be killed), so it is unlocked as usual.
	_ = unix.SchedSetaffinity(0, &old)
	return err
}
