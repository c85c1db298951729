//go:build linux

package netns_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// subnet is the private range the namespaces use (10.231.0.0/24); node k
// has address subnet.(k+1). It exists only inside the namespaces.
const subnet = "10.231.0"

// nsPrefix starts the name of every namespace this package makes, followed
// by the test process's pid, so that a later run can tell which ones were
// left behind by a process that no longer exists.
const nsPrefix = "gdistns"

var staleName = regexp.MustCompile(`^` + nsPrefix + `(\d+)-`)

// topology is n namespaces ("nodes"), each with an eth0 at subnet.(k+1)/24,
// whose veth peers are ports of a bridge in a namespace of their own.
type topology struct {
	sw    string   // the bridge's namespace
	nodes []string // node k's namespace
	addrs []string // node k's address
}

// requireNetns skips the test unless it runs as root with ip and tc and may
// create a network namespace.
func requireNetns(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("netns: multi-process test across network namespaces; skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("netns: needs root to create network namespaces (run the tests as root)")
	}
	for _, tool := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("netns: %s (iproute2) not found: %v", tool, err)
		}
	}
	probe := fmt.Sprintf("%s%d-probe", nsPrefix, os.Getpid())
	if out, err := ipCmd("netns", "add", probe); err != nil {
		t.Skipf("netns: `ip netns add` is not available here: %v: %s", err, out)
	}
	if out, err := ipCmd("netns", "del", probe); err != nil {
		t.Fatalf("netns: remove probe namespace %s: %v: %s", probe, err, out)
	}
}

// newTopology builds the namespaces, veths and bridge, rate-limiting both
// directions of every link with tbf at rate (a tc rate such as "400mbit"),
// and registers their removal with t.Cleanup before creating anything.
func newTopology(t *testing.T, n int, rate string) *topology {
	t.Helper()
	removeStale(t)
	prefix := fmt.Sprintf("%s%d-", nsPrefix, os.Getpid())
	tp := &topology{sw: prefix + "sw"}
	var made []string
	t.Cleanup(func() {
		for _, ns := range made {
			if out, err := ipCmd("netns", "del", ns); err != nil {
				t.Errorf("netns: remove namespace %s: %v: %s", ns, err, out)
			}
		}
	})
	mk := func(ns string) {
		if out, err := ipCmd("netns", "add", ns); err != nil {
			t.Fatalf("netns: create namespace %s: %v: %s", ns, err, out)
		}
		made = append(made, ns)
		mustIP(t, "-n", ns, "link", "set", "lo", "up")
	}
	mk(tp.sw)
	mustIP(t, "-n", tp.sw, "link", "add", "br0", "type", "bridge")
	mustIP(t, "-n", tp.sw, "link", "set", "br0", "up")
	tbf := []string{"root", "tbf", "rate", rate, "burst", "256kb", "latency", "25ms"}
	for k := range n {
		ns, port := fmt.Sprintf("%snode%d", prefix, k), fmt.Sprintf("p%d", k)
		addr := fmt.Sprintf("%s.%d", subnet, k+1)
		mk(ns)
		// Both ends are created straight in their namespaces: nothing
		// appears in the host's namespace, even for a moment.
		mustIP(t, "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns", tp.sw)
		mustIP(t, "-n", tp.sw, "link", "set", port, "master", "br0", "up")
		mustIP(t, "-n", ns, "addr", "add", addr+"/24", "dev", "eth0")
		mustIP(t, "-n", ns, "link", "set", "eth0", "up")
		mustTC(t, append([]string{"-n", ns, "qdisc", "add", "dev", "eth0"}, tbf...)...)
		mustTC(t, append([]string{"-n", tp.sw, "qdisc", "add", "dev", port}, tbf...)...)
		tp.nodes = append(tp.nodes, ns)
		tp.addrs = append(tp.addrs, addr)
	}
	return tp
}

// cut sets node k's link down from inside its namespace, as if its cable
// were pulled: the survivors' packets to it are dropped at the bridge.
func (tp *topology) cut(t *testing.T, k int) {
	t.Helper()
	mustIP(t, "-n", tp.nodes[k], "link", "set", "eth0", "down")
}

// restore sets node k's link up again after cut.
func (tp *topology) restore(t *testing.T, k int) {
	t.Helper()
	mustIP(t, "-n", tp.nodes[k], "link", "set", "eth0", "up")
}

// stats returns node k's qdisc statistics (bytes sent, overlimits).
func (tp *topology) stats(k int) string {
	out, err := exec.Command("tc", "-n", tp.nodes[k], "-s", "qdisc", "show", "dev", "eth0").CombinedOutput()
	if err != nil {
		return fmt.Sprintf("tc: %v", err)
	}
	return strings.Join(strings.Fields(string(out)), " ")
}

