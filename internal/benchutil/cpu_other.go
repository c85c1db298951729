//go:build !unix

package benchutil

import "time"

// CPUTime returns the CPU time this process has used: 0, as it is not
// measured on this system.
func CPUTime() time.Duration { return 0 }
