// Package benchutil holds small helpers the benchmark programs under bench/
// share: a free loopback port for a job's rendezvous and the CPU time a rank
// has used.
//
// # Usage
//
//	port, err := benchutil.FreePort() // MASTER_PORT for the ranks
//	if err != nil { ... }
//	cpu0 := benchutil.CPUTime()
//	// ... measured work ...
//	cpuSec := (benchutil.CPUTime() - cpu0).Seconds()
package benchutil

import "github.com/gdist/gdist/internal/portpick"

// FreePort returns a loopback TCP port that was free a moment ago, outside
// the ephemeral range when it can (see package portpick).
func FreePort() (int, error) { return portpick.Free("127.0.0.1") }
