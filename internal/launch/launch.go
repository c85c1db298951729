package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// ErrJob reports a Job that cannot be launched as described.
var ErrJob = errors.New("launch: bad job")

// RankError names the rank whose failure stopped the job (or, with
// KeepGoing, the first rank that failed).
type RankError struct {
	Rank int   // global rank
	Err  error // usually an *exec.ExitError
}

func (e *RankError) Error() string { return fmt.Sprintf("rank %d failed first: %v", e.Rank, e.Err) }

// Unwrap returns the rank's exit error.
func (e *RankError) Unwrap() error { return e.Err }

// StartError reports that a rank's process could not be started; the ranks
// already started have been killed and reaped.
type StartError struct {
	Rank int   // global rank
	Err  error // from exec: exec.ErrNotFound, fs.ErrPermission, ...
}

func (e *StartError) Error() string { return fmt.Sprintf("start rank %d: %v", e.Rank, e.Err) }

// Unwrap returns the reason.
func (e *StartError) Unwrap() error { return e.Err }

// SignalError reports that the launcher received a signal on Job.Signals
// and stopped the job.
type SignalError struct{ Sig os.Signal }

func (e *SignalError) Error() string {
	return fmt.Sprintf("received %v; stopped all ranks", e.Sig)
}

// Job describes one launch of Spec.NProc rank processes on this machine.
// The zero value of every field but Spec.NProc is a usable default.
type Job struct {
	Spec

	// Program is the program to start, looked up in PATH if it has no
	// slash; "" re-executes the running binary (os.Executable). Args are
	// its arguments.
	Program string
	Args    []string

	// Environ is the base environment of the ranks (nil: os.Environ()).
	// Env entries are added for every rank after the rank variables, and
	// RankEnv's (if set) after them, so they win. Procs > 0 sets
	// GOMAXPROCS=Procs for every rank (before Env).
	Environ []string
	Env     []string
	RankEnv func(rank int) []string
	Procs   int

	// Output returns where the rank with the given global rank writes its
	// stdout and stderr (nil: /dev/null). An *os.File is handed to the
	// child as is; any other writer gets the output through a pipe and a
	// goroutine the launch owns, which calls the writer's Flush() error
	// method, if it has one, at the end. A writer that fails is not
	// written to again and the child is never blocked by it. Writers of
	// different ranks that share a destination must be safe for
	// concurrent use (see Synced, Prefixed, LineFunc). Output nil sends
	// every rank's output to the launcher's stdout and stderr.
	Output func(rank int) (stdout, stderr io.Writer)

	// Stdin, if set, is the stdin of local rank 0; other ranks read
	// /dev/null.
	Stdin *os.File

	// Signals: a signal received here stops the job (the signal is passed
	// on to every rank; a second one kills at once). Nil for none.
	Signals <-chan os.Signal

	// KillGrace is the time between SIGTERM and SIGKILL when the job is
	// stopped (zero: SIGKILL at once after SIGTERM).
	KillGrace time.Duration

	// KeepGoing: a rank that fails does not stop the others (for tests that
	// kill a rank on purpose and watch the survivors). Wait still reports
	// the first rank that failed.
	KeepGoing bool

	// Bind binds every rank's process to one CPU, as Open MPI's
	// --bind-to core does: local rank i to the (i mod n)-th of the n CPUs
	// the launcher may run on, so ranks share a CPU only when there are
	// more of them than CPUs. The child is bound from its first
	// instruction (it inherits the binding of the thread that starts it).
	// Linux only: elsewhere Start fails with ErrJob.
	Bind bool
}

// drainTimeout bounds the wait for a rank's output pipes once it has been
// reaped and its process group killed (something outside it may still hold
// a write end).
const drainTimeout = 2 * time.Second

// Run is a started job: its ranks and its supervisor.
type Run struct {
	spec  Spec
	procs []*Proc
	done  chan struct{} // closed when every rank is reaped and drained
	err   error         // the job's outcome, set before done closes
}

// Proc is one rank's process, the leader of a process group of its own.
type Proc struct {
	Rank  int // global rank
	Local int // local rank
	CPU   int // the CPU it is bound to (Job.Bind), -1 if unbound

	cmd *exec.Cmd

	// mu is held while the child is reaped, so that its pid (the group id)
	// is never signalled after the kernel may have reused it.
	mu     sync.Mutex
	reaped bool

	out     outputs
	done    chan struct{} // closed once reaped and its output drained
	err     error         // exec.Cmd.Wait's result, set before done closes
	ended   time.Time     // when it was reaped
	exitErr chan error    // the supervisor's copy of err, at reap time
}

