//go:build unix

package benchutil

import (
	"syscall"
	"time"
)

// CPUTime returns the CPU time (user + system) this process has used (0 on
// systems where it is not measured).
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
