package launch

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// outputs connects one rank's stdout and stderr to their destinations and
// owns the goroutines that copy them.
type outputs struct {
	wg         sync.WaitGroup
	mu         sync.Mutex
	readers    []*os.File // read ends of the pipes, closed by drain
	parentEnds []*os.File // our copies of the write ends, closed once the child has started
}

// attach returns what the child should write one stream to: nil for
// nowhere, an *os.File as is, and otherwise the write end of a pipe that a
// goroutine copies to w (through a lenientWriter, then w.Flush if w has
// it) until every holder of the write end has exited or drain gives up.
func (o *outputs) attach(w io.Writer) (io.Writer, error) {
	if w == nil {
		return nil, nil
	}
	if f, ok := w.(*os.File); ok {
		return f, nil
	}
	r, pw, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("output pipe: %w", err)
	}
	o.mu.Lock()
	o.readers = append(o.readers, r)
	o.parentEnds = append(o.parentEnds, pw)
	o.mu.Unlock()
	o.wg.Go(func() {
		_, _ = io.Copy(&lenientWriter{w: w}, r) // ends at EOF, or when drain closes r
		if f, ok := w.(interface{ Flush() error }); ok {
			_ = f.Flush()
		}
	})
	return pw, nil
}

// closeParentEnds closes the launcher's copies of the pipes' write ends.
func (o *outputs) closeParentEnds() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, f := range o.parentEnds {
		f.Close()
	}
	o.parentEnds = nil
}

// drain waits for the copy goroutines to finish, up to timeout after which
// it closes the pipes under them (something outside the rank's process
// group still holds a write end), and then waits for them to return.
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
	o.readers = nil
}

// lenientWriter passes writes on until the first error and then discards
// them, always reporting success, so that a broken destination never
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

// Prefixed returns a Job.Output that puts "[rank] " in front of every line
// of every rank and writes the lines whole to stdout and stderr, each
// shared by all ranks (either may be nil: that stream goes to /dev/null).
func Prefixed(stdout, stderr io.Writer) func(rank int) (io.Writer, io.Writer) {
	return Each(stdout, stderr, func(rank int, w io.Writer) io.Writer {
		return NewPrefixWriter(w, "["+strconv.Itoa(rank)+"] ")
	})
}

// Each returns a Job.Output that hands every rank wrap(rank, dst) for each
// of stdout and stderr, where dst is the destination made safe for the
// ranks to share (Synced), or nil where the destination is nil.
func Each(stdout, stderr io.Writer, wrap func(rank int, dst io.Writer) io.Writer) func(rank int) (io.Writer, io.Writer) {
	shared := func(w io.Writer) io.Writer {
		if w == nil {
			return nil
		}
		return Synced(w)
	}
	so, se := shared(stdout), shared(stderr)
	return func(rank int) (io.Writer, io.Writer) {
		var a, b io.Writer
		if so != nil {
			a = wrap(rank, so)
		}
		if se != nil {
			b = wrap(rank, se)
		}
		return a, b
	}
}

// LineFunc returns a writer that calls fn with every line written to it,
// without its terminator ('\n', '\r' or "\r\n"), and with the unterminated
// rest on Flush. Lines longer than 1 MiB come in pieces. It is not safe for
// concurrent use: give each stream its own.
func LineFunc(fn func(line string)) *PrefixWriter {
	return NewPrefixWriter(&lineFunc{fn: fn}, "")
}

// lineFunc receives one whole line (or piece of a long one) per Write from
// a PrefixWriter.
type lineFunc struct {
	fn     func(string)
	lastCR bool // the last line ended in '\r'
}

func (f *lineFunc) Write(p []byte) (int, error) {
	cr := f.lastCR
	f.lastCR = len(p) > 0 && p[len(p)-1] == '\r'
	if cr && len(p) == 1 && p[0] == '\n' {
		return 1, nil // the second half of a "\r\n" split across Writes
	}
	f.fn(strings.TrimRight(string(p), "\r\n"))
	return len(p), nil
}
