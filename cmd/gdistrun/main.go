package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// Flag defaults.
const (
	defaultNProc      = 1
	defaultMasterAddr = "127.0.0.1"
	defaultKillGrace  = 3 * time.Second
)

const usageHead = `Usage: gdistrun [flags] [--] program [args...]

gdistrun starts -n copies of program on this machine, one per rank, with the
environment torchrun and mpirun users expect, prefixes every output line with
the rank, forwards SIGINT, SIGTERM and SIGHUP to every rank, and stops the
whole job when one rank fails.

Flags:
`

const usageTail = `
Environment of each rank:
  RANK              global rank: node-rank*n + local rank
  LOCAL_RANK        rank on this node, 0..n-1
  WORLD_SIZE        nnodes*n
  LOCAL_WORLD_SIZE  n
  MASTER_ADDR       -master-addr
  MASTER_PORT       -master-port, or a free port gdistrun picks
  GDIST_TOKEN       job token: passed through if set, else 32 random bytes in hex

Each rank runs in a process group of its own. If a rank exits non-zero or is
killed, every other rank's group gets SIGTERM, then SIGKILL after -kill-grace,
and gdistrun exits non-zero naming the rank that failed first, e.g.
  gdistrun: rank 1 failed first: signal: killed
Whatever a rank leaves running in its group when it exits is killed.

Examples:
  gdistrun -n 4 -- ./train -epochs 3
  gdistrun -n 2 -- go run ./examples/mnist
  gdistrun -n 2 -timeout 10m -no-prefix -- ./bench

  Two hosts, two ranks each: pick one token and one port, then on each host
  (K = 0 on HOST0, 1 on the other)
    export GDIST_TOKEN=$(openssl rand -hex 32)   # once; copy it to every host
    GDIST_TOKEN=<same> GDIST_LISTEN_ADDR=0.0.0.0:0 \
      gdistrun -nnodes 2 -node-rank K -n 2 -master-addr HOST0 -master-port 29500 -- ./train

  Ranks listen on loopback unless GDIST_LISTEN_ADDR names an address: on
  multi-host jobs set GDIST_LISTEN_ADDR=0.0.0.0:0 (or one interface's address,
  e.g. 10.0.0.5:0) on each host. -nnodes > 1 requires -master-port and
  GDIST_TOKEN.

Exit status: 0 when every rank exits 0; otherwise the status of the rank that
failed first (128+N if killed by signal N), 124 after -timeout, 128+N after
gdistrun receives signal N, 127 (126) if program is not found (not
executable), 2 on usage errors.
`

// newFlagSet returns the command's flags, bound to cfg.
func newFlagSet(cfg *config) *flag.FlagSet {
	fs := flag.NewFlagSet("gdistrun", flag.ContinueOnError)
	fs.IntVar(&cfg.nproc, "n", defaultNProc, "number of ranks to start on this node (LOCAL_WORLD_SIZE)")
	fs.IntVar(&cfg.nproc, "nproc-per-node", defaultNProc, "same as -n")
	fs.IntVar(&cfg.nnodes, "nnodes", 1, "number of nodes (hosts) in the job, each running gdistrun")
	fs.IntVar(&cfg.nodeRank, "node-rank", 0, "index of this node, 0..nnodes-1")
	fs.StringVar(&cfg.masterAddr, "master-addr", defaultMasterAddr, "address of the node running rank 0 (MASTER_ADDR)")
	fs.IntVar(&cfg.masterPort, "master-port", 0, "port for rendezvous with rank 0 (MASTER_PORT); 0 picks a free one, single node only")
	fs.BoolVar(&cfg.noPrefix, "no-prefix", false, "do not prefix output lines with the rank")
	fs.DurationVar(&cfg.timeout, "timeout", 0, "stop the job after this long, e.g. 30m (0: no limit)")
	fs.DurationVar(&cfg.killGrace, "kill-grace", defaultKillGrace, "time between SIGTERM and SIGKILL when stopping ranks")
	return fs
}

// usage writes the full usage text to w.
func usage(w io.Writer) {
	var cfg config
	fs := newFlagSet(&cfg)
	fs.SetOutput(w)
	fmt.Fprint(w, usageHead)
	fs.PrintDefaults()
	fmt.Fprint(w, usageTail)
}

// parseArgs parses the command line (without the program name). On -h it
// writes the usage to stdout and returns flag.ErrHelp; on other errors the
// flag package has already reported them on stderr.
func parseArgs(args []string, stdout, stderr io.Writer) (config, error) {
	var cfg config
	fs := newFlagSet(&cfg)
	fs.SetOutput(stderr)
	usageCalled := false
	fs.Usage = func() {
		usageCalled = true
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(stdout)
		} else if usageCalled {
			fmt.Fprintln(stderr, "run 'gdistrun -h' for usage")
		}
		return cfg, err
	}
	cfg.argv = fs.Args()
	return cfg, nil
}

// stdinFor returns f if ranks may read it: a pipe or a file, not a
// terminal (a rank outside the terminal's foreground process group that
// reads it would be stopped by SIGTTIN).
func stdinFor(f *os.File) *os.File {
	st, err := f.Stat()
	if err != nil || st.Mode()&os.ModeCharDevice != 0 {
		return nil
	}
	return f
}

// mainStatus runs the command and returns its exit status.
func mainStatus(args []string, stdin *os.File, stdout, stderr io.Writer) int {
	cfg, err := parseArgs(args, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		return exitUsage
	}

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	// A closed stdout must not kill the launcher (and orphan the ranks'
	// children): with SIGPIPE handled, writes fail with EPIPE instead and
	// the ranks' output is discarded.
	pipes := make(chan os.Signal, 1)
	signal.Notify(pipes, syscall.SIGPIPE)
	defer signal.Stop(pipes)

	cfg.signals = sigs
	cfg.stdin = stdinFor(stdin)
	code, err := run(context.Background(), cfg, stdout, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "gdistrun: %v\n", err)
		if errors.Is(err, errUsage) {
			fmt.Fprintln(stderr, "run 'gdistrun -h' for usage")
		}
	}
	return code
}

func main() {
	os.Exit(mainStatus(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
