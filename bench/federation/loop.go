//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gdist/gdist/internal/launch"
)

// runTimeout bounds one run.
const runTimeout = 3 * time.Minute

// outcome is one run's verdict and what was seen.
type outcome struct {
	transport      string
	killed, frozen int
	err            error         // why the run failed; nil if it did not
	took           time.Duration // the whole run
	killLeft       int           // the round whose result named the killed client as left
	killBack       int           // the first round the restarted client was averaged in
	frozenLeft     int           // likewise for the frozen client
	frozenBack     int
}

func (o outcome) String() string {
	s := fmt.Sprintf("%-3s kill %d: left in round %d, back in %d; freeze %d: left in %d, back in %d; %.1fs",
		o.transport, o.killed, o.killLeft, o.killBack, o.frozen, o.frozenLeft, o.frozenBack, o.took.Seconds())
	if o.err != nil {
		s += ": FAILED: " + o.err.Error()
	}
	return s
}

var roundLine = regexp.MustCompile(`^round (\d+) reported \[([\d ]*)\] left \[([\d ]*)\] joined \[([\d ]*)\]$`)

func ints(s string) []int {
	var out []int
	for _, f := range strings.Fields(s) {
		n, _ := strconv.Atoi(f)
		out = append(out, n)
	}
	return out
}

// loop runs the runs and prints the failures and a summary.
func loop(ctx context.Context, cfg config, args []string, out io.Writer) error {
	fmt.Fprintf(out, "federation: %d runs of a leader and %d clients, %d rounds of %d float32; kill before round %d (back 3 rounds later), freeze %v before round %d; heartbeat %v\n",
		cfg.Runs, cfg.Clients, cfg.Rounds, cfg.Dim, cfg.KillAt, cfg.Freeze, cfg.FreezeAt, cfg.Heartbeat)
	var failed []outcome
	var took []time.Duration
	perTransport := map[string]int{}
	for i := range cfg.Runs {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		tr := cfg.Transport
		if tr == "both" {
			tr = []string{"tcp", "shm"}[i%2]
		}
		killed := 1 + i%cfg.Clients
		frozen := 1 + (i+1)%cfg.Clients
		o := oneRun(ctx, cfg, args, tr, killed, frozen)
		perTransport[tr]++
		took = append(took, o.took)
		if cfg.Verbose || o.err != nil {
			fmt.Fprintf(out, "run %3d: %v\n", i+1, o)
		}
		if o.err != nil {
			failed = append(failed, o)
		}
	}
	slices.Sort(took)
	fmt.Fprintf(out, "federation: %d runs (tcp %d, shm %d), %d failed; run time median %.1fs, max %.1fs\n",
		cfg.Runs, perTransport["tcp"], perTransport["shm"], len(failed), took[len(took)/2].Seconds(), took[len(took)-1].Seconds())
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d runs failed", len(failed), cfg.Runs)
	}
	return nil
}

