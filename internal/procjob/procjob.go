// Package procjob starts a test binary (or any program) as the N ranks of a
// multi-process job on loopback, the way gdistrun does: each process gets
// RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
// and GDIST_TOKEN, plus an environment variable naming its role, which the
// test's TestMain checks to run the rank instead of the tests. procjob
// collects each process's output line by line and its exit status, and kills
// whatever is still running when the test ends.
//
// It does not import package dist, so dist's own (internal) tests can use it.
//
// # Usage
//
//	func TestMain(m *testing.M) {
//		if role := os.Getenv(childEnv); role != "" {
//			os.Exit(childMain(role)) // joins with dist.InitFromEnv
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
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gdist/gdist/internal/benchutil"
)

// The environment variables a rank is started with (package dist's
// Env* constants; a test in this package checks that they agree).
const (
	EnvRank           = "RANK"
	EnvWorldSize      = "WORLD_SIZE"
	EnvLocalRank      = "LOCAL_RANK"
	EnvLocalWorldSize = "LOCAL_WORLD_SIZE"
	EnvMasterAddr     = "MASTER_ADDR"
	EnvMasterPort     = "MASTER_PORT"
	EnvToken          = "GDIST_TOKEN"
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
	// Exe is the program (default: os.Executable()), Args its arguments
	// (default: "-test.run=^$", which runs no test).
	Exe  string
	Args []string
	// Token is the job token (default: 16 random bytes, hex).
	Token string
	// MergeStderr puts stderr lines into Lines as well; otherwise stderr is
	// kept apart (Proc.Stderr).
	MergeStderr bool
	// LogStderr also logs every stderr line through t.Log, as "rank r: line".
	LogStderr bool
}

// Proc is one rank's process.
type Proc struct {
	Rank int
	Cmd  *exec.Cmd

	mu      sync.Mutex
	lines   []string        // stdout (and with MergeStderr, stderr) lines
	stderr  strings.Builder // stderr, unless MergeStderr
	changed chan struct{}   // closed and replaced when lines grows
	readers sync.WaitGroup
	done    chan struct{} // closed once the process has exited
	err     error         // Cmd.Wait's result, after done
	ended   time.Time
}

// Start starts n ranks as cfg says and returns them, rank r's at index r. A
// process still running when t ends is killed; t's cleanup waits for every
// process. Start fails t if a process cannot start.
func Start(t testing.TB, n int, cfg Config) []*Proc {
	t.Helper()
	exe := cfg.Exe
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			t.Fatalf("procjob: %v", err)
		}
	}
	args := cfg.Args
	if args == nil {
		args = []string{"-test.run=^$"}
	}
	tok := cfg.Token
	if tok == "" {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		tok = hex.EncodeToString(b)
	}
	port, err := benchutil.FreePort()
	if err != nil {
		t.Fatalf("procjob: %v", err)
	}
	procs := make([]*Proc, 0, n)
	t.Cleanup(func() {
		for _, p := range procs {
			select {
			case <-p.done:
			default:
				_ = p.Cmd.Process.Kill()
				<-p.done
			}
		}
	})
	for r := range n {
		cmd := exec.Command(exe, args...)
		cmd.Env = append(os.Environ(),
			EnvRank+"="+strconv.Itoa(r), EnvWorldSize+"="+strconv.Itoa(n),
			EnvLocalRank+"="+strconv.Itoa(r), EnvLocalWorldSize+"="+strconv.Itoa(n),
			EnvMasterAddr+"=127.0.0.1", EnvMasterPort+"="+strconv.Itoa(port),
			EnvToken+"="+tok)
		if cfg.RoleEnv != "" {
			cmd.Env = append(cmd.Env, cfg.RoleEnv+"="+cfg.Role)
		}
		cmd.Env = append(cmd.Env, cfg.Env...)
		p := &Proc{Rank: r, Cmd: cmd, changed: make(chan struct{}), done: make(chan struct{})}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatalf("procjob: rank %d: %v", r, err)
		}
		var stderr io.ReadCloser
		if cfg.MergeStderr && !cfg.LogStderr {
			cmd.Stderr = cmd.Stdout
		} else if stderr, err = cmd.StderrPipe(); err != nil {
			t.Fatalf("procjob: rank %d: %v", r, err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatalf("procjob: rank %d: %v", r, err)
		}
		procs = append(procs, p)
		p.readers.Go(func() { p.read(stdout, func(l string) { p.addLine(l) }) })
		if stderr != nil {
			p.readers.Go(func() {
				p.read(stderr, func(l string) {
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
			})
		}
		go func() {
			p.readers.Wait() // Wait closes the pipes: read them to EOF first
			p.err = cmd.Wait()
			p.ended = time.Now()
			close(p.done)
		}()
	}
	return procs
}

func (p *Proc) read(r io.Reader, line func(string)) {
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line(sc.Text())
	}
	_, _ = io.Copy(io.Discard, r)
}

func (p *Proc) addLine(l string) {
	p.mu.Lock()
	p.lines = append(p.lines, l)
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

// Done is closed once the process has exited and its output is read.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is the process's exit error (nil for exit status 0); valid after Done.
func (p *Proc) Err() error { <-p.done; return p.err }

// ExitCode is the process's exit status, or -1 if it did not exit normally
// (killed by a signal, or never waited for); valid after Done.
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

// Ended is when the process was seen to exit; valid after Done.
func (p *Proc) Ended() time.Time { <-p.done; return p.ended }

// Wait waits up to timeout for the process to exit and returns its exit
// error, or an error wrapping ErrTimeout.
func (p *Proc) Wait(timeout time.Duration) error {
	select {
	case <-p.done:
		return p.err
	case <-time.After(timeout):
		return fmt.Errorf("%w: rank %d still running after %v", ErrTimeout, p.Rank, timeout)
	}
}

// Kill sends the process SIGKILL.
func (p *Proc) Kill() error { return p.Cmd.Process.Signal(syscall.SIGKILL) }

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
		case <-p.done:
			p.mu.Lock()
			more := from < len(p.lines)
			p.mu.Unlock()
			if !more {
				return from, fmt.Errorf("%w: rank %d (%v)", ErrExited, p.Rank, p.err)
			}
		case <-deadline.C:
			return from, fmt.Errorf("%w: rank %d after %v", ErrTimeout, p.Rank, timeout)
		}
	}
}
