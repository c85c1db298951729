//go:build unix

package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/transport"
)

// localScenarios are the scenarios -local runs: a goroutine cannot be
// stopped as a process can (freeze).
var localScenarios = []string{"kill", "desync", "cancel", "cancel-all"}

// runOnceLocal is runOnce with the ranks as goroutines of this process,
// connected by the in-process transport: cancel and cancel-all cancel the
// victims' contexts, kill kills the victim's transport (transport.Local's
// Kill, which its peers see as a crash).
func runOnceLocal(ctx context.Context, o options, scenario string, run int) verdict {
	vs := victims(scenario, run)
	ts, err := transport.NewLocal(world)
	if err != nil {
		return verdict{Run: run, Victims: vs, Err: err}
	}
	events := make(chan event, 64)
	var tail rankTail
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cancels := make([]context.CancelFunc, world)
	ended := make(chan struct{})
	var wg sync.WaitGroup
	for r := range world {
		pg, err := dist.New(ts[r], dist.WithLogger(quiet))
		if err != nil {
			for _, t := range ts {
				t.Close()
			}
			return verdict{Run: run, Victims: vs, Err: fmt.Errorf("rank %d: %w", r, err)}
		}
		opCtx, cancel := context.WithCancel(ctx)
		cancels[r] = cancel
		out := eventLines(events, func(l string) { tail.add(r, l) })
		wg.Go(func() { rankLoop(opCtx, o, pg, scenario, slices.Contains(vs, r), time.Time{}, out) })
	}
	go func() { wg.Wait(); close(ended) }()
	defer func() {
		for _, cancel := range cancels {
			cancel() // the loops of ranks left running end
		}
		for _, t := range ts {
			t.Close()
		}
		<-ended
	}()
	inject := func() {
		switch scenario {
		case "kill":
			ts[vs[0]].Kill()
		case "cancel", "cancel-all":
			for _, v := range vs {
				cancels[v]()
			}
		}
	}
	return drive(ctx, o, scenario, run, vs, events, inject, ended, func() string { return "" }, tail.String)
}
