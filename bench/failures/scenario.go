//go:build unix

package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gdist/gdist/dist/transport/tcp"
	"github.com/gdist/gdist/internal/launch"
)

// victims returns the ranks that fail in run i of a scenario: one rank,
// two neighbours for cancel, rotating over the ranks, every rank for
// cancel-all.
func victims(scenario string, i int) []int {
	switch scenario {
	case "cancel":
		return []int{i % world, (i + 1) % world}
	case "cancel-all":
		vs := make([]int, world)
		for r := range vs {
			vs[r] = r
		}
		return vs
	}
	return []int{i % world}
}

// reporters returns the ranks whose final error a scenario judges: the
// survivors of a kill or a freeze, every rank otherwise.
func reporters(scenario string, victims []int) []int {
	var rs []int
	for r := range world {
		if (scenario == "kill" || scenario == "freeze") && slices.Contains(victims, r) {
			continue
		}
		rs = append(rs, r)
	}
	return rs
}

// allowed reports whether rank r's report is a right diagnosis of the
// scenario whose failing ranks are victims; reports are every rank's.
func allowed(scenario string, victims []int, r int, rep report, reports map[int]report) bool {
	// A *dist.PeerError or a *dist.AbortError names a culprit.
	blames := (rep.Type == typePeer || rep.Type == typeAbort) && slices.Contains(victims, rep.Peer)
	// A victim whose context ended between two all-reduces had its next
	// call refused before it started (a bare context error), which aborts
	// nothing: it then closed its group without a notice, and a peer can
	// only see it close.
	left := blames && rep.Kind == kindClosed && reports[rep.Peer].Type == typeCtx
	switch scenario {
	case "kill", "freeze":
		return blames && (rep.Kind == kindLost || rep.Kind == kindUnresponsive)
	case "desync":
		return rep.Type == typeDesync || rep.Type == typeAbort && rep.Kind == kindDesync
	case "cancel":
		// A victim's own cancellation, or a victim's abort notice (an
		// AbortError of kind cancelled, or before it an ErrAborted notice).
		return blames && (rep.Kind == kindCancelled || rep.Kind == kindAborted) || left ||
			slices.Contains(victims, r) && rep.Type == typeCtx && rep.Kind == kindCancelled
	case "cancel-all":
		// Every rank cancelled its own context: a call that saw it end
		// reports that (errors.Is(err, context.Canceled)), whatever notice
		// came first; one that returned before may report a peer's
		// cancellation instead.
		if rep.Own {
			return rep.Canceled
		}
		return rep.Canceled || blames && (rep.Kind == kindCancelled || rep.Kind == kindAborted) || left
	}
	return false
}

// verdict is the judgement of one run.
type verdict struct {
	Run     int
	Victims []int
	Wrong   []string      // one line per rank whose report is not allowed
	Healthy bool          // a wrong report names a rank that did not fail
	Missing []int         // ranks that reported nothing in time
	Detect  time.Duration // fault until the last report (0 when none)
	Reports []report
	Stderr  string // the ranks' last stderr lines, when a rank did not report
	Err     error  // the run could not be carried out (no fault injected)
}

// judge judges the reports of one run.
func judge(scenario string, run int, vs []int, faultAt time.Time, reports map[int]report) verdict {
	v := verdict{Run: run, Victims: vs}
	for _, r := range reporters(scenario, vs) {
		rep, ok := reports[r]
		if !ok {
			v.Missing = append(v.Missing, r)
			continue
		}
		v.Reports = append(v.Reports, rep)
		if !allowed(scenario, vs, r, rep, reports) {
			v.Wrong = append(v.Wrong, fmt.Sprintf("rank %d: %s/%s naming rank %d: %s", r, rep.Type, rep.Kind, rep.Peer, rep.Msg))
			if (rep.Type == typePeer || rep.Type == typeAbort) && !slices.Contains(vs, rep.Peer) {
				v.Healthy = true
			}
		}
		if d := rep.At.Sub(faultAt); d > v.Detect {
			v.Detect = d
		}
	}
	return v
}

