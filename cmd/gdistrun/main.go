package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/gdist/gdist/internal/logx"
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
whole job when one rank fails (and, with -max-restarts, starts it again).

Flags take one dash or two; torchrun's spellings (--nproc-per-node,
--nproc_per_node, --master_port, --rdzv-backend, --nnodes N:N, ...) and
mpirun's -np are accepted as well. gdist jobs have a fixed size: torchrun's
elastic ranges (--nnodes 1:4) and rendezvous backends other than static
and c10d are refused, saying why.

Flags:
`

const usageTail = `
Environment of each rank:
  RANK                global rank: node-rank*n + local rank
  LOCAL_RANK          rank on this node, 0..n-1
  WORLD_SIZE          nnodes*n
  LOCAL_WORLD_SIZE    n
  MASTER_ADDR         -master-addr
  MASTER_PORT         -master-port, or a free port gdistrun picks
  GDIST_TOKEN         job token: passed through if set, else 32 random bytes
                      in hex, fresh for every attempt
  GDIST_RESTART_COUNT how many times the job was restarted before (0 first)
  GOMAXPROCS          unless set for gdistrun: max(1, CPUs / n), so that n
                      ranks do not oversubscribe the CPUs (printed once)
  GDIST_LISTEN_ADDR   with -nnodes > 1, unless set: 0.0.0.0:0, so that ranks
                      on other hosts can reach this host's ranks
  GDIST_HEARTBEAT_TIMEOUT, GDIST_INIT_TIMEOUT, GDIST_TRANSPORT
                      -heartbeat-timeout, -init-timeout, -transport when
                      given (they win over the inherited environment)
  GDIST_LOG_FORMAT    -log-format when given: text or json
  TORCHELASTIC_RUN_ID --rdzv-id when given, as torchrun sets it

Each rank runs in a process group of its own. If a rank exits non-zero or is
killed, every other rank's group gets SIGTERM, then SIGKILL after -kill-grace,
and gdistrun exits non-zero naming the rank that failed first, e.g.
  gdistrun: rank 1 failed first: signal: killed
Whatever a rank leaves running in its group when it exits is killed.

With -max-restarts N, a failed job is started again, up to N times, with a
fresh rendezvous (a new free port on a single node, the same -master-port
across nodes) and a fresh token (unless GDIST_TOKEN was given), e.g.
  gdistrun: rank 1 failed (signal: killed); restart 1 of 2
A signal to gdistrun or -timeout (which bounds the whole job) ends the job
without a restart.

