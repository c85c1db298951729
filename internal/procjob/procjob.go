// Package procjob is the test-facing face of package launch: it starts a
// test binary (or any program) as the N ranks of a multi-process job on
// loopback, the way gdistrun does, with an environment variable naming each
// process's role, which the test's TestMain checks to run the rank instead
// of the tests. procjob collects each process's output line by line, lets a
// test await a line, and kills whatever is still running when the test ends.
//
// Unlike a launcher for real jobs, a failing rank does not stop the others
// (launch.Job.KeepGoing): tests kill ranks on purpose and watch the
// survivors.
//
// It does not import package dist, so dist's own (internal) tests can use it.
//
// # Usage
//
//	func TestMain(m *testing.M) {
//		if role := os.Getenv(childEnv); role != "" {
//			os.Exit(childMain(role)) // joins with gdist.InitFromEnv
//		}
//		os.Exit(m.Run())
//	}
//
//	func TestThreeRanks(t *testing.T) {
//		procs := procjob.Start(t, 3, procjob.Config{RoleEnv: childEnv, Role: "allreduce"})
//		for r, p := range procs {
//			require.NoError(t, p.Wait(time.Minute), "rank %d:\n%s", r, p.Output())
//		}
//	}
package procjob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gdist/gdist/internal/launch"
)

// Errors of Proc.Wait and Proc.Await.
var (
	// ErrTimeout means the process did not finish, or print the awaited
	// line, in time.
	ErrTimeout = errors.New("procjob: timed out")
	// ErrExited means the process exited without printing the awaited line.
	ErrExited = errors.New("procjob: process exited")
)

// Config describes a job. The zero value starts the running test binary
// with "-test.run=^$" and nothing but the rank environment.
type Config struct {
	// RoleEnv and Role: each process gets RoleEnv=Role (if RoleEnv is set).
	RoleEnv, Role string
	// Env holds extra "KEY=value" entries for every process (after the
	// rank environment, so they win).
	Env []string
	// Exe is the program (default: the running test binary), Args its
	// arguments (default: "-test.run=^$", which runs no test).
	Exe  string
	Args []string
	// MergeStderr puts stderr lines into Lines as well; otherwise stderr is
	// kept apart (Proc.Stderr).
	MergeStderr bool
	// LogStderr also logs every stderr line through t.Log, as "rank r: line".
	LogStderr bool
}

// Proc is one rank's process.
type Proc struct {
	Rank int

	p   *launch.Proc
	job *job

	mu      sync.Mutex
	lines   []string        // stdout (and with MergeStderr, stderr) lines
	stderr  strings.Builder // stderr, unless MergeStderr
	changed chan struct{}   // closed and replaced when lines grows
}

// Start starts n ranks as cfg says (each with a fresh job token and master
// port, through package launch) and returns them, rank r's at index r. A
// process still running when t ends is killed; t's cleanup waits for every
// process. Start fails t if a process cannot start.
func Start(t testing.TB, n int, cfg Config) []*Proc {
	t.Helper()
	j := &job{cfg: cfg}
	procs := make([]*Proc, n)
	for r := range procs {
		procs[r] = &Proc{Rank: r, job: j, changed: make(chan struct{})}
	}
	run := j.start(t, launch.Spec{NProc: n}, procs, nil)
	j.spec = run.Spec()
	return procs
}

// job is what Restart needs to start a rank again: the job's spec (its
// port and token) and configuration.
type job struct {
	cfg  Config
	spec launch.Spec

	mu       sync.Mutex
	restarts int
}

// Restart starts a new process as rank p.Rank of p's job — the same master
// address, port and token and the same configuration, with
// GDIST_RESTART_COUNT counting the restarts of the job's ranks — and
// returns it. p should have exited (Kill and Wait first): two processes of
// one rank are the test's to arrange. Like Start's, the process is killed
// when t ends if it still runs.
func (p *Proc) Restart(t testing.TB) *Proc {
	t.Helper()
	j := p.job
	j.mu.Lock()
	j.restarts++
	n := j.restarts
	j.mu.Unlock()
	spec := j.spec
	spec.NNodes, spec.NodeRank = spec.WorldSize(), p.Rank
	spec.NProc = 1
	q := &Proc{Rank: p.Rank, job: j, changed: make(chan struct{})}
	j.start(t, spec, []*Proc{q}, []string{fmt.Sprintf("GDIST_RESTART_COUNT=%d", n)})
	return q
}