// resultTimeout bounds the wait for every report after the fault.
func (o options) resultTimeout(scenario string) time.Duration {
	if scenario != "freeze" {
		return time.Minute
	}
	hb := o.heartbeat
	if hb == 0 {
		hb = tcp.DefaultHeartbeatTimeout
	}
	return hb + 30*time.Second
}

// runScenarios runs every scenario o.n times and prints the summary table.
func runScenarios(ctx context.Context, o options, args []string, stdout, stderr io.Writer) error {
	var sums []summary
	for _, sc := range o.scenarios {
		start := time.Now()
		vs := runMany(ctx, o, sc, args, stderr)
		if err := ctx.Err(); err != nil {
			return err
		}
		s := summarize(sc, vs, time.Since(start))
		sums = append(sums, s)
		fmt.Fprintf(stderr, "failures: %s: %d runs in %.1fs, %d wrong, %d without a report\n",
			sc, s.Runs, s.Took.Seconds(), s.Wrong, s.Missing)
	}
	printTable(stdout, o, sums)
	for _, s := range sums {
		if s.Wrong > 0 || s.Missing > 0 || s.Errors > 0 {
			return fmt.Errorf("%w: see the table", errFailed)
		}
	}
	return nil
}

// runMany runs o.n jobs of one scenario, o.parallel at a time.
func runMany(ctx context.Context, o options, scenario string, args []string, stderr io.Writer) []verdict {
	out := make([]verdict, o.n)
	next := make(chan int)
	var wg sync.WaitGroup
	logw := launch.Synced(stderr)
	for range o.parallel {
		wg.Go(func() {
			for i := range next {
				out[i] = runOnce(ctx, o, scenario, i, args)
				if o.verbose || len(out[i].Wrong) > 0 || len(out[i].Missing) > 0 || out[i].Err != nil {
					fmt.Fprintln(logw, describe(scenario, out[i]))
				}
			}
		})
	}
	for i := range o.n {
		if ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	return out
}

func describe(scenario string, v verdict) string {
	var b strings.Builder
	fmt.Fprintf(&b, "failures: %s run %d (failing %v): ", scenario, v.Run, v.Victims)
	switch {
	case v.Err != nil:
		fmt.Fprintf(&b, "not run: %v", v.Err)
	case len(v.Wrong) == 0 && len(v.Missing) == 0:
		fmt.Fprintf(&b, "ok after %v", v.Detect.Round(time.Millisecond))
	default:
		fmt.Fprintf(&b, "WRONG %v, no report from %v", v.Wrong, v.Missing)
		if v.Stderr != "" {
			fmt.Fprintf(&b, "; stderr: %s", v.Stderr)
		}
	}
	for _, r := range v.Reports {
		fmt.Fprintf(&b, "\n  rank %d: %s/%s peer %d iter %d: %s", r.Rank, r.Type, r.Kind, r.Peer, r.Iter, r.Msg)
	}
	return b.String()
}

// runOnce runs one job of a scenario: start 3 ranks (processes, or with
// -local goroutines of this process), wait until all are ready, make the
// fault, collect the reports, stop the job and judge.
func runOnce(ctx context.Context, o options, scenario string, run int, args []string) verdict {
	if o.local {
		return runOnceLocal(ctx, o, scenario, run)
	}
	vs := victims(scenario, run)
	events := make(chan event, 64)
	var tail rankTail
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r, err := launch.Start(rctx, launch.Job{
		Spec:      launch.Spec{NProc: world},
		Args:      args,
		Env:       o.rankEnv(scenario, vs),
		Procs:     1,
		KeepGoing: true,
		KillGrace: time.Second,
		Output: func(rank int) (io.Writer, io.Writer) {
			return eventLines(events, func(l string) { tail.add(rank, l) }),
				launch.LineFunc(func(l string) { tail.add(rank, l) })
		},
	})
	if err != nil {
		return verdict{Run: run, Victims: vs, Err: err}
	}
	procs := r.Procs()
	defer func() {
		cancel()
		if scenario == "freeze" {
			for _, v := range vs {
				procs[v].Kill() // SIGKILL ends a stopped process too
			}
		}
		_ = r.Wait()
	}()
	inject := func() {
		switch scenario {
		case "kill":
			procs[vs[0]].Kill()
		case "freeze":
			procs[vs[0]].Signal(syscall.SIGSTOP)
		case "cancel", "cancel-all":
			for _, v := range vs {
				procs[v].Signal(syscall.SIGUSR1)
			}
		}
	}
	return drive(ctx, o, scenario, run, vs, events, inject, r.Done(), func() string {
		return fmt.Sprintf("(%v); stderr: %s", r.Wait(), tail.String())
	}, tail.String)
}

// eventLines returns a writer of a rank's stdout that sends its
// gdist-failures lines to events (a rank prints at most three) and hands
// any other line to other.
func eventLines(events chan<- event, other func(string)) io.Writer {
	return launch.LineFunc(func(l string) {
		ev, ok, err := parseLine(l)
		switch {
		case err != nil:
			other(l)
		case ok:
			select {
			case events <- ev:
			default:
			}
		}
	})
}

// drive carries out one started job of a scenario: it waits until every
// rank is ready, makes the fault with inject (unless the scenario's rank
// makes its own), collects the reports from events and judges them. ended
// is closed if the job ends early; endedWhy and stderr describe it.
func drive(ctx context.Context, o options, scenario string, run int, vs []int, events <-chan event,
	inject func(), ended <-chan struct{}, endedWhy, stderr func() string) verdict {
	reports := map[int]report{}
	var faultAt time.Time
	take := func(ev event) {
		switch ev.What {
		case "result":
			reports[ev.Rank] = ev.Report
		case "fault":
			faultAt = ev.At
		}
	}
	ready := map[int]bool{}
	readyBy := time.NewTimer(initTimeout + 30*time.Second)
	defer readyBy.Stop()
	event := func(ev event) {
		if ev.What == "ready" {
			ready[ev.Rank] = true
		}
		take(ev)
	}
	for len(ready) < world {
		select {
		case ev := <-events:
			event(ev)
		case <-ended:
			// A quick job (a desync in-process) may end after every rank
			// was ready: their lines are still in events.
			for drained := false; !drained; {
				select {
				case ev := <-events:
					event(ev)
				default:
					drained = true
				}
			}
			if len(ready) == world {
				break
			}
			return verdict{Run: run, Victims: vs, Err: fmt.Errorf("job ended before every rank was ready %s", endedWhy())}
		case <-readyBy.C:
			return verdict{Run: run, Victims: vs, Err: fmt.Errorf("ranks %v ready after %v; stderr: %s", keys(ready), initTimeout+30*time.Second, stderr())}
		case <-ctx.Done():
			return verdict{Run: run, Victims: vs, Err: ctx.Err()}
		}
	}
	if o.jitter > 0 {
		time.Sleep(rand.N(o.jitter))
	}
	if scenario != "desync" { // the desync's victim makes its own fault
		faultAt = time.Now()
		inject()
	}
	want := reporters(scenario, vs)
	resultsBy := time.NewTimer(o.resultTimeout(scenario))
	defer resultsBy.Stop()
	have := func() bool {
		for _, w := range want {
			if _, ok := reports[w]; !ok {
				return false
			}
		}
		return true
	}
collect:
	for !have() {
		select {
		case ev := <-events:
			take(ev)
		case <-resultsBy.C:
			break collect
		case <-ctx.Done():
			break collect
		}
	}
	// Reports already printed by ranks that exited are in events.
	for drained := false; !drained; {
		select {
		case ev := <-events:
			take(ev)
		default:
			drained = true
		}
	}
	if faultAt.IsZero() {
		faultAt = time.Now()
	}
	v := judge(scenario, run, vs, faultAt, reports)
	if len(v.Missing) > 0 {
		v.Stderr = stderr()
	}
	return v
}

func keys(m map[int]bool) []int {
	var ks []int
	for k := range m {
		ks = append(ks, k)
	}
	sort.Ints(ks)
	return ks
}

// rankTail keeps the last lines of every rank's stderr, for diagnostics.
type rankTail struct {
	mu    sync.Mutex
	lines []string
}

func (t *rankTail) add(rank int, l string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lines = append(t.lines, fmt.Sprintf("[%d] %s", rank, l))
	if len(t.lines) > 20 {
		t.lines = t.lines[len(t.lines)-20:]
	}
}

func (t *rankTail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lines) == 0 {
		return "(none)"
	}
	return strings.Join(t.lines, " | ")
}

