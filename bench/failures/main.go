//go:build unix

// Command failures measures how gdist's ranks diagnose failures: it runs
// each of four failure scenarios N times, ranks being separate OS processes
// (this program re-executes itself through internal/launch, GOMAXPROCS=1
// each) connected by the TCP transport over loopback, and counts the runs in
// which a rank blamed a healthy rank or named the wrong cause.
//
// The scenarios, each on 3 ranks that all-reduce (Max) a vector of -count
// float32 in a loop; the failing rank rotates from run to run:
//
//	kill    the parent SIGKILLs one rank mid-loop; every survivor must fail
//	        with an error naming it as lost (or frozen): a *dist.AbortError
//	        (dist's first cause: culprit and kind) or a *dist.PeerError.
//	freeze  the parent SIGSTOPs one rank; every survivor must name it as
//	        frozen or lost, with no deadline set by anyone: found by
//	        the transport's heartbeat (default, or -heartbeat).
//	desync  one rank calls the all-reduce with one element fewer, and closes
//	        its group as soon as the call fails; every rank must report a
//	        desync (a *dist.DesyncError, or an abort of kind desync), none a
//	        peer that closed or was lost.
//	cancel  the parent signals two ranks at once (SIGUSR1), which cancel the
//	        context of the running all-reduce and close their group; each
//	        must report its own cancellation or the other's (kind cancelled),
//	        and the third rank one of theirs: nobody may report a peer that
//	        closed or was lost, or name the third rank.
//	cancel-all
//	        the parent signals every rank at once: every rank whose
//	        all-reduce saw its own context end must report that
//	        (errors.Is(err, context.Canceled)), whichever rank's notice came
//	        first; a rank whose call returned before its context ended may
//	        report another's cancellation instead. (Run it with -count
//	        4194304 for issue 21's 16 MiB all-reduce.)
//
// Each rank prints its final error on one line (rank, type of the error,
// the rank it names, kind, iteration, time), classified with errors.As and
// errors.Is; the parent judges the lines of every run. A run is "wrong" when
// any rank's error is not one the scenario allows (a wrong rank or a wrong
// cause), "healthy" when one of those errors names as its culprit a rank
// that did not fail, and "no-report" when a rank printed nothing in
// time (a hang). The detection time of a run is the time from the fault
// (the signal sent, or the desynced call) until the last rank's error. The
// summary table has, per scenario: runs, wrong, healthy, no-report,
// detection-time percentiles and the outcomes seen (type/kind: count). The
// program exits 1 if any run was wrong or unreported.
//
// With -local the ranks of every job are goroutines of this process
// connected by the in-process transport (transport.Local) instead of OS
// processes: the scenarios kill (the transport's Kill), desync, cancel and
// cancel-all (the victims' contexts cancelled directly).
//
// With -soak D it runs instead one 3-rank job for D under load: -hogs
// processes running `yes` (spawned and killed by this program; default one
// per CPU) while the ranks all-reduce -count float32 and, between
// all-reduces, compute for -compute on the CPU. Nobody fails, so any error
// is a false detection; it prints the iterations, the slowest all-reduce and
// the count of false detections, and exits 1 if there was any.
//
// # Usage
//
//	go run ./bench/failures                          # 5 runs of each scenario
//	go run ./bench/failures -n 500 -parallel 1       # the report's figures
//	go run ./bench/failures -scenarios freeze -n 20 -parallel 4 -heartbeat 3s
//	go run ./bench/failures -soak 10m -hogs 2        # false detections under load
//
// Flags:
//
//	-n N             runs of each scenario (default 5)
//	-scenarios L     comma-separated subset of kill,freeze,desync,cancel
//	-count N         float32 elements per all-reduce (default 1M = 1048576)
//	-parallel P      jobs run at once (default 1; freeze runs are idle and
//	                 overlap well, the others compete for the CPUs)
//	-heartbeat D     GDIST_HEARTBEAT_TIMEOUT for the ranks (default: unset,
//	                 the transport's default)
//	-jitter D        the fault comes a random time in [0, D) after every rank
//	                 is ready (default 20ms: mid all-reduce)
//	-local           ranks as goroutines over the in-process transport
//	-v               print every run's verdict
//	-soak D          soak mode for D instead of the scenarios
//	-hogs N          CPU hogs during the soak (default: runtime.NumCPU())
//	-compute D       CPU work per iteration during the soak (default 5ms)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/gdist/gdist"
	"github.com/gdist/gdist/internal/cli"
)