With -log-dir DIR, each rank's stdout and stderr also go to DIR/rank<N>.log
(N the global rank), appended to, with a header line for every attempt
(torchrun's --tee 3); with --redirects 1, 2 or 3 the ranks' stdout, stderr
or both go to those files only.

With -log-format json (or GDIST_LOG_FORMAT=json in the environment), gdist
logs JSON objects, one a line, on each rank's stderr, and gdistrun's own
messages are JSON records too; the rank prefix stays unless -no-prefix.

Examples:
  gdistrun -n 4 -- ./train -epochs 3
  gdistrun --standalone --nproc-per-node 2 ./train     # torchrun's spelling
  gdistrun -n 2 -- go run ./examples/mnist
  gdistrun -n 2 -max-restarts 3 -log-dir logs -- ./train -resume
  gdistrun -n 2 -timeout 10m -no-prefix -- ./bench

  Two hosts, two ranks each: pick one token and one port, then on each host
  (K = 0 on HOST0, 1 on the other)
    export GDIST_TOKEN=$(openssl rand -hex 32)   # once; copy it to every host
    GDIST_TOKEN=<same> \
      gdistrun -nnodes 2 -node-rank K -n 2 -master-addr HOST0 -master-port 29500 -- ./train
  or, torchrun's way: --nnodes 2 --node-rank K --nproc-per-node 2
  --rdzv-endpoint HOST0:29500. -nnodes > 1 requires -master-port (or
  -rdzv-endpoint) and GDIST_TOKEN.

  With -nnodes > 1 gdistrun sets GDIST_LISTEN_ADDR=0.0.0.0:0 for the ranks, so
  they listen on all interfaces (gdist advertises the address that reaches
  rank 0), unless GDIST_LISTEN_ADDR is set already, e.g. to one interface's
  address, 10.0.0.5:0. On a single node the ranks listen on loopback.

Exit status: 0 when every rank exits 0; otherwise the status of the rank that
failed first (128+N if killed by signal N) in the last attempt, 124 after
-timeout, 128+N after gdistrun receives signal N, 127 (126) if program is not
found (not executable), 2 on usage errors.
`

// cmdFlags are the flags that parseArgs folds into a config.
type cmdFlags struct {
	standalone   bool   // --standalone
	rdzvEndpoint string // --rdzv-endpoint host:port
	rdzvBackend  string // --rdzv-backend: static or c10d
	version      bool   // -version
}

// newFlagSet returns the command's flags, bound to cfg and cf.
func newFlagSet(cfg *config, cf *cmdFlags) *flagSet {
	fs := newFlags("gdistrun")
	fs.add(intValue(&cfg.nproc, defaultNProc), "number of ranks to start on this node (LOCAL_WORLD_SIZE)",
		"n", "np", "nproc-per-node", "nproc_per_node")
	cfg.nnodes = 1
	fs.add(nnodesValue{&cfg.nnodes}, "number of nodes (hosts) in the job, each running gdistrun: `N`, or torchrun's N:N "+
		"(an elastic range M:N is refused: gdist jobs have a fixed size)", "nnodes")
	fs.add(intValue(&cfg.nodeRank, 0), "index of this node, 0..nnodes-1", "node-rank", "node_rank")
	fs.add(stringValue(&cfg.masterAddr, defaultMasterAddr), "address of the node running rank 0 (MASTER_ADDR)",
		"master-addr", "master_addr")
	fs.add(intValue(&cfg.masterPort, 0), "port for rendezvous with rank 0 (MASTER_PORT); 0 picks a free one, single node only",
		"master-port", "master_port")
	fs.add(stringValue(&cf.rdzvEndpoint, ""), "rendezvous endpoint `host:port`: sets -master-addr and -master-port",
		"rdzv-endpoint", "rdzv_endpoint")
	fs.add(boolValue(&cf.standalone), "single node on a free port (what gdistrun does by default)", "standalone")
	fs.add(stringValue(&cf.rdzvBackend, ""), "torchrun's rendezvous backend `name`: static or c10d, both meaning what gdist always does "+
		"(rank 0 hosts the rendezvous at -master-addr:-master-port); others are refused", "rdzv-backend", "rdzv_backend")
	fs.add(stringValue(&cfg.runID, ""), "torchrun's job `id`: accepted and passed to the ranks as TORCHELASTIC_RUN_ID, "+
		"as torchrun does (gdist itself tells jobs apart by their rendezvous port and token)", "rdzv-id", "rdzv_id")
	fs.add(intValue(&cfg.maxRestarts, 0), "restart the whole job up to `N` times when a rank fails",
		"max-restarts", "max_restarts")
	fs.add(stringValue(&cfg.logDir, ""), "also write each rank's output to `DIR`/rank<N>.log", "log-dir", "log_dir")
	fs.add(streamsValue{&cfg.redirects}, "torchrun's `0-3`: send the ranks' stdout (1), stderr (2) or both (3) to the "+
		"-log-dir files only, not to the terminal; 0 (the default): to both. Needs -log-dir", "redirects")
	fs.add(streamsValue{&cfg.tee}, "torchrun's `0-3`: accepted; with -log-dir gdistrun always copies both streams to the "+
		"log files and the terminal, which is what --tee 3 asks", "tee")
	fs.add(stringValue(&cfg.logFormat, ""), "format of what gdist logs: `text` (slog's key=value lines, the default) or "+
		"json (one JSON object per line); sets GDIST_LOG_FORMAT for the ranks, and json also makes gdistrun's own "+
		"messages JSON records", "log-format", "log_format")
	fs.add(boolValue(&cfg.noPrefix), "do not prefix output lines with the rank", "no-prefix")
	fs.add(durationValue(&cfg.timeout, 0), "stop the job after this long, restarts included, e.g. 30m (0: no limit)", "timeout")
	fs.add(durationValue(&cfg.killGrace, defaultKillGrace), "time between SIGTERM and SIGKILL when stopping ranks", "kill-grace")
	fs.add(durationValue(&cfg.heartbeatTimeout, 0), "report a rank that stops responding after this long, e.g. 20s (GDIST_HEARTBEAT_TIMEOUT; 0: gdist's default, 10s)",
		"heartbeat-timeout", "heartbeat_timeout")
	fs.add(durationValue(&cfg.initTimeout, 0), "fail the rendezvous, naming the ranks that never joined, after this long (GDIST_INIT_TIMEOUT; 0: gdist's default, 5m)",
		"init-timeout", "init_timeout")
	fs.add(stringValue(&cfg.transport, ""), "how ranks on one host talk: `auto` (shared memory where it sets up, else TCP), tcp or shm (GDIST_TRANSPORT; default auto)",
		"transport")
	fs.add(stringValue(&cfg.bindTo, ""), "`core`: bind each rank to one CPU, local rank i to the i-th the launcher may use (wrapping around when there are more ranks than CPUs; Linux), as Open MPI's --bind-to core does; none (the default): let the kernel place them",
		"bind-to", "bind_to")
	fs.add(boolValue(&cf.version), "print gdistrun's module version and VCS revision, and exit", "version")
	return fs
}

// usage writes the full usage text to w.
func usage(w io.Writer) {
	var (
		cfg config
		cf  cmdFlags
	)
	fs := newFlagSet(&cfg, &cf)
	fmt.Fprint(w, usageHead)
	fs.printDefaults(w)
	fmt.Fprint(w, usageTail)
}

// parseArgs parses the command line (without the program name). On -h it
// writes the usage to stdout and returns flag.ErrHelp; on other errors it
// (or the flag package) has already reported them on stderr.
func parseArgs(args []string, stdout, stderr io.Writer) (config, error) {
	var (
		cfg config
		cf  cmdFlags
	)
	fs := newFlagSet(&cfg, &cf)
	fs.SetOutput(gdistrunPrefix{stderr})
	if name := fs.unknownFlag(args); name != "" {
		hint := ""
		if s := fs.suggest(name); s != "" {
			hint = fmt.Sprintf(" (did you mean -%s?)", s)
		}
		fmt.Fprintf(stderr, "gdistrun: unknown flag -%s%s\nrun 'gdistrun -h' for gdistrun's flags and the torchrun and mpirun spellings it takes\n", name, hint)
		return cfg, fmt.Errorf("%w: unknown flag -%s", errUsage, name)
	}
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
	if cf.version {
		printVersion(stdout)
		return cfg, errVersion
	}
	cfg.argv = fs.Args()
	if err := foldTorchrunFlags(fs, &cfg, cf); err != nil {
		fmt.Fprintf(stderr, "gdistrun: %v\nrun 'gdistrun -h' for usage\n", err)
		return cfg, err
	}
	return cfg, nil
}

// gdistrunPrefix puts "gdistrun: " before what package flag writes (one
// message a Write), so that its errors read as gdistrun's own.
type gdistrunPrefix struct{ w io.Writer }

func (p gdistrunPrefix) Write(b []byte) (int, error) {
	if _, err := p.w.Write(append([]byte("gdistrun: "), b...)); err != nil {
		return 0, err
	}
	return len(b), nil
}

// foldTorchrunFlags applies --rdzv-endpoint and --standalone to cfg,
// rejecting values that contradict other flags, and checks --rdzv-backend,
// --redirects and -log-format.
func foldTorchrunFlags(fs *flagSet, cfg *config, cf cmdFlags) error {
	switch cf.rdzvBackend {
	case "", "static", "c10d":
	default:
		return fmt.Errorf("%w: %s %s is not supported: gdist has no rendezvous backends; rank 0 hosts the rendezvous "+
			"at -master-addr:-master-port, which is what static and c10d mean", errUsage, fs.setBy("rdzv-backend"), cf.rdzvBackend)
	}
	if cfg.redirects != 0 && cfg.logDir == "" {
		return fmt.Errorf("%w: --redirects %d sends output to the -log-dir files instead of the terminal: give -log-dir DIR too",
			errUsage, cfg.redirects)
	}
	if cfg.logFormat != "" {
		f, err := logx.ParseFormat(cfg.logFormat)
		if err != nil {
			return fmt.Errorf("%w: %s: %w", errUsage, fs.setBy("log-format"), err)
		}
		cfg.logFormat = f
	}
	if fs.set("rdzv-endpoint") {
		flagName := fs.setBy("rdzv-endpoint")
		host, portStr, err := net.SplitHostPort(cf.rdzvEndpoint)
		port, perr := strconv.Atoi(portStr)
		switch {
		case err != nil || host == "":
			return fmt.Errorf("%w: %s must be host:port, got %q", errUsage, flagName, cf.rdzvEndpoint)
		case perr != nil || port < 1 || port > 65535:
			return fmt.Errorf("%w: %s: port must be in [1, 65535], got %q", errUsage, flagName, portStr)
		case fs.set("master-addr") && cfg.masterAddr != host:
			return fmt.Errorf("%w: %s=%s conflicts with %s=%s", errUsage, flagName, cf.rdzvEndpoint, fs.setBy("master-addr"), cfg.masterAddr)
		case fs.set("master-port") && cfg.masterPort != port:
			return fmt.Errorf("%w: %s=%s conflicts with %s=%d", errUsage, flagName, cf.rdzvEndpoint, fs.setBy("master-port"), cfg.masterPort)
		}
		cfg.masterAddr, cfg.masterPort = host, port
	}
	if cf.standalone {
		switch {
		case cfg.nnodes != 1:
			return fmt.Errorf("%w: -standalone is a single-node job; it conflicts with %s=%d", errUsage, fs.setBy("nnodes"), cfg.nnodes)
		case cfg.masterPort != 0 || cfg.masterAddr != defaultMasterAddr:
			by := fs.setBy("master-addr")
			if fs.set("rdzv-endpoint") {
				by = fs.setBy("rdzv-endpoint")
			} else if fs.set("master-port") {
				by = fs.setBy("master-port")
			}
			return fmt.Errorf("%w: -standalone picks a free port on %s; it conflicts with %s", errUsage, defaultMasterAddr, by)
		}
	}
	return nil
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
	if errors.Is(err, flag.ErrHelp) || errors.Is(err, errVersion) {
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
		n := newNotes(stderr, cfg, os.Environ())
		n.say(slog.LevelError, "%v", err)
		if errors.Is(err, errUsage) && n.json == nil {
			fmt.Fprintln(stderr, "run 'gdistrun -h' for usage")
		}
	}
	return code
}

func main() {
	os.Exit(mainStatus(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
