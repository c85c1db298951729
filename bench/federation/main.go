//go:build unix

// Command federation runs a federation N times with clients lost on
// purpose and counts the runs that failed: the stress loop of package
// dist/fed. Each run is a job of a leader and -clients clients, separate OS
// processes (this program re-executes itself through internal/launch,
// GOMAXPROCS=1 each), on one host, linked over TCP or shared memory
// (alternately, or as -transport says). During the run this program:
//
//   - SIGKILLs one client before round -kill-at and starts a new process of
//     its rank before round -kill-at+3, which must join again and be
//     averaged;
//   - SIGSTOPs another client before round -freeze-at for -freeze (longer
//     than the heartbeat timeout, so the leader drops it) and then SIGCONTs
//     it, so that it must reconnect by itself and be averaged again.
//
// The clients' "training" is deterministic (the new weights are the model
// plus a vector that depends on the rank and the round), so after every
// round the leader recomputes FedAvg from the clients that took part and
// checks the model bit for bit: an update averaged into the wrong round, a
// lost one counted, or one of a dead link would show. A run fails when the
// leader fails or finds a wrong model, a client other than the killed one
// exits non-zero, or either faulty client is never averaged again. The
// program prints each failure and a summary and exits 1 if any run failed.
//
// # Usage
//
//	go run ./bench/federation                 # 10 runs
//	go run ./bench/federation -n 100          # the stress loop of BENCHMARKS.md
//	go run ./bench/federation -n 20 -transport shm -v
//
// Flags:
//
//	-n N           runs (default 10)
//	-clients N     clients per run (default 4; at least 2)
//	-rounds N      rounds per run (default 70)
//	-dim N         float32 values in the model (default 4096)
//	-kill-at K     kill a client before round K (default 5)
//	-freeze-at K   freeze another before round K (default 12)
//	-freeze D      for D (default 2.5s)
//	-heartbeat D   the links' heartbeat timeout (default 1s)
//	-pause D       the leader's pause between rounds (default 100ms)
//	-transport M   tcp, shm or both: alternate (default both)
//	-v             print every run's summary line
package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"time"

	"github.com/gdist/gdist/internal/cli"
)

// roleEnv marks a rank process: "leader" or "client".
const roleEnv = "GDIST_FEDERATION_BENCH_ROLE"

var errUsage = errors.New("federation: usage")

// config is the flags, shared by the parent and the ranks (the parent
// passes its arguments on).
type config struct {
	Runs      int
	Clients   int
	Rounds    int
	Dim       int
	KillAt    int
	FreezeAt  int
	Freeze    time.Duration
	Heartbeat time.Duration
	Pause     time.Duration
	Transport string
	Verbose   bool
}

func parse(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("federation", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&c.Runs, "n", 10, "runs")
	fs.IntVar(&c.Clients, "clients", 4, "clients per run")
	fs.IntVar(&c.Rounds, "rounds", 70, "rounds per run")
	fs.IntVar(&c.Dim, "dim", 4096, "float32 values in the model")
	fs.IntVar(&c.KillAt, "kill-at", 5, "kill a client before this round")
	fs.IntVar(&c.FreezeAt, "freeze-at", 12, "freeze another client before this round")
	fs.DurationVar(&c.Freeze, "freeze", 2500*time.Millisecond, "how long the client stays frozen")
	fs.DurationVar(&c.Heartbeat, "heartbeat", time.Second, "the links' heartbeat timeout")
	fs.DurationVar(&c.Pause, "pause", 100*time.Millisecond, "the leader's pause between rounds")
	fs.StringVar(&c.Transport, "transport", "both", "tcp, shm or both (alternate)")
	fs.BoolVar(&c.Verbose, "v", false, "print every run")
	if err := cli.Parse(fs, args, errUsage); err != nil {
		return c, err
	}
	bad := func(format string, a ...any) (config, error) { return c, cli.Usagef(fs, errUsage, format, a...) }
	switch {
	case c.Runs < 1, c.Clients < 2, c.Dim < 1:
		return bad("-n and -dim must be positive and -clients at least 2")
	case c.KillAt < 2 || c.FreezeAt < c.KillAt+4 || c.Rounds < c.FreezeAt+10:
		return bad("need 2 <= -kill-at, -kill-at+4 <= -freeze-at, -freeze-at+10 <= -rounds")
	case time.Duration(c.Rounds-c.FreezeAt)*c.Pause < c.Freeze+3*c.Heartbeat:
		return bad("the rounds after -freeze-at (%d of -pause %v) must outlast -freeze %v and the frozen client's return", c.Rounds-c.FreezeAt, c.Pause, c.Freeze)
	case c.Freeze <= c.Heartbeat:
		return bad("-freeze %v must be longer than -heartbeat %v (the leader must drop the client)", c.Freeze, c.Heartbeat)
	case c.Transport != "tcp" && c.Transport != "shm" && c.Transport != "both":
		return bad("-transport %q: tcp, shm or both", c.Transport)
	}
	return c, nil
}

func main() { cli.Main("federation", errUsage, run) }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parse(args, stderr)
	if err != nil {
		return err
	}
	switch os.Getenv(roleEnv) {
	case "leader":
		return leader(ctx, cfg, stdout)
	case "client":
		return client(ctx, stdout)
	}
	return loop(ctx, cfg, args, stdout)
}