// oneRun runs one job and judges it.
func oneRun(ctx context.Context, cfg config, args []string, transport string, killed, frozen int) (o outcome) {
	o = outcome{transport: transport, killed: killed, frozen: frozen}
	start := time.Now()
	defer func() { o.took = time.Since(start) }()
	ctx, cancel := context.WithTimeout(ctx, runTimeout)
	defer cancel()
	mode := map[string]string{"tcp": "tcp", "shm": "shm"}[transport]
	env := []string{"GDIST_TRANSPORT=" + mode, "GDIST_HEARTBEAT_TIMEOUT=" + cfg.Heartbeat.String()}
	rounds := make(chan []string, cfg.Rounds+1)
	var mu sync.Mutex
	var lines []string // every rank's stderr, for a failure's report
	output := func(rank int) (io.Writer, io.Writer) {
		keep := launch.LineFunc(func(l string) {
			mu.Lock()
			lines = append(lines, fmt.Sprintf("[%d] %s", rank, l))
			mu.Unlock()
		})
		if rank != 0 {
			return io.Discard, keep
		}
		return launch.LineFunc(func(l string) {
			if m := roundLine.FindStringSubmatch(l); m != nil {
				rounds <- m
			}
		}), keep
	}
	role := func(rank int) []string {
		if rank == 0 {
			return []string{roleEnv + "=leader"}
		}
		return []string{roleEnv + "=client"}
	}
	job := launch.Job{Spec: launch.Spec{NProc: cfg.Clients + 1}, Args: args, Env: env, RankEnv: role, Procs: 1,
		Output: output, KeepGoing: true}
	run, err := launch.Start(ctx, job)
	if err != nil {
		o.err = err
		return o
	}
	procs := run.Procs()
	var again *launch.Run
	var thaw <-chan time.Time
	fail := func(err error) {
		if o.err == nil {
			o.err = err
		}
	}
	leaderDone := procs[0].Done()
watch:
	for {
		select {
		case m := <-rounds:
			k, _ := strconv.Atoi(m[1])
			reported, left := ints(m[2]), ints(m[3])
			if slices.Contains(left, killed) && o.killLeft == 0 {
				o.killLeft = k
			}
			if slices.Contains(left, frozen) && o.frozenLeft == 0 {
				o.frozenLeft = k
			}
			if again != nil && o.killBack == 0 && slices.Contains(reported, killed) {
				o.killBack = k
			}
			if o.frozenLeft > 0 && o.frozenBack == 0 && slices.Contains(reported, frozen) {
				o.frozenBack = k
			}
			switch k + 1 {
			case cfg.KillAt:
				procs[killed].Kill()
			case cfg.KillAt + 3:
				spec := run.Spec()
				spec.NNodes, spec.NodeRank, spec.NProc = cfg.Clients+1, killed, 1
				j := job
				j.Spec, j.Env = spec, append(env, "GDIST_RESTART_COUNT=1")
				if again, err = launch.Start(ctx, j); err != nil {
					fail(fmt.Errorf("restart client %d: %w", killed, err))
				}
			case cfg.FreezeAt:
				procs[frozen].Signal(syscall.SIGSTOP)
				thaw = time.After(cfg.Freeze)
			}
		case <-thaw:
			thaw = nil
			procs[frozen].Signal(syscall.SIGCONT)
		case <-leaderDone:
			break watch
		case <-ctx.Done():
			fail(fmt.Errorf("the run did not end within %v", runTimeout))
			break watch
		}
	}
	if thaw != nil {
		procs[frozen].Signal(syscall.SIGCONT)
	}
	if err := procs[0].Err(); err != nil {
		fail(fmt.Errorf("the leader failed: %w", err))
	}
	// The clients end with the federation; wait a little for them.
	grace := time.NewTimer(10 * time.Second)
	defer grace.Stop()
	for r, p := range procs[1:] {
		rank := r + 1
		select {
		case <-p.Done():
		case <-grace.C:
			fail(fmt.Errorf("client %d still runs after the federation ended", rank))
			cancel()
			<-p.Done()
		}
		if rank != killed && p.Err() != nil {
			fail(fmt.Errorf("client %d failed: %w", rank, p.Err()))
		}
	}
	if again != nil {
		if err := again.Wait(); err != nil {
			fail(fmt.Errorf("the restarted client %d failed: %w", killed, err))
		}
	}
	switch {
	case o.killLeft == 0:
		fail(fmt.Errorf("the killed client %d was never reported as left", killed))
	case o.killBack == 0:
		fail(fmt.Errorf("the restarted client %d was never averaged again", killed))
	case o.frozenLeft == 0:
		fail(fmt.Errorf("the frozen client %d was never dropped", frozen))
	case o.frozenBack == 0:
		fail(fmt.Errorf("the frozen client %d was never averaged again", frozen))
	}
	if o.err != nil {
		mu.Lock()
		o.err = errors.Join(o.err, fmt.Errorf("the ranks' stderr:\n%s", strings.Join(lines, "\n")))
		mu.Unlock()
	}
	run.Wait()
	return o
}
