package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gdist/gdist/internal/launch"
	"github.com/gdist/gdist/internal/logx"
)

// config is what the command line asks for, plus the launcher's plumbing.
type config struct {
	nproc       int           // -n: ranks on this node
	nnodes      int           // -nnodes
	nodeRank    int           // -node-rank
	masterAddr  string        // -master-addr
	masterPort  int           // -master-port; 0 picks a free port (single node only)
	maxRestarts int           // -max-restarts
	logDir      string        // -log-dir; "" for none
	noPrefix    bool          // -no-prefix
	timeout     time.Duration // -timeout; 0 means none
	killGrace   time.Duration // -kill-grace: SIGTERM to SIGKILL
	// -heartbeat-timeout, -init-timeout: GDIST_HEARTBEAT_TIMEOUT and
	// GDIST_INIT_TIMEOUT for the ranks; 0 leaves them alone
	heartbeatTimeout time.Duration
	initTimeout      time.Duration
	transport        string   // -transport: GDIST_TRANSPORT for the ranks; "" leaves it alone
	bindTo           string   // -bind-to: core or none
	runID            string   // --rdzv-id: TORCHELASTIC_RUN_ID for the ranks; "" leaves it alone
	redirects        int      // --redirects: 1 stdout, 2 stderr, 3 both to the -log-dir files only
	tee              int      // --tee: accepted (-log-dir always copies both streams)
	logFormat        string   // -log-format: GDIST_LOG_FORMAT for the ranks and gdistrun's notes; "" leaves it alone
	argv             []string // program and its arguments

	environ []string         // base environment of the ranks; nil means os.Environ()
	stdin   *os.File         // stdin of local rank 0 when non-nil; other ranks read /dev/null
	signals <-chan os.Signal // signals to forward to every rank; nil for none
	cpus    int              // CPUs the ranks share; 0 means availableCPUs()
}

// Exit statuses of gdistrun itself. A failed rank's own status is passed on.
const (
	exitUsage      = 2
	exitTimeout    = 124
	exitCannotExec = 126
	exitNotFound   = 127
	exitSignalBase = 128
)

// Variables gdistrun sets for the ranks besides launch.Spec's.
const (
	envRestartCount = "GDIST_RESTART_COUNT"
	envListenAddr   = "GDIST_LISTEN_ADDR"       // gdist.EnvListenAddr
	envHeartbeat    = "GDIST_HEARTBEAT_TIMEOUT" // gdist.EnvHeartbeatTimeout
	envInitTimeout  = "GDIST_INIT_TIMEOUT"      // gdist.EnvInitTimeout
	envTransport    = "GDIST_TRANSPORT"         // gdist.EnvTransport
	envRunID        = "TORCHELASTIC_RUN_ID"     // torchrun's name of --rdzv-id for its workers
	envGOMAXPROCS   = "GOMAXPROCS"
	multiNodeListen = "0.0.0.0:0"
)

// errTimedOut reports that -timeout expired.
var errTimedOut = errors.New("job timed out")