// summary is one scenario's row of the table.
type summary struct {
	Scenario string
	Runs     int
	Wrong    int // runs with a report not allowed
	Healthy  int // runs in which a wrong report names a rank that did not fail
	Missing  int // runs in which a rank did not report
	Errors   int // runs that could not be carried out
	Detect   []time.Duration
	Outcomes map[string]int // "type/kind" -> reports
	Examples []string       // the first few wrong reports
	Took     time.Duration
}

func summarize(scenario string, vs []verdict, took time.Duration) summary {
	s := summary{Scenario: scenario, Outcomes: map[string]int{}, Took: took}
	for _, v := range vs {
		if v.Err != nil {
			s.Errors++
			if len(s.Examples) < 3 {
				s.Examples = append(s.Examples, fmt.Sprintf("run %d not run: %v", v.Run, v.Err))
			}
			continue
		}
		s.Runs++
		if v.Healthy {
			s.Healthy++
		}
		if len(v.Wrong) > 0 {
			s.Wrong++
			if len(s.Examples) < 3 {
				s.Examples = append(s.Examples, fmt.Sprintf("run %d (failing %v): %s", v.Run, v.Victims, strings.Join(v.Wrong, "; ")))
			}
		}
		if len(v.Missing) > 0 {
			s.Missing++
		} else {
			s.Detect = append(s.Detect, v.Detect)
		}
		for _, r := range v.Reports {
			s.Outcomes[r.Type+"/"+r.Kind]++
		}
	}
	slices.Sort(s.Detect)
	return s
}