// Start validates job, starts its ranks and returns at once; Wait reports
// the outcome. Each rank runs in a process group of its own (on Linux the
// kernel kills it if the launcher dies), and whatever a rank leaves running
// in its group when it exits is killed. The first rank to fail (unless
// KeepGoing), a signal on Job.Signals or the end of ctx stops the job:
// every remaining rank's group gets SIGTERM (or the received signal) and,
// after KillGrace, SIGKILL. If a rank cannot be started, Start kills the
// ones it started, reaps them and returns a *StartError.
func Start(ctx context.Context, job Job) (*Run, error) {
	spec, err := job.Spec.Resolve()
	if err != nil {
		return nil, err
	}
	if job.KillGrace < 0 {
		return nil, fmt.Errorf("%w: KillGrace must not be negative, got %v", ErrJob, job.KillGrace)
	}
	if job.Procs < 0 {
		return nil, fmt.Errorf("%w: Procs must not be negative, got %d", ErrJob, job.Procs)
	}
	prog := job.Program
	if prog == "" {
		if prog, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("launch: %w", err)
		}
	}
	environ := job.Environ
	if environ == nil {
		environ = os.Environ()
	}
	output := job.Output
	if output == nil {
		output = func(int) (io.Writer, io.Writer) { return os.Stdout, os.Stderr }
	}
	var cpus []int
	if job.Bind {
		if cpus, err = allowedCPUs(); err != nil {
			return nil, fmt.Errorf("%w: Bind: %w", ErrJob, err)
		}
		if len(cpus) == 0 {
			return nil, fmt.Errorf("%w: Bind: the launcher may run on no CPU", ErrJob)
		}
	}
	r := &Run{spec: spec, done: make(chan struct{})}
	for local := range spec.NProc {
		rank := spec.GlobalRank(local)
		env := spec.Env(environ, local)
		if job.Procs > 0 {
			env = append(env, "GOMAXPROCS="+strconv.Itoa(job.Procs))
		}
		env = append(env, job.Env...)
		if job.RankEnv != nil {
			env = append(env, job.RankEnv(rank)...)
		}
		var stdin *os.File
		if local == 0 {
			stdin = job.Stdin
		}
		stdout, stderr := output(rank)
		cpu := -1
		if cpus != nil {
			cpu = cpus[local%len(cpus)]
		}
		p, err := startProc(rank, local, cpu, prog, job.Args, env, stdin, stdout, stderr)
		if err != nil {
			for _, q := range r.procs {
				q.signal(os.Kill)
			}
			for _, q := range r.procs {
				<-q.done
			}
			return nil, &StartError{Rank: rank, Err: err}
		}
		r.procs = append(r.procs, p)
	}
	go r.supervise(ctx, job)
	return r, nil
}

// Spec returns the job's resolved spec: its port and token included.
func (r *Run) Spec() Spec { return r.spec }

// Procs returns the ranks' processes, local rank i at index i (the caller
// owns the slice, not the Procs).
func (r *Run) Procs() []*Proc { return append([]*Proc(nil), r.procs...) }

// Done is closed once every rank has been reaped and its output drained.
func (r *Run) Done() <-chan struct{} { return r.done }

// Wait waits for every rank to exit and their output to be drained, and
// returns nil if every rank exited 0, a *RankError naming the first rank
// that failed, a *SignalError, or ctx's error (wrapped) if ctx ended first.
func (r *Run) Wait() error {
	<-r.done
	return r.err
}