// run starts cfg.nproc ranks of cfg.argv through package launch, supervises
// them, starts them again up to cfg.maxRestarts times when one fails, and
// returns gdistrun's exit status with the reason it is not 0. Child output
// goes to stdout and stderr (prefixed with the rank unless cfg.noPrefix),
// and to cfg.logDir if set; gdistrun's own notes go to stderr. run returns
// only after every child has been reaped.
func run(ctx context.Context, cfg config, stdout, stderr io.Writer) (int, error) {
	environ := cfg.environ
	if environ == nil {
		environ = os.Environ()
	}
	spec, err := resolveJob(cfg, environ)
	if err != nil {
		if errors.Is(err, errUsage) {
			return exitUsage, err
		}
		return 1, err
	}
	say := newNotes(stderr, cfg, environ).say
	if cfg.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.timeout)
		defer cancel()
	}
	terminal := launch.Prefixed(stdout, stderr)
	if cfg.noPrefix {
		so, se := passThrough(stdout), passThrough(stderr)
		terminal = func(int) (io.Writer, io.Writer) { return so, se }
	}
	if cfg.redirects != 0 { // to the -log-dir files only
		all := terminal
		terminal = func(rank int) (io.Writer, io.Writer) {
			so, se := all(rank)
			if cfg.redirects&1 != 0 {
				so = nil
			}
			if cfg.redirects&2 != 0 {
				se = nil
			}
			return so, se
		}
	}
	output := terminal
	var logs *rankLogs
	if cfg.logDir != "" {
		if logs, err = openRankLogs(cfg.logDir, spec, cfg.argv); err != nil {
			return 1, err
		}
		defer func() {
			if err := logs.close(); err != nil {
				say(slog.LevelError, "%v", err)
			}
		}()
		output = logs.output(terminal)
	}
	var env []string
	if cfg.nnodes > 1 && lookupEnv(environ, envListenAddr) == "" {
		env = append(env, envListenAddr+"="+multiNodeListen)
	}
	if cfg.heartbeatTimeout > 0 {
		env = append(env, envHeartbeat+"="+cfg.heartbeatTimeout.String())
	}
	if cfg.initTimeout > 0 {
		env = append(env, envInitTimeout+"="+cfg.initTimeout.String())
	}
	if cfg.transport != "" {
		env = append(env, envTransport+"="+cfg.transport)
	}
	if cfg.runID != "" {
		env = append(env, envRunID+"="+cfg.runID)
	}
	if cfg.logFormat != "" {
		env = append(env, logx.EnvFormat+"="+cfg.logFormat)
	}
	procs := 0
	if lookupEnv(environ, envGOMAXPROCS) == "" {
		cpus := cfg.cpus
		if cpus <= 0 {
			cpus = availableCPUs()
		}
		procs = procsPerRank(cpus, cfg.nproc)
		say(slog.LevelInfo, "GOMAXPROCS=%d for %s (%d CPUs; set GOMAXPROCS to override)",
			procs, eachRank(cfg.nproc), cpus)
	}
	sigs := relaySignals(cfg.signals)
	defer sigs.stop()

	attempts := cfg.maxRestarts + 1
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			if spec, err = restartSpec(cfg, environ, spec); err != nil {
				return 1, err
			}
		}
		job := launch.Job{
			Spec:      spec,
			Program:   cfg.argv[0],
			Args:      cfg.argv[1:],
			Environ:   environ,
			Env:       append(slices.Clip(env), envRestartCount+"="+strconv.Itoa(attempt)),
			Procs:     procs,
			Output:    output,
			Stdin:     cfg.stdin,
			Signals:   sigs.out,
			KillGrace: cfg.killGrace,
			Bind:      cfg.bindTo == "core",
		}
		if logs != nil {
			logs.begin(attempt, attempts)
		}
		r, err := launch.Start(ctx, job)
		if err != nil {
			return startFailureStatus(err), err
		}
		if job.Bind && attempt == 0 {
			say(slog.LevelInfo, "-bind-to core: %s", bindings(r.Procs()))
		}
		err = r.Wait()
		if logs != nil {
			logs.end(r.Procs())
		}
		var re *launch.RankError
		if errors.As(err, &re) && attempt < cfg.maxRestarts && ctx.Err() == nil && sigs.received() == nil {
			say(slog.LevelWarn, "rank %d failed (%v); restart %d of %d", re.Rank, re.Err, attempt+1, cfg.maxRestarts)
			continue
		}
		if re != nil && cfg.maxRestarts > 0 {
			err = fmt.Errorf("%w (attempt %d of %d)", err, attempt+1, attempts)
		}
		return exitStatus(cfg, err)
	}
}