// percentile returns the p-th percentile (nearest rank) of sorted ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	i := int(p/100*float64(len(ds))+0.999999) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

func printTable(w io.Writer, o options, sums []summary) {
	hb := "default"
	if o.heartbeat > 0 {
		hb = o.heartbeat.String()
	}
	ranks := "OS processes on one host, GDIST_TRANSPORT=" + transportName(o) + ", GOMAXPROCS=1"
	if o.local {
		ranks = "goroutines of one process, transport.Local"
	}
	fmt.Fprintf(w, "# failures: %d ranks (%s), all_reduce of %d float32, heartbeat %s, GOOS %s\n",
		world, ranks, o.count, hb, runtime.GOOS)
	fmt.Fprintf(w, "%-10s %5s %6s %7s %9s %9s %9s %9s %9s  %s\n", "scenario", "runs", "wrong", "healthy", "no-report", "p50", "p90", "p99", "max", "outcomes (type/kind: reports)")
	ms := func(d time.Duration) string { return fmt.Sprintf("%.0fms", float64(d)/float64(time.Millisecond)) }
	for _, s := range sums {
		var oc []string
		for k, n := range s.Outcomes {
			oc = append(oc, fmt.Sprintf("%s: %d", k, n))
		}
		sort.Strings(oc)
		fmt.Fprintf(w, "%-10s %5d %6d %7d %9d %9s %9s %9s %9s  %s\n", s.Scenario, s.Runs, s.Wrong, s.Healthy, s.Missing,
			ms(percentile(s.Detect, 50)), ms(percentile(s.Detect, 90)), ms(percentile(s.Detect, 99)),
			ms(percentile(s.Detect, 100)), strings.Join(oc, ", "))
		if s.Errors > 0 {
			fmt.Fprintf(w, "#   %s: %d runs could not be carried out\n", s.Scenario, s.Errors)
		}
		for _, e := range s.Examples {
			fmt.Fprintf(w, "#   %s: %s\n", s.Scenario, e)
		}
	}
}

// transportName is the GDIST_TRANSPORT the ranks inherit: auto (shared
// memory between these ranks on Linux) unless it is set; "local" with
// -local.
func transportName(o options) string {
	if o.local {
		return "local"
	}
	if v := os.Getenv("GDIST_TRANSPORT"); v != "" {
		return v
	}
	return "auto"
}
