//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/gdist/gdist/internal/launch"
)

// runSoak runs one 3-rank job for o.soak with o.hogs CPU hogs and counts
// the ranks that failed: nobody is made to fail, so every error is a false
// detection.
func runSoak(ctx context.Context, o options, args []string, stdout io.Writer) error {
	hogs, err := startHogs(o.hogs)
	defer stopHogs(hogs)
	if err != nil {
		return err
	}
	until := time.Now().Add(o.soak)
	events := make(chan event, 16)
	var tail rankTail
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	env := append(o.rankEnv("soak", nil), untilEnv+"="+strconv.FormatInt(until.UnixNano(), 10))
	start := time.Now()
	r, err := launch.Start(rctx, launch.Job{
		Spec:      launch.Spec{NProc: world},
		Args:      args,
		Env:       env,
		Procs:     1,
		KeepGoing: true,
		KillGrace: time.Second,
		Output: func(rank int) (io.Writer, io.Writer) {
			return launch.LineFunc(func(l string) {
					if ev, ok, err := parseLine(l); ok && err == nil && ev.What == "result" {
						select {
						case events <- ev:
						default:
						}
					}
				}), launch.LineFunc(func(l string) {
					tail.add(rank, l)
				})
		},
	})
	if err != nil {
		return err
	}
	defer func() { cancel(); _ = r.Wait() }()
	reports := map[int]report{}
	deadline := time.NewTimer(o.soak + 2*time.Minute)
	defer deadline.Stop()
collect:
	for len(reports) < world {
		select {
		case ev := <-events:
			reports[ev.Rank] = ev.Report
		case <-r.Done():
			for len(events) > 0 {
				ev := <-events
				reports[ev.Rank] = ev.Report
			}
			break collect
		case <-deadline.C:
			break collect
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	took := time.Since(start)
	hb := "default"
	if o.heartbeat > 0 {
		hb = o.heartbeat.String()
	}
	falseDetections := 0
	fmt.Fprintf(stdout, "# soak: %d ranks (GOMAXPROCS=1, GDIST_TRANSPORT=%s) for %v, all_reduce of %d float32 + %v compute per iteration, %d CPU hogs, heartbeat %s\n",
		world, transportName(o), o.soak, o.count, o.compute, len(hogs), hb)
	for rank := range world {
		rep, ok := reports[rank]
		switch {
		case !ok:
			falseDetections++
			fmt.Fprintf(stdout, "rank %d: no report (stderr: %s)\n", rank, tail.String())
		case rep.Type != typeNone:
			falseDetections++
			fmt.Fprintf(stdout, "rank %d: FALSE DETECTION after %.1fs at iteration %d: %s/%s naming rank %d: %s\n",
				rank, rep.At.Sub(start).Seconds(), rep.Iter, rep.Type, rep.Kind, rep.Peer, rep.Msg)
		default:
			fmt.Fprintf(stdout, "rank %d: ok: %s (%.1f iterations/s)\n", rank, rep.Msg, float64(rep.Iter)/took.Seconds())
		}
	}
	fmt.Fprintf(stdout, "false detections: %d in %.1fs\n", falseDetections, took.Seconds())
	if falseDetections > 0 {
		return fmt.Errorf("%w: %d false detections", errFailed, falseDetections)
	}
	return nil
}

// startHogs starts n `yes` processes writing to /dev/null: each keeps one
// CPU busy. On error it returns the ones it started.
func startHogs(n int) ([]*exec.Cmd, error) {
	if n == 0 {
		return nil, nil
	}
	yes, err := exec.LookPath("yes")
	if err != nil {
		return nil, fmt.Errorf("failures: CPU hogs: %w", err)
	}
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("failures: CPU hogs: %w", err)
	}
	defer null.Close() // the children have their own copies
	var hogs []*exec.Cmd
	for range n {
		c := exec.Command(yes)
		c.Stdout = null
		c.SysProcAttr = hogAttr()
		if err := c.Start(); err != nil {
			return hogs, fmt.Errorf("failures: CPU hog: %w", err)
		}
		hogs = append(hogs, c)
	}
	return hogs, nil
}

// stopHogs kills and reaps the hogs startHogs started.
func stopHogs(hogs []*exec.Cmd) {
	for _, c := range hogs {
		if err := c.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
			fmt.Fprintln(os.Stderr, "failures: kill CPU hog:", err)
		}
		_ = c.Wait()
	}
}
