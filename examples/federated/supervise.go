package main

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"runtime"
	"strconv"
	"time"

	"github.com/gdist/gdist/internal/launch"
)

// roundDone matches the leader's line at the end of round N.
var roundDone = regexp.MustCompile(`^round +(\d+)/`)

// supervise starts the job — the leader and cfg.Clients clients, each this
// program again as one rank, output prefixed by rank — and plays the part
// of a flaky world: once the leader has printed round KillAt-1 it kills
// client KillClient with SIGKILL, and once it has printed round RestartAt-1
// it starts a new process of that rank, which joins the federation again.
// It returns when the leader has ended and every client with it: a client
// still running a few seconds after the leader (one that was starting when
// the federation ended, and keeps dialing the leader) is stopped. The
// outcome is the leader's.
func supervise(ctx context.Context, cfg config, args []string, stdout, stderr io.Writer) error {
	world := cfg.Clients + 1
	ctx, stopJobs := context.WithCancel(ctx)
	defer stopJobs()
	out, errOut := launch.Synced(stdout), launch.Synced(stderr)
	rounds := make(chan int, cfg.Rounds+1)
	output := func(rank int) (io.Writer, io.Writer) {
		prefix := fmt.Sprintf("[%d] ", rank)
		o := io.Writer(launch.NewPrefixWriter(out, prefix))
		if rank == 0 {
			parse := launch.LineFunc(func(l string) {
				if m := roundDone.FindStringSubmatch(l); m != nil {
					k, _ := strconv.Atoi(m[1])
					rounds <- k
				}
			})
			o = io.MultiWriter(o, parse)
		}
		return o, launch.NewPrefixWriter(errOut, prefix)
	}
	procs := max(1, runtime.NumCPU()/world)
	env := []string{"GDIST_TRANSPORT=auto"}
	run, err := launch.Start(ctx, launch.Job{
		Spec:      launch.Spec{NProc: world},
		Args:      args,
		Env:       env,
		Procs:     procs,
		Output:    output,
		KeepGoing: true, // a client's death is the federation's business, not the job's
	})
	if err != nil {
		return err
	}
	say := func(format string, a ...any) { fmt.Fprintf(out, "supervisor: "+format+"\n", a...) }
	var restarted *launch.Run
	leader := run.Procs()[0]
watch:
	for {
		select {
		case k := <-rounds:
			next := k + 1
			if cfg.KillClient > 0 && next == cfg.KillAt {
				run.Procs()[cfg.KillClient].Kill()
				say("killed client %d with SIGKILL before round %d", cfg.KillClient, next)
			}
			if cfg.KillClient > 0 && next == cfg.RestartAt {
				spec := run.Spec()
				spec.NNodes, spec.NodeRank, spec.NProc = world, cfg.KillClient, 1
				restarted, err = launch.Start(ctx, launch.Job{
					Spec:      spec,
					Args:      args,
					Env:       append(env, "GDIST_RESTART_COUNT=1"),
					Procs:     procs,
					Output:    func(int) (io.Writer, io.Writer) { return output(cfg.KillClient) },
					KeepGoing: true,
				})
				if err != nil {
					return fmt.Errorf("restart client %d: %w", cfg.KillClient, err)
				}
				say("started client %d again before round %d", cfg.KillClient, next)
			}
		case <-leader.Done():
			break watch
		}
	}
	if err := leader.Err(); err != nil {
		stopJobs()
		run.Wait()
		return fmt.Errorf("the leader failed: %w", err)
	}
	// The clients end with the federation (ErrFinished); give them a moment.
	grace := time.NewTimer(clientGrace)
	defer grace.Stop()
	for _, r := range []*launch.Run{run, restarted} {
		if r == nil {
			continue
		}
		select {
		case <-r.Done():
		case <-grace.C:
			say("stopping the clients still running %v after the leader", clientGrace)
			stopJobs()
			<-r.Done()
		}
	}
	return nil
}

// clientGrace is how long clients may run on after the leader has ended.
const clientGrace = 10 * time.Second
