// Package timeline records what one rank did, and when, as Chrome
// trace-event JSON (the format chrome://tracing and Perfetto open): one
// "complete" event per collective, DDP bucket or pipeline micro-batch, on a
// lane (a row of the viewer) per kind of work, with the rank as the process.
//
// A nil *Recorder is valid and records nothing, so the instrumented code
// pays one nil check when the timeline is off. Events are plain values (no
// maps, no variadic arguments), so recording one allocates nothing beyond
// the recorder's growing buffer, which is bounded (see WithMaxEvents).
//
// # Usage
//
//	rec := timeline.New(rank)                // or nil: off
//	start := time.Now()
//	... work ...
//	rec.Add(timeline.Event{Lane: "collectives", Name: "all_reduce", Start: start, End: time.Now(),
//		Args: [4]timeline.Arg{{Key: "bytes", Int: n}}})
//	err := rec.WriteFile("timeline.rank0.json")
package timeline

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gdist/gdist/internal/errs"
	"github.com/gdist/gdist/internal/options"
)

// DefaultMaxEvents bounds the events a recorder keeps (about 200 bytes
// each); later events are counted as dropped.
const DefaultMaxEvents = 1 << 20

// Arg is one named argument of an event: an integer, or a string if Str is
// not empty. An Arg with an empty Key is not written.
type Arg struct {
	Key string
	Int int64
	Str string
}

// Event is one span of work, or an instant when End is zero.
type Event struct {
	Lane  string // the viewer row: "collectives", "ddp", "pipeline", ...
	Name  string // e.g. "all_reduce", "bucket 3", "forward mb 2"
	Cat   string // optional category, for the viewer's filter
	Start time.Time
	End   time.Time // zero: an instant event
	Args  [4]Arg
}

// Recorder collects the events of one rank. It is safe for concurrent use.
type Recorder struct {
	pid int
	max int

	mu      sync.Mutex
	events  []Event
	lanes   map[string]int
	order   []string
	dropped int
}

// ErrInvalidArgument is matched by the error of an invalid option. It is
// the value every gdist package exports under this name
// (errs.ErrInvalidArgument).
var ErrInvalidArgument = errs.ErrInvalidArgument

// Option configures New. New applies each in turn and fails with the first
// refusal, an error matching ErrInvalidArgument that names the option; a
// nil Option is refused the same way.
type Option func(*Recorder) error

// WithMaxEvents sets how many events the recorder keeps (n > 0).
func WithMaxEvents(n int) Option {
	return func(r *Recorder) error {
		if n <= 0 {
			return fmt.Errorf("timeline: %w: WithMaxEvents(%d): must be positive", ErrInvalidArgument, n)
		}
		r.max = n
		return nil
	}
}

// New returns a recorder for rank.
func New(rank int, opts ...Option) (*Recorder, error) {
	r := &Recorder{pid: rank, max: DefaultMaxEvents, lanes: map[string]int{}}
	if err := options.Apply(r, opts, "timeline", ErrInvalidArgument); err != nil {
		return nil, err
	}
	return r, nil
}

// Add records e. On a nil recorder it does nothing.
func (r *Recorder) Add(e Event) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.events) >= r.max {
		r.dropped++
		return
	}
	if _, ok := r.lanes[e.Lane]; !ok {
		r.lanes[e.Lane] = len(r.order) + 1
		r.order = append(r.order, e.Lane)
	}
	r.events = append(r.events, e)
}

// Enabled reports whether r records (is not nil).
func (r *Recorder) Enabled() bool { return r != nil }

// Len returns the number of events recorded and dropped so far.
func (r *Recorder) Len() (kept, dropped int) {
	if r == nil {
		return 0, 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events), r.dropped
}

// traceEvent is one element of the trace-event format's traceEvents array
// (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU).
type traceEvent struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat,omitempty"`
	Ph   string         `json:"ph"`
	Ts   float64        `json:"ts"`            // microseconds
	Dur  *float64       `json:"dur,omitempty"` // "X" events
	S    string         `json:"s,omitempty"`   // "i" events: scope
	Pid  int            `json:"pid"`
	Tid  int            `json:"tid"`
	Args map[string]any `json:"args,omitempty"`
}

// us is t in microseconds since the Unix epoch: the ranks' files share a
// clock (exactly on one host, up to clock sync across hosts), so Merge only
// has to concatenate them.
func us(t time.Time) float64 { return float64(t.UnixNano()) / 1e3 }

