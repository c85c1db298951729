//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gdist/gdist"
	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/internal/ctxseen"
)

const (
	// readyAfter: a rank says it is ready after this many iterations.
	readyAfter = 3
	// desyncAt is the iteration at which the desync victim calls with one
	// element fewer (after readyAfter, so the parent has seen every rank
	// ready).
	desyncAt = readyAfter + 2
	// initTimeout bounds the rendezvous.
	initTimeout = time.Minute
)

// runRank is one rank: it joins the job, all-reduces in a loop until an
// error (or, in the soak, the agreed end), and prints how it ended.
func runRank(ctx context.Context, o options, role, victimList, until string, out io.Writer) error {
	var victims []int
	if victimList != "" {
		for _, s := range strings.Split(victimList, ",") {
			v, err := strconv.Atoi(s)
			if err != nil {
				return fmt.Errorf("failures: %s=%q: %w", victimsEnv, victimList, err)
			}
			victims = append(victims, v)
		}
	}
	opCtx, cancelOp := context.WithCancel(ctx)
	defer cancelOp()
	if cancels(role) {
		// Before joining: the parent may signal as soon as this rank is
		// ready, and SIGUSR1's default action would kill it.
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGUSR1)
		defer signal.Stop(sig)
		go func() {
			select {
			case <-sig:
				cancelOp()
			case <-opCtx.Done():
			}
		}()
	}
	ictx, cancel := context.WithTimeout(ctx, initTimeout)
	pg, err := gdist.InitFromEnv(ictx)
	cancel()
	if err != nil {
		return err
	}
	var stopAt time.Time
	if role == "soak" {
		ns, err := strconv.ParseInt(until, 10, 64)
		if err != nil {
			_ = pg.Close()
			return fmt.Errorf("failures: %s=%q: %w", untilEnv, until, err)
		}
		stopAt = time.Unix(0, ns)
	}
	rankLoop(opCtx, o, pg, role, slices.Contains(victims, pg.Rank()), stopAt, out)
	return nil
}

// cancels reports whether the ranks of scenario role cancel their context
// when told (SIGUSR1, or in-process their cancel function).
func cancels(role string) bool { return role == "cancel" || role == "cancel-all" }

// rankLoop all-reduces on pg until an error (or, in the soak, the time
// stopAt agreed through the all-reduce) and prints how it ended; it closes
// pg. ctx is the context of the all-reduces (the one cancellation
// cancels).
func rankLoop(ctx context.Context, o options, pg *dist.ProcessGroup, role string, victim bool, stopAt time.Time, out io.Writer) {
	closed := false
	defer func() {
		if !closed {
			_ = pg.Close()
		}
	}()
	rank := pg.Rank()
	buf := make([]float32, o.count)
	for i := range buf {
		buf[i] = float32(rank*len(buf) + i)
	}
	var slowest time.Duration
	for i := 0; ; i++ {
		data := buf
		if role == "desync" && victim && i == desyncAt {
			data = buf[:len(buf)-1]
			fmt.Fprintf(out, "%sfault rank=%d at=%d\n", linePrefix, rank, time.Now().UnixNano())
		}
		if role == "soak" {
			compute(buf, o.compute)
			// The ranks agree through the all-reduce (Max) when to stop:
			// rank 0 raises the flag once the time is up.
			buf[0] = 0
			if rank == 0 && time.Now().After(stopAt) {
				buf[0] = 1
			}
		}
		start := time.Now()
		sc := ctxseen.New(ctx) // whether the call saw its context end
		err := pg.AllReduce(sc, dist.F32(data), dist.Max)
		at := time.Now()
		slowest = max(slowest, at.Sub(start))
		if err != nil {
			typ, peer, kind := classify(err)
			rep := report{Rank: rank, Type: typ, Peer: peer, Kind: kind, Iter: i, At: at,
				Own: sc.Seen(), Canceled: errors.Is(err, context.Canceled), Msg: err.Error()}
			if role == "desync" && victim {
				// The scenario: close at once after the failed call.
				closed = true
				_ = pg.Close()
			}
			fmt.Fprintln(out, rep)
			return
		}
		if i == readyAfter-1 {
			fmt.Fprintf(out, "%sready rank=%d\n", linePrefix, rank)
		}
		if role == "soak" && buf[0] == 1 {
			rep := report{Rank: rank, Type: typeNone, Peer: -1, Kind: kindNone, Iter: i + 1, At: at,
				Msg: fmt.Sprintf("%d iterations, slowest all-reduce %v", i+1, slowest.Round(time.Millisecond))}
			fmt.Fprintln(out, rep)
			return
		}
	}
}

// compute keeps the CPU busy for about d with arithmetic on v (it reads
// the clock every 4096 elements).
func compute(v []float32, d time.Duration) {
	if d <= 0 {
		return
	}
	start := time.Now()
	var acc float32
	for j := 0; ; j++ {
		k := j % len(v)
		acc = acc*0.999 + v[k]
		if k%4096 == 0 && time.Since(start) >= d {
			break
		}
	}
	sink = acc
}

// sink keeps compute's result alive.
var sink float32
