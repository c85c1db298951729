package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"time"

	"github.com/gdist/gdist/internal/launch"
)

// config is what the command line asks for, plus the launcher's plumbing.
type config struct {
	nproc      int           // -n: ranks on this node
	nnodes     int           // -nnodes
	nodeRank   int           // -node-rank
	masterAddr string        // -master-addr
	masterPort int           // -master-port; 0 picks a free port (single node only)
	noPrefix   bool          // -no-prefix
	timeout    time.Duration // -timeout; 0 means none
	killGrace  time.Duration // -kill-grace: SIGTERM to SIGKILL
	argv       []string      // program and its arguments

	environ []string         // base environment of the ranks; nil means os.Environ()
	stdin   *os.File         // stdin of local rank 0 when non-nil; other ranks read /dev/null
	signals <-chan os.Signal // signals to forward to every rank; nil for none
}

// Exit statuses of gdistrun itself. A failed rank's own status is passed on.
const (
	exitUsage      = 2
	exitTimeout    = 124
	exitCannotExec = 126
	exitNotFound   = 127
	exitSignalBase = 128
)

// errTimedOut reports that -timeout expired.
var errTimedOut = errors.New("job timed out")

// run starts cfg.nproc ranks of cfg.argv through package launch, supervises
// them and returns gdistrun's exit status with the reason it is not 0.
// Child output goes to stdout and stderr (prefixed with the rank unless
// cfg.noPrefix). run returns only after every child has been reaped.
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
	if cfg.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.timeout)
		defer cancel()
	}
	output := launch.Prefixed(stdout, stderr)
	if cfg.noPrefix {
		so, se := passThrough(stdout), passThrough(stderr)
		output = func(int) (io.Writer, io.Writer) { return so, se }
	}
	r, err := launch.Start(ctx, launch.Job{
		Spec:      spec,
		Program:   cfg.argv[0],
		Args:      cfg.argv[1:],
		Environ:   environ,
		Output:    output,
		Stdin:     cfg.stdin,
		Signals:   cfg.signals,
		KillGrace: cfg.killGrace,
	})
	if err != nil {
		return startFailureStatus(err), err
	}
	err = r.Wait()
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
