package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
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

// drainTimeout bounds the wait for the output pipes once every rank has
// been reaped and its process group killed.
const drainTimeout = 2 * time.Second

// errTimedOut reports that -timeout expired.
var errTimedOut = errors.New("job timed out")

// rankError names the rank whose failure stopped the job.
type rankError struct {
	Rank int   // global rank
	Err  error // usually an *exec.ExitError
}

func (e *rankError) Error() string { return fmt.Sprintf("rank %d failed first: %v", e.Rank, e.Err) }

// Unwrap returns the rank's exit error.
func (e *rankError) Unwrap() error { return e.Err }

// signalError reports that gdistrun received a signal and stopped the job.
type signalError struct{ Sig os.Signal }

func (e *signalError) Error() string {
	return fmt.Sprintf("received %v; stopped all ranks", e.Sig)
}

// run starts cfg.nproc ranks of cfg.argv, supervises them and returns
// gdistrun's exit status with the reason it is not 0. Child output goes
// to stdout and stderr (prefixed with the rank unless cfg.noPrefix). run
// returns only after every child has been reaped.
func run(ctx context.Context, cfg config, stdout, stderr io.Writer) (int, error) {
	environ := cfg.environ
	if environ == nil {
		environ = os.Environ()
	}
	job, err := resolveJob(cfg, environ)
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

	out := newOutputs(stdout, stderr, cfg.noPrefix)
	procs := make([]*rankProc, 0, cfg.nproc)
	events := make(chan exitEvent, cfg.nproc)
	for local := range cfg.nproc {
		p, err := startRank(cfg, job, environ, local, out)
		if err != nil {
			for _, q := range procs {
				q.signal(os.Kill)
			}
			for range procs {
				<-events
			}
			out.drain(drainTimeout)
			return startFailureStatus(err), fmt.Errorf("start rank %d: %w", job.globalRank(local), err)
		}
		procs = append(procs, p)
		go func() { events <- exitEvent{p, p.wait()} }()
	}
	code, err := supervise(ctx, cfg, procs, events)
	out.drain(drainTimeout)
	return code, err
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

// exitEvent is sent once per rank when it has been reaped.
type exitEvent struct {
	p   *rankProc
	err error // from exec.Cmd.Wait
}

// supervise waits for every rank to exit. The first rank to fail, a
// signal on cfg.signals or the end of ctx stops the job: every remaining
// rank's process group gets SIGTERM (or the received signal) and, after
// cfg.killGrace, SIGKILL. A second signal kills at once.
func supervise(ctx context.Context, cfg config, procs []*rankProc, events <-chan exitEvent) (int, error) {
	var (
		code     int
		reason   error
		stopping bool
		grace    *time.Timer
		graceC   <-chan time.Time
		done     = ctx.Done()
	)
	stop := func(sig os.Signal) {
		stopping = true
		for _, p := range procs {
			p.signal(sig)
		}
		grace = time.NewTimer(cfg.killGrace)
		graceC = grace.C
	}
	killAll := func() {
		for _, p := range procs {
			p.signal(os.Kill)
		}
	}
	for remaining := len(procs); remaining > 0; {
		select {
		case ev := <-events:
			remaining--
			if ev.err != nil && !stopping {
				reason = &rankError{Rank: ev.p.rank, Err: ev.err}
				code = exitStatusOf(ev.err)
				stop(syscall.SIGTERM)
			}
		case sig := <-cfg.signals:
			if stopping {
				killAll()
				continue
			}
			reason = &signalError{Sig: sig}
			code = exitSignalBase + signalNumber(sig)
			stop(sig)
		case <-done:
			done = nil
			if stopping {
				continue
			}
			reason, code = ctx.Err(), 1
			if errors.Is(reason, context.DeadlineExceeded) {
				reason, code = errTimedOut, exitTimeout
				if cfg.timeout > 0 {
					reason = fmt.Errorf("%w after %v", errTimedOut, cfg.timeout)
				}
			}
			stop(syscall.SIGTERM)
		case <-graceC:
			graceC = nil
			killAll()
		}
	}
	if grace != nil {
		grace.Stop()
	}
	return code, reason
}

// exitStatusOf returns the shell-style status of a rank's Wait error.
func exitStatusOf(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ProcessState != nil {
		return exitStatus(ee.ProcessState)
	}
	return 1
}

// rankProc is one running child and the leader of its process group.
type rankProc struct {
	rank int // global rank
	cmd  *exec.Cmd

	// mu is held while the child is reaped, so that its pid (the group id)
	// is never signalled after the kernel may have reused it.
	mu     sync.Mutex
	reaped bool
}

// startRank starts the child with the given local rank.
func startRank(cfg config, job jobEnv, environ []string, local int, out *outputs) (*rankProc, error) {
	rank := job.globalRank(local)
	cmd := exec.Command(cfg.argv[0], cfg.argv[1:]...)
	if cmd.Err != nil {
		return nil, cmd.Err
	}
	cmd.Env = rankEnv(environ, job, local)
	cmd.SysProcAttr = sysProcAttr()
	if local == 0 && cfg.stdin != nil {
		cmd.Stdin = cfg.stdin
	}
	prefix := "[" + strconv.Itoa(rank) + "] "
	var parentEnds []*os.File // our copies of the pipes' write ends
	defer func() {
		for _, f := range parentEnds {
			f.Close()
		}
	}()
	for _, s := range []struct {
		stream outputStream
		set    func(io.Writer)
	}{
		{out.stdout, func(w io.Writer) { cmd.Stdout = w }},
		{out.stderr, func(w io.Writer) { cmd.Stderr = w }},
	} {
		w, closeAfter, err := out.attach(s.stream, prefix)
		if err != nil {
			return nil, err
		}
		if closeAfter != nil {
			parentEnds = append(parentEnds, closeAfter)
		}
		s.set(w)
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &rankProc{rank: rank, cmd: cmd}, nil
}

// signal sends sig to the rank's process group unless the rank has been
// reaped.
func (p *rankProc) signal(sig os.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.reaped {
		_ = signalGroup(p.cmd.Process.Pid, sig)
	}
}

// wait waits for the child to exit, kills whatever it left running in its
// process group (a grandchild such as the binary `go run` started) and
// reaps it.
func (p *rankProc) wait() error {
	pid := p.cmd.Process.Pid
	if waitExited(pid) {
		// The child is a zombie: its pid cannot be reused until Wait.
		p.mu.Lock()
		defer p.mu.Unlock()
		_ = signalGroup(pid, os.Kill)
		err := p.cmd.Wait()
		p.reaped = true
		return err
	}
	err := p.cmd.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = signalGroup(pid, os.Kill)
	p.reaped = true
	return err
}

// outputStream is one of the launcher's output streams.
type outputStream struct {
	raw    io.Writer   // as given to run
	shared *syncWriter // raw, serialised across ranks
}

// outputs connects the ranks' stdout and stderr to the launcher's and
// owns the goroutines that copy them.
type outputs struct {
	stdout, stderr outputStream
	noPrefix       bool

	wg      sync.WaitGroup
	mu      sync.Mutex
	readers []*os.File // read ends of the pipes, closed by drain
}

func newOutputs(stdout, stderr io.Writer, noPrefix bool) *outputs {
	return &outputs{
		stdout:   outputStream{raw: stdout, shared: &syncWriter{w: stdout}},
		stderr:   outputStream{raw: stderr, shared: &syncWriter{w: stderr}},
		noPrefix: noPrefix,
	}
}

// attach returns what a child should write one stream to. Without a
// prefix, a file destination is handed to the child as is. Otherwise it is
// the write end of a pipe, which the caller must close once the child has
// started (closeAfter), and a goroutine copies the pipe to the destination
// until every holder of the write end has exited or drain gives up.
func (o *outputs) attach(s outputStream, prefix string) (w io.Writer, closeAfter *os.File, err error) {
	if o.noPrefix {
		if f, ok := s.raw.(*os.File); ok {
			return f, nil, nil
		}
	}
	r, pw, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("output pipe: %w", err)
	}
	var sink io.Writer = &lenientWriter{w: s.shared}
	var flush func() error
	if !o.noPrefix {
		p := newPrefixWriter(s.shared, prefix)
		sink, flush = p, p.Flush
	}
	o.mu.Lock()
	o.readers = append(o.readers, r)
	o.mu.Unlock()
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		_, _ = io.Copy(sink, r) // ends at EOF, or when drain closes r
		if flush != nil {
			_ = flush()
		}
	}()
	return pw, pw, nil
}

// drain waits for the copy goroutines to finish, up to timeout after which
// it closes the pipes under them (something outside the ranks' process
// groups still holds a write end), and then waits for them to return.
func (o *outputs) drain(timeout time.Duration) {
	done := make(chan struct{})
	go func() {
		o.wg.Wait()
		close(done)
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		o.closeReaders()
		<-done
	}
	o.closeReaders()
}

func (o *outputs) closeReaders() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, r := range o.readers {
		r.Close()
	}
}

// lenientWriter passes writes on until the first error and then discards
// them, always reporting success, so that a broken launcher stdout never
// blocks a child on a full pipe.
type lenientWriter struct {
	w      io.Writer
	failed bool
}

func (l *lenientWriter) Write(p []byte) (int, error) {
	if !l.failed {
		if _, err := l.w.Write(p); err != nil {
			l.failed = true
		}
	}
	return len(p), nil
}