// Write writes the events as a trace-event JSON object: metadata naming the
// process "rank N" and each lane, then the events in the order recorded.
func (r *Recorder) Write(w io.Writer) error {
	if r == nil {
		return fmt.Errorf("timeline: Write on a nil recorder")
	}
	r.mu.Lock()
	events := append([]Event(nil), r.events...)
	order := append([]string(nil), r.order...)
	lanes := make(map[string]int, len(r.lanes))
	for k, v := range r.lanes {
		lanes[k] = v
	}
	dropped := r.dropped
	r.mu.Unlock()

	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	if _, err := bw.WriteString(`{"displayTimeUnit":"ms","otherData":{"gdist_dropped_events":` + strconv.Itoa(dropped) + `},"traceEvents":[` + "\n"); err != nil {
		return err
	}
	first := true
	emit := func(e traceEvent) error {
		if !first {
			if err := bw.WriteByte(','); err != nil {
				return err
			}
		}
		first = false
		return enc.Encode(e) // Encode appends a newline
	}
	if err := emit(traceEvent{Name: "process_name", Ph: "M", Pid: r.pid, Args: map[string]any{"name": fmt.Sprintf("rank %d", r.pid)}}); err != nil {
		return err
	}
	if err := emit(traceEvent{Name: "process_sort_index", Ph: "M", Pid: r.pid, Args: map[string]any{"sort_index": r.pid}}); err != nil {
		return err
	}
	for _, lane := range order {
		if err := emit(traceEvent{Name: "thread_name", Ph: "M", Pid: r.pid, Tid: lanes[lane], Args: map[string]any{"name": lane}}); err != nil {
			return err
		}
	}
	for _, e := range events {
		te := traceEvent{Name: e.Name, Cat: e.Cat, Ts: us(e.Start), Pid: r.pid, Tid: lanes[e.Lane]}
		if e.End.IsZero() {
			te.Ph, te.S = "i", "t"
		} else {
			te.Ph = "X"
			d := float64(e.End.Sub(e.Start).Nanoseconds()) / 1e3
			te.Dur = &d
		}
		for _, a := range e.Args {
			if a.Key == "" {
				continue
			}
			if te.Args == nil {
				te.Args = map[string]any{}
			}
			if a.Str != "" {
				te.Args[a.Key] = a.Str
			} else {
				te.Args[a.Key] = a.Int
			}
		}
		if err := emit(te); err != nil {
			return err
		}
	}
	if _, err := bw.WriteString("]}\n"); err != nil {
		return err
	}
	return bw.Flush()
}

// Prepare makes sure a trace can be written to path when the run ends:
// it creates path's directory (and its parents) if need be, then creates
// and removes a temporary file in it, the way WriteFile writes. Call it at
// start, so that an unwritable path fails before the work it would record
// rather than after. The error names path.
func Prepare(path string) error {
	f, err := createTemp(path)
	if err == nil {
		err = f.Close()
		if rerr := os.Remove(f.Name()); err == nil {
			err = rerr
		}
	}
	if err != nil {
		return fmt.Errorf("timeline: cannot write %s: %w", path, err)
	}
	return nil
}

// createTemp creates path's directory if need be and a temporary file in
// it, to be renamed to path.
func createTemp(path string) (*os.File, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return os.CreateTemp(dir, ".timeline-*.json")
}

// WriteFile writes the trace to path atomically (a temporary file renamed
// into place), creating path's directory if need be.
func (r *Recorder) WriteFile(path string) error {
	f, err := createTemp(path)
	if err != nil {
		return fmt.Errorf("timeline: writing %s: %w", path, err)
	}
	defer os.Remove(f.Name())
	if err := f.Chmod(0o644); err != nil { // CreateTemp makes it 0600
		f.Close()
		return fmt.Errorf("timeline: writing %s: %w", path, err)
	}
	if err := r.Write(f); err != nil {
		f.Close()
		return fmt.Errorf("timeline: writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("timeline: writing %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("timeline: writing %s: %w", path, err)
	}
	return nil
}

// RankPath returns the file of rank for a GDIST_TIMELINE value: "{rank}" in
// path is replaced by the rank; otherwise ".rankN" goes before the
// extension (timeline.json -> timeline.rank1.json), or at the end.
func RankPath(path string, rank int) string {
	r := strconv.Itoa(rank)
	if strings.Contains(path, "{rank}") {
		return strings.ReplaceAll(path, "{rank}", r)
	}
	ext := filepath.Ext(path)
	return strings.TrimSuffix(path, ext) + ".rank" + r + ext
}

// file is the shape of a trace-event JSON object, for Merge.
type file struct {
	TraceEvents []json.RawMessage `json:"traceEvents"`
}

// Merge writes one trace holding the events of every file in paths (each
// written by WriteFile, one per rank), so that one viewer shows all ranks on
// the shared clock.
func Merge(w io.Writer, paths ...string) error {
	bw := bufio.NewWriter(w)
	if _, err := bw.WriteString(`{"displayTimeUnit":"ms","traceEvents":[` + "\n"); err != nil {
		return err
	}
	first := true
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("timeline: %w", err)
		}
		var f file
		if err := json.Unmarshal(b, &f); err != nil {
			return fmt.Errorf("timeline: %s: %w", p, err)
		}
		for _, e := range f.TraceEvents {
			if !first {
				bw.WriteByte(',')
			}
			first = false
			bw.Write(e)
			bw.WriteByte('\n')
		}
	}
	if _, err := bw.WriteString("]}\n"); err != nil {
		return err
	}
	return bw.Flush()
}

// TraceEvent is one event of a trace file as Read returns it.
type TraceEvent struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat,omitempty"`
	Ph   string         `json:"ph"`  // "X" complete, "i" instant, "M" metadata
	Ts   float64        `json:"ts"`  // microseconds since the Unix epoch
	Dur  float64        `json:"dur"` // microseconds ("X" events)
	Pid  int            `json:"pid"` // the rank
	Tid  int            `json:"tid"` // the lane
	Args map[string]any `json:"args,omitempty"`
}

// ReadFile reads the events of a trace file written by WriteFile or Merge.
func ReadFile(path string) ([]TraceEvent, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("timeline: %w", err)
	}
	defer f.Close()
	evs, err := Read(f)
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, path)
	}
	return evs, nil
}

// Lanes returns the lane names of events' metadata, by (pid, tid).
func Lanes(events []TraceEvent) map[[2]int]string {
	lanes := map[[2]int]string{}
	for _, e := range events {
		if e.Ph == "M" && e.Name == "thread_name" {
			if n, ok := e.Args["name"].(string); ok {
				lanes[[2]int{e.Pid, e.Tid}] = n
			}
		}
	}
	return lanes
}
