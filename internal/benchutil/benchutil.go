// Package benchutil holds what the benchmark programs under bench/ measure
// besides time: the CPU time a rank has used. (Ranks are started by package
// launch, raw-socket baselines measured by package rawtcp.)
//
// # Usage
//
//	cpu0 := benchutil.CPUTime()
//	// ... measured work ...
//	cpuSec := (benchutil.CPUTime() - cpu0).Seconds()
package benchutil