// removeStale deletes namespaces of this package whose creating process no
// longer exists (a test run that was killed could not clean up).
func removeStale(t *testing.T) {
	out, err := ipCmd("netns", "list")
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		m := staleName.FindStringSubmatch(fields[0])
		if m == nil {
			continue
		}
		pid, err := strconv.Atoi(m[1])
		if err != nil || pid == os.Getpid() || !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			continue
		}
		if out, err := ipCmd("netns", "del", fields[0]); err != nil {
			t.Logf("netns: remove stale namespace %s: %v: %s", fields[0], err, out)
		} else {
			t.Logf("netns: removed stale namespace %s (pid %d is gone)", fields[0], pid)
		}
	}
}

func ipCmd(args ...string) ([]byte, error) { return runTool("ip", args...) }

func runTool(tool string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return exec.CommandContext(ctx, tool, args...).CombinedOutput()
}

func mustIP(t *testing.T, args ...string) {
	t.Helper()
	if out, err := ipCmd(args...); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func mustTC(t *testing.T, args ...string) {
	t.Helper()
	if out, err := runTool("tc", args...); err != nil {
		t.Fatalf("tc %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// line is one line of a process's output and when it was written.
type line struct {
	at   time.Time
	text string
}

// lines collects a stream's lines; waiters are woken on each new line.
type lines struct {
	mu      sync.Mutex
	ls      []line
	partial []byte
	changed chan struct{} // closed and replaced on every new line
}

func newLines() *lines { return &lines{changed: make(chan struct{})} }

func (l *lines) Write(p []byte) (int, error) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, p...)
	added := false
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		l.ls = append(l.ls, line{at: now, text: string(bytes.TrimRight(l.partial[:i], "\r"))})
		l.partial = l.partial[i+1:]
		added = true
	}
	if added {
		close(l.changed)
		l.changed = make(chan struct{})
	}
	return len(p), nil
}

// snapshot returns the lines so far and a channel closed at the next one.
func (l *lines) snapshot() ([]line, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]line(nil), l.ls...), l.changed
}

func (l *lines) String() string {
	ls, _ := l.snapshot()
	var b strings.Builder
	for _, x := range ls {
		b.WriteString(x.text)
		b.WriteByte('\n')
	}
	return b.String()
}

// proc is a process started inside a namespace.
type proc struct {
	name   string
	cmd    *exec.Cmd
	stdout *lines
	stderr *lines
	out    *lines // stdout and stderr, interleaved
	done   chan struct{}
	err    error     // cmd.Wait's result, set before done closes
	ended  time.Time // set before done closes
}

type teeWriter struct{ a, b *lines }

func (w teeWriter) Write(p []byte) (int, error) {
	_, _ = w.a.Write(p)
	return w.b.Write(p)
}

// startIn starts argv inside namespace ns ("" for the host's) with env
// added to this process's environment. The test's cleanup stops it
// (SIGTERM to its process group, SIGKILL 5 s later) if it is still running.
func startIn(t *testing.T, name, ns string, env []string, argv ...string) *proc {
	t.Helper()
	if ns != "" {
		argv = append([]string{"ip", "netns", "exec", ns}, argv...)
	}
	p := &proc{name: name, stdout: newLines(), stderr: newLines(), out: newLines(), done: make(chan struct{})}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout = teeWriter{p.stdout, p.out}
	p.cmd.Stderr = teeWriter{p.stderr, p.out}
	p.cmd.WaitDelay = 5 * time.Second
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("%s: start %q: %v", name, argv, err)
	}
	go func() {
		err := p.cmd.Wait()
		p.err, p.ended = err, time.Now()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
			return
		default:
		}
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
		t.Logf("%s: stopped at the end of the test; output:\n%s", p.name, p.out)
	})
	return p
}

// wait waits up to d for the process to exit and returns its Wait error
// (context.DeadlineExceeded if it is still running).
func (p *proc) wait(d time.Duration) error {
	select {
	case <-p.done:
		return p.err
	case <-time.After(d):
		return fmt.Errorf("%s: still running after %v: %w", p.name, d, context.DeadlineExceeded)
	}
}

// exitCode returns the exit code of a process that has exited (-1 if a
// signal ended it).
func (p *proc) exitCode() int {
	<-p.done
	return p.cmd.ProcessState.ExitCode()
}

// await waits up to d for a line of the process's combined output that
// matches re, and returns it with its submatches.
func (p *proc) await(d time.Duration, re *regexp.Regexp) (line, []string, error) {
	deadline := time.After(d)
	seen := 0
	for {
		ls, changed := p.out.snapshot()
		for _, l := range ls[seen:] {
			if m := re.FindStringSubmatch(l.text); m != nil {
				return l, m, nil
			}
		}
		seen = len(ls)
		select {
		case <-changed:
		case <-p.done:
			ls, _ := p.out.snapshot()
			for _, l := range ls[seen:] {
				if m := re.FindStringSubmatch(l.text); m != nil {
					return l, m, nil
				}
			}
			return line{}, nil, fmt.Errorf("%s exited (%v) before printing a line matching %q", p.name, p.err, re)
		case <-deadline:
			return line{}, nil, fmt.Errorf("%s: no line matching %q after %v", p.name, re, d)
		}
	}
}
