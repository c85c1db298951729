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

import "net"

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