// restartSpec returns the spec of the attempt after the one that ran with
// prev: a fresh token unless the user gave one, and on a single node
// without -master-port a new free port (a different one from prev's if one
// can be had in a few tries).
func restartSpec(cfg config, environ []string, prev launch.Spec) (launch.Spec, error) {
	for range 3 {
		spec, err := resolveJob(cfg, environ)
		if err != nil || cfg.masterPort != 0 || spec.MasterPort != prev.MasterPort {
			return spec, err
		}
	}
	return resolveJob(cfg, environ)
}

// exitStatus maps the outcome of the last attempt to gdistrun's exit
// status and the error to report.
func exitStatus(cfg config, err error) (int, error) {
	var (
		re *launch.RankError
		se *launch.SignalError
	)
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &re):
		return launch.ExitStatus(re.Err), err
	case errors.As(err, &se):
		return exitSignalBase + launch.SignalNumber(se.Sig), err
	case errors.Is(err, context.DeadlineExceeded):
		if cfg.timeout > 0 {
			return exitTimeout, fmt.Errorf("%w after %v", errTimedOut, cfg.timeout)
		}
		return exitTimeout, errTimedOut
	}
	return 1, err
}

// availableCPUs returns the number of CPUs gdistrun may run on: Go's
// default GOMAXPROCS (runtime.NumCPU, lowered to the cgroup's CPU limit
// where one is set) when GOMAXPROCS is not set for gdistrun itself.
func availableCPUs() int {
	if os.Getenv(envGOMAXPROCS) == "" {
		return runtime.GOMAXPROCS(0)
	}
	return runtime.NumCPU()
}

// eachRank says "each of n ranks", or "1 rank".
func eachRank(n int) string {
	if n == 1 {
		return "1 rank"
	}
	return "each of " + strconv.Itoa(n) + " ranks"
}

// procsPerRank returns the GOMAXPROCS that lets n ranks share cpus CPUs
// without oversubscribing them: max(1, cpus/n).
func procsPerRank(cpus, n int) int { return max(1, cpus/max(n, 1)) }

// signalRelay passes the signals gdistrun receives on to the running
// attempt's launch (which stops the job) and remembers the first one, so
// that no restart follows it, even if it arrived while the job was already
// stopping after a rank failed, or between attempts.
type signalRelay struct {
	out  chan os.Signal // Job.Signals of every attempt
	quit chan struct{}  // closed by stop
	done chan struct{}  // closed when the relay goroutine returns

	mu  sync.Mutex
	got os.Signal
}

// relaySignals starts relaying in (nil: no signals) until stop.
func relaySignals(in <-chan os.Signal) *signalRelay {
	s := &signalRelay{out: make(chan os.Signal, 4), quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			select {
			case sig := <-in:
				s.mu.Lock()
				if s.got == nil {
					s.got = sig
				}
				s.mu.Unlock()
				select {
				case s.out <- sig:
				default: // launch has not taken the last ones yet; they stop the job as well
				}
			case <-s.quit:
				return
			}
		}
	}()
	return s
}

// received returns the first signal relayed, or nil.
func (s *signalRelay) received() os.Signal {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got
}

// stop ends the relay and waits for its goroutine.
func (s *signalRelay) stop() {
	close(s.quit)
	<-s.done
}

// passThrough returns w for ranks that write without a prefix: a file as
// is (the ranks write to it directly), any other writer made safe for the
// ranks to share.
func passThrough(w io.Writer) io.Writer {
	if f, ok := w.(*os.File); ok {
		return f
	}
	return launch.Synced(w)
}

// startFailureStatus maps a failure to start the program to a shell-like
// exit status.
func startFailureStatus(err error) int {
	switch {
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, fs.ErrNotExist):
		return exitNotFound
	case errors.Is(err, fs.ErrPermission):
		return exitCannotExec
	}
	return 1
}

// bindings describes where the ranks are bound: "rank 0 on CPU 0, rank 1 on
// CPU 1".
func bindings(procs []*launch.Proc) string {
	parts := make([]string, len(procs))
	for i, p := range procs {
		parts[i] = fmt.Sprintf("rank %d on CPU %d", p.Rank, p.CPU)
	}
	return strings.Join(parts, ", ")
}
