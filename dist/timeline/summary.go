package timeline

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"time"
)

// Read reads the events of a trace, as Write, WriteFile or Merge write it,
// from r.
func Read(r io.Reader) ([]TraceEvent, error) {
	var f struct {
		TraceEvents []TraceEvent `json:"traceEvents"`
	}
	if err := json.NewDecoder(r).Decode(&f); err != nil {
		return nil, fmt.Errorf("timeline: %w", err)
	}
	return f.TraceEvents, nil
}

// Span is what Summarize finds for one kind of event on one rank: the
// complete events of one lane and name, and the time they took within
// that rank's windows.
type Span struct {
	Rank  int
	Lane  string
	Name  string
	Count int           // events that overlap a window
	Total time.Duration // their time within the windows

	Windows     int           // the rank's windows
	WindowTotal time.Duration // the windows' time
}

// Share returns the fraction of the windows' time the events took
// (Total / WindowTotal; 0 without windows).
func (s Span) Share() float64 {
	if s.WindowTotal <= 0 {
		return 0
	}
	return float64(s.Total) / float64(s.WindowTotal)
}

// PerWindow returns the mean number of events and the mean time they took
// per window.
func (s Span) PerWindow() (count float64, d time.Duration) {
	if s.Windows == 0 {
		return 0, 0
	}
	return float64(s.Count) / float64(s.Windows), s.Total / time.Duration(s.Windows)
}

// Summarize adds up where each rank's time went within its windows: the
// complete ("X") events named window, such as one event per training step
// that a program adds to its timeline. For every rank with windows and
// every (lane, name) of its other complete events that overlap them, it
// counts the events and the part of their time inside the windows, so that
// Share says, for instance, what part of a step the all-reduces of a
// tensor-parallel group took. Events of several lanes may overlap (a
// collective runs during a step): every lane is counted on its own. The
// result is ordered by rank, then by decreasing time.
func Summarize(events []TraceEvent, window string) []Span {
	lanes := Lanes(events)
	type win struct{ lo, hi float64 }
	wins := map[int][]win{}
	for _, e := range events {
		if e.Ph == "X" && e.Name == window {
			wins[e.Pid] = append(wins[e.Pid], win{e.Ts, e.Ts + e.Dur})
		}
	}
	total := map[int]float64{}
	for pid, ws := range wins {
		slices.SortFunc(ws, func(a, b win) int { return cmp.Compare(a.lo, b.lo) })
		for _, w := range ws {
			total[pid] += w.hi - w.lo
		}
	}
	type key struct {
		pid, tid int
		name     string
	}
	spans := map[key]*Span{}
	for _, e := range events {
		ws := wins[e.Pid]
		if e.Ph != "X" || e.Name == window || len(ws) == 0 {
			continue
		}
		lo, hi := e.Ts, e.Ts+e.Dur
		// The first window that ends after the event starts.
		i := sort.Search(len(ws), func(i int) bool { return ws[i].hi > lo })
		var in float64
		hit := false
		for ; i < len(ws) && ws[i].lo < hi; i++ {
			in += min(hi, ws[i].hi) - max(lo, ws[i].lo)
			hit = true
		}
		if !hit {
			continue
		}
		k := key{e.Pid, e.Tid, e.Name}
		s := spans[k]
		if s == nil {
			s = &Span{Rank: e.Pid, Lane: lanes[[2]int{e.Pid, e.Tid}], Name: e.Name,
				Windows: len(ws), WindowTotal: micros(total[e.Pid])}
			spans[k] = s
		}
		s.Count++
		s.Total += micros(in)
	}
	out := make([]Span, 0, len(spans))
	for _, s := range spans {
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b Span) int {
		if c := cmp.Compare(a.Rank, b.Rank); c != 0 {
			return c
		}
		if c := cmp.Compare(b.Total, a.Total); c != 0 {
			return c
		}
		return cmp.Compare(a.Lane+"\x00"+a.Name, b.Lane+"\x00"+b.Name)
	})
	return out
}

func micros(us float64) time.Duration { return time.Duration(us * 1e3) }
