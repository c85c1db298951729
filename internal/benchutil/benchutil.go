// Package benchutil holds what the benchmark programs under bench/ share
// besides their measurements: the CPU time a rank has used, the machine's
// load average, and a run of ranks (started by package launch) that each
// report one result. (Raw-socket baselines are measured by package rawtcp.)
//
// # Usage
//
//	cpu0 := benchutil.CPUTime()
//	// ... measured work ...
//	cpuSec := (benchutil.CPUTime() - cpu0).Seconds()
//
// A benchmark that re-executes itself as ranks:
//
//	if spec, ok := os.LookupEnv("MYBENCH_JOB"); ok { // a rank
//		// ... join the job, measure ...
//		return benchutil.Report(os.Stdout, outcome)
//	}
//	outs, err := benchutil.RunRanks[outcome](ctx, 2, 1, func(int) []string { return []string{"MYBENCH_JOB=" + spec} }, os.Stderr)
//	fmt.Println("load average", benchutil.LoadAvg())
package benchutil