// start launches the ranks of spec as procs (procs[i] is local rank i),
// collecting their output, and arranges for them to be killed when t ends.
func (j *job) start(t testing.TB, spec launch.Spec, procs []*Proc, extra []string) *launch.Run {
	t.Helper()
	cfg := j.cfg
	args := cfg.Args
	if args == nil {
		args = []string{"-test.run=^$"}
	}
	var env []string
	if cfg.RoleEnv != "" {
		env = append(env, cfg.RoleEnv+"="+cfg.Role)
	}
	env = append(append(env, cfg.Env...), extra...)
	local := map[int]*Proc{}
	for i, p := range procs {
		local[spec.GlobalRank(i)] = p
	}
	ctx, cancel := context.WithCancel(context.Background())
	run, err := launch.Start(ctx, launch.Job{
		Spec:      spec,
		Program:   cfg.Exe,
		Args:      args,
		Env:       env,
		KeepGoing: true,
		Output: func(r int) (io.Writer, io.Writer) {
			p := local[r]
			return launch.LineFunc(p.addLine), launch.LineFunc(func(l string) {
				if cfg.LogStderr {
					t.Logf("rank %d: %s", r, l)
				}
				if cfg.MergeStderr {
					p.addLine(l)
					return
				}
				p.mu.Lock()
				p.stderr.WriteString(l + "\n")
				p.mu.Unlock()
			})
		},
	})
	if err != nil {
		cancel()
		t.Fatalf("procjob: %v", err)
	}
	t.Cleanup(func() {
		cancel() // kills what is still running
		_ = run.Wait()
	})
	for i, lp := range run.Procs() {
		procs[i].p = lp
	}
	return run
}

func (p *Proc) addLine(l string) {
	p.mu.Lock()
	p.lines = append(p.lines, l)
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

// Done is closed once the process has exited and its output is read.
func (p *Proc) Done() <-chan struct{} { return p.p.Done() }

// Err is the process's exit error (nil for exit status 0); valid after Done.
func (p *Proc) Err() error { return p.p.Err() }

// ExitCode is the process's exit status, or -1 if it did not exit normally
// (killed by a signal); valid after Done.
func (p *Proc) ExitCode() int { return p.p.ExitCode() }

// Ended is when the process was seen to exit; valid after Done.
func (p *Proc) Ended() time.Time { return p.p.Ended() }

// Wait waits up to timeout for the process to exit and returns its exit
// error, or an error wrapping ErrTimeout.
func (p *Proc) Wait(timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.p.Done():
		return p.p.Err()
	case <-t.C:
		return fmt.Errorf("%w: rank %d still running after %v", ErrTimeout, p.Rank, timeout)
	}
}

// Kill sends the process (its process group) SIGKILL.
func (p *Proc) Kill() error {
	p.p.Kill()
	return nil
}

// Signal sends the process (its process group) sig, for example SIGSTOP
// and SIGCONT to freeze and thaw it.
func (p *Proc) Signal(sig os.Signal) { p.p.Signal(sig) }

// Lines returns a copy of the output lines so far (the caller owns it).
func (p *Proc) Lines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lines...)
}

// Output returns the output lines so far, each ended by a newline.
func (p *Proc) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.lines) == 0 {
		return ""
	}
	return strings.Join(p.lines, "\n") + "\n"
}

// Stderr returns what the process wrote to stderr so far (empty with
// MergeStderr).
func (p *Proc) Stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

// Await waits up to timeout for an output line, from the from-th (0-based)
// on, for which match reports true, and returns its index. It returns an
// error wrapping ErrExited if the process exits without printing one, and
// ErrTimeout if the time runs out.
func (p *Proc) Await(from int, timeout time.Duration, match func(line string) bool) (int, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		p.mu.Lock()
		for ; from < len(p.lines); from++ {
			if match(p.lines[from]) {
				p.mu.Unlock()
				return from, nil
			}
		}
		changed := p.changed
		p.mu.Unlock()
		select {
		case <-changed:
		case <-p.p.Done():
			p.mu.Lock()
			more := from < len(p.lines)
			p.mu.Unlock()
			if !more {
				return from, fmt.Errorf("%w: rank %d (%v)", ErrExited, p.Rank, p.p.Err())
			}
		case <-deadline.C:
			return from, fmt.Errorf("%w: rank %d after %v", ErrTimeout, p.Rank, timeout)
		}
	}
}