// supervise waits for every rank to exit, stopping the job as Start says,
// then for their output, and records the outcome.
func (r *Run) supervise(ctx context.Context, job Job) {
	defer close(r.done)
	type exit struct {
		p   *Proc
		err error
	}
	events := make(chan exit, len(r.procs))
	for _, p := range r.procs {
		go func() { events <- exit{p, <-p.exitErr} }()
	}
	var (
		reason   error
		stopping bool
		grace    *time.Timer
		graceC   <-chan time.Time
		done     = ctx.Done()
	)
	stop := func(sig os.Signal) {
		stopping = true
		for _, p := range r.procs {
			p.signal(sig)
		}
		grace = time.NewTimer(job.KillGrace)
		graceC = grace.C
	}
	killAll := func() {
		for _, p := range r.procs {
			p.signal(os.Kill)
		}
	}
	for remaining := len(r.procs); remaining > 0; {
		select {
		case ev := <-events:
			remaining--
			if ev.err == nil || reason != nil {
				continue
			}
			if !stopping {
				reason = &RankError{Rank: ev.p.Rank, Err: ev.err}
				if !job.KeepGoing {
					stop(syscall.SIGTERM)
				}
			}
		case sig := <-job.Signals:
			if stopping {
				killAll()
				continue
			}
			reason = &SignalError{Sig: sig}
			stop(sig)
		case <-done:
			done = nil
			if stopping {
				continue
			}
			if reason == nil {
				reason = fmt.Errorf("launch: job stopped: %w", ctx.Err())
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
	for _, p := range r.procs {
		<-p.done
	}
	r.err = reason
}

// startProc starts one rank, bound to cpu unless it is negative.
func startProc(rank, local, cpu int, prog string, args, env []string, stdin *os.File, stdout, stderr io.Writer) (*Proc, error) {
	cmd := exec.Command(prog, args...)
	if cmd.Err != nil {
		return nil, cmd.Err
	}
	cmd.Env = env
	cmd.SysProcAttr = sysProcAttr()
	if stdin != nil {
		cmd.Stdin = stdin
	}
	p := &Proc{Rank: rank, Local: local, CPU: cpu, cmd: cmd, done: make(chan struct{}), exitErr: make(chan error, 1)}
	var err error
	if cmd.Stdout, err = p.out.attach(stdout); err == nil {
		cmd.Stderr, err = p.out.attach(stderr)
	}
	if err == nil {
		err = startOn(cpu, cmd.Start)
	}
	p.out.closeParentEnds() // the child has its own copies
	if err != nil {
		p.out.closeReaders()
		p.out.wg.Wait()
		return nil, err
	}
	go p.reap()
	return p, nil
}

// reap waits for the child to exit, kills whatever it left running in its
// process group (a grandchild such as the binary `go run` started), reaps
// it, tells the supervisor and drains its output.
func (p *Proc) reap() {
	pid := p.cmd.Process.Pid
	var err error
	if waitExited(pid) {
		// The child is a zombie: its pid cannot be reused until Wait.
		p.mu.Lock()
		_ = signalGroup(pid, os.Kill)
		err = p.cmd.Wait()
		p.reaped = true
		p.mu.Unlock()
	} else {
		err = p.cmd.Wait()
		p.mu.Lock()
		_ = signalGroup(pid, os.Kill)
		p.reaped = true
		p.mu.Unlock()
	}
	p.err, p.ended = err, time.Now()
	p.exitErr <- err
	p.out.drain(drainTimeout)
	close(p.done)
}

// signal sends sig to the rank's process group unless it has been reaped.
func (p *Proc) signal(sig os.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.reaped {
		_ = signalGroup(p.cmd.Process.Pid, sig)
	}
}

// Pid is the process id (and process-group id) of the rank.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Kill sends SIGKILL to the rank's process group (nothing once it has been
// reaped).
func (p *Proc) Kill() { p.signal(os.Kill) }

// Signal sends sig to the rank's process group (nothing once it has been
// reaped).
func (p *Proc) Signal(sig os.Signal) { p.signal(sig) }

// Done is closed once the process has exited and its output is drained.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is the process's exit error (nil for exit status 0); it waits for
// Done.
func (p *Proc) Err() error { <-p.done; return p.err }

// Ended is when the process was reaped; it waits for Done.
func (p *Proc) Ended() time.Time { <-p.done; return p.ended }

// ExitCode is the process's exit status, or -1 if it was killed by a
// signal; it waits for Done.
func (p *Proc) ExitCode() int {
	<-p.done
	var ee *exec.ExitError
	switch {
	case p.err == nil:
		return 0
	case errors.As(p.err, &ee):
		return ee.ExitCode()
	}
	return -1
}

// ExitStatus returns the exit status a shell would report for a rank's
// exit error: 0 for nil, the exit code, 128+N for a process killed by
// signal N, and 1 for anything else.
func ExitStatus(err error) int {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee) && ee.ProcessState != nil:
		return exitStatus(ee.ProcessState)
	}
	return 1
}

// SignalNumber returns the number of sig, or 0 if it has none.
func SignalNumber(sig os.Signal) int { return signalNumber(sig) }