// Environment of a rank started by this program.
const (
	childEnv   = "GDIST_FAILURES_CHILD"   // the scenario, or "soak"
	victimsEnv = "GDIST_FAILURES_VICTIMS" // comma-separated failing ranks
	untilEnv   = "GDIST_FAILURES_UNTIL"   // soak: stop after this Unix time (ns)
)

// world is the number of ranks of every job.
const world = 3

var allScenarios = []string{"kill", "freeze", "desync", "cancel", "cancel-all"}

type options struct {
	n         int
	scenarios []string
	count     int
	parallel  int
	heartbeat time.Duration
	jitter    time.Duration
	verbose   bool
	local     bool
	soak      time.Duration
	hogs      int
	compute   time.Duration
}

// errUsage reports bad command-line arguments (already printed).
var errUsage = errors.New("failures: usage")

// errFailed is returned when a run was wrong or a rank did not report, or
// the soak saw a false detection.
var errFailed = errors.New("failures: diagnosis failed")

func main() { cli.Main("failures", errUsage, run) }

// run is the program: the parent, or one rank when childEnv is set.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("failures", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if role := os.Getenv(childEnv); role != "" {
		return runRank(ctx, o, role, os.Getenv(victimsEnv), os.Getenv(untilEnv), stdout)
	}
	if o.soak > 0 {
		return runSoak(ctx, o, args, stdout)
	}
	return runScenarios(ctx, o, args, stdout, stderr)
}

func parseFlags(fs *flag.FlagSet, args []string) (options, error) {
	var o options
	fs.IntVar(&o.n, "n", 5, "runs of each scenario")
	sc := fs.String("scenarios", strings.Join(allScenarios, ","), "scenarios to run, comma-separated")
	fs.IntVar(&o.count, "count", 1<<20, "float32 elements per all-reduce")
	fs.IntVar(&o.parallel, "parallel", 1, "jobs run at once")
	fs.DurationVar(&o.heartbeat, "heartbeat", 0, "GDIST_HEARTBEAT_TIMEOUT for the ranks (0: unset)")
	fs.DurationVar(&o.jitter, "jitter", 20*time.Millisecond, "the fault comes a random time in [0, jitter) after every rank is ready")
	fs.BoolVar(&o.verbose, "v", false, "print every run's verdict")
	fs.BoolVar(&o.local, "local", false, "run each job's ranks as goroutines over the in-process transport (kill, desync, cancel, cancel-all)")
	fs.DurationVar(&o.soak, "soak", 0, "soak for this long instead of running the scenarios")
	fs.IntVar(&o.hogs, "hogs", runtime.NumCPU(), "CPU hogs (`yes`) during the soak")
	fs.DurationVar(&o.compute, "compute", 5*time.Millisecond, "CPU work per iteration during the soak")
	if err := cli.Parse(fs, args, errUsage); err != nil {
		return o, err
	}
	bad := func(format string, a ...any) (options, error) {
		return o, cli.Usagef(fs, errUsage, format, a...)
	}
	if o.local && *sc == strings.Join(allScenarios, ",") { // the default
		*sc = strings.Join(localScenarios, ",")
	}
	for _, s := range strings.Split(*sc, ",") {
		if !slices.Contains(allScenarios, s) {
			return bad("unknown scenario %q (want some of %s)", s, strings.Join(allScenarios, ","))
		}
		if o.local && !slices.Contains(localScenarios, s) {
			return bad("-local runs %s, not %q", strings.Join(localScenarios, ","), s)
		}
		o.scenarios = append(o.scenarios, s)
	}
	switch {
	case o.n < 1:
		return bad("-n must be at least 1, got %d", o.n)
	case o.count < 2:
		return bad("-count must be at least 2, got %d", o.count)
	case o.parallel < 1:
		return bad("-parallel must be at least 1, got %d", o.parallel)
	case o.heartbeat < 0, o.jitter < 0, o.soak < 0, o.compute < 0:
		return bad("durations must not be negative")
	case o.hogs < 0:
		return bad("-hogs must not be negative, got %d", o.hogs)
	case o.local && o.soak > 0:
		return bad("-soak runs OS processes: not with -local")
	}
	return o, nil
}

// rankEnv is the environment every rank of a job gets besides the
// launcher's.
func (o options) rankEnv(role string, victims []int) []string {
	vs := make([]string, len(victims))
	for i, v := range victims {
		vs[i] = fmt.Sprint(v)
	}
	env := []string{childEnv + "=" + role, victimsEnv + "=" + strings.Join(vs, ",")}
	if o.heartbeat > 0 {
		env = append(env, gdist.EnvHeartbeatTimeout+"="+o.heartbeat.String())
	}
	return env
}
