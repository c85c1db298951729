package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gdist/gdist/internal/launch"
)

// rankLogs are the -log-dir files of this node's ranks, DIR/rank<N>.log,
// open for the whole run: every attempt appends to them.
type rankLogs struct {
	argv  []string
	ranks []int            // global ranks, in local-rank order
	files map[int]*rankLog // by global rank
}

// rankLog is one rank's log file, shared by its stdout and stderr (each
// writes whole lines through a PrefixWriter) and by gdistrun's header and
// footer lines. A write error is kept and reported by close; the rank is
// never blocked or failed by its log.
type rankLog struct {
	path string
	mu   sync.Mutex
	f    *os.File
	err  error // first write error
}

func (l *rankLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		if _, err := l.f.Write(p); err != nil {
			l.err = err
		}
	}
	return len(p), nil
}

// openRankLogs creates dir if need be and opens (appending, creating) the
// log file of every rank of spec on this node.
func openRankLogs(dir string, spec launch.Spec, argv []string) (*rankLogs, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("-log-dir: %w", err)
	}
	logs := &rankLogs{argv: argv, files: map[int]*rankLog{}}
	for local := range spec.NProc {
		rank := spec.GlobalRank(local)
		path := filepath.Join(dir, "rank"+strconv.Itoa(rank)+".log")
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			_ = logs.close()
			return nil, fmt.Errorf("-log-dir: %w", err)
		}
		logs.ranks = append(logs.ranks, rank)
		logs.files[rank] = &rankLog{path: path, f: f}
	}
	return logs, nil
}

// output returns a Job.Output that writes every rank's stdout and stderr
// to where terminal says and, line by line, to the rank's log file.
func (logs *rankLogs) output(terminal func(rank int) (io.Writer, io.Writer)) func(rank int) (io.Writer, io.Writer) {
	return func(rank int) (io.Writer, io.Writer) {
		so, se := terminal(rank)
		l := logs.files[rank]
		return tee{so, launch.NewPrefixWriter(l, "")}, tee{se, launch.NewPrefixWriter(l, "")}
	}
}

// begin writes the header line of an attempt (0-based) to every log.
func (logs *rankLogs) begin(attempt, attempts int) {
	now := time.Now().UTC().Format(time.RFC3339)
	for _, rank := range logs.ranks {
		fmt.Fprintf(logs.files[rank], "=== gdistrun %s: rank %d, attempt %d of %d (%s=%d): %s\n",
			now, rank, attempt+1, attempts, envRestartCount, attempt, strings.Join(logs.argv, " "))
	}
}

// end writes how each rank of an attempt exited to its log, once its
// output has been drained.
func (logs *rankLogs) end(procs []*launch.Proc) {
	for _, p := range procs {
		how := "exit status 0"
		if err := p.Err(); err != nil {
			how = err.Error()
		}
		fmt.Fprintf(logs.files[p.Rank], "=== gdistrun: rank %d ended: %s\n", p.Rank, how)
	}
}

// close closes every log file and returns the first error of each, if any.
func (logs *rankLogs) close() error {
	var errs []error
	for _, rank := range logs.ranks {
		l := logs.files[rank]
		l.mu.Lock()
		err := l.err
		if cerr := l.f.Close(); err == nil {
			err = cerr
		}
		l.mu.Unlock()
		if err != nil {
			errs = append(errs, fmt.Errorf("-log-dir: %s: %w", l.path, err))
		}
	}
	return errors.Join(errs...)
}

// tee writes to a rank's terminal stream and to its log; it never fails,
// and Flush flushes both.
type tee struct {
	term io.Writer // nil: none
	log  *launch.PrefixWriter
}

func (t tee) Write(p []byte) (int, error) {
	if t.term != nil {
		_, _ = t.term.Write(p)
	}
	_, _ = t.log.Write(p)
	return len(p), nil
}

// Flush ends the streams' unterminated lines.
func (t tee) Flush() error {
	if f, ok := t.term.(interface{ Flush() error }); ok {
		_ = f.Flush()
	}
	return t.log.Flush()
}
