package progress

import (
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
)

// EMA smooths a per-step loss for display: the first value is taken as is,
// every later one moves the average 5% of the way towards it. The zero value
// is ready to use.
type EMA struct {
	v   float64
	set bool
}

// Add folds x into the average and returns the new average.
func (e *EMA) Add(x float64) float64 {
	if !e.set {
		e.v, e.set = x, true
	} else {
		e.v += 0.05 * (x - e.v)
	}
	return e.v
}

// IsTerminal reports whether w is a character device (a terminal).
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// NewBar returns a progress bar of total units writing to w: 30 columns
// wide, redrawn at most every 100 ms, with a time estimate, cleared when it
// finishes. A non-empty unit shows the rate as "<n> unit/s".
func NewBar(w io.Writer, total int, desc, unit string) *progressbar.ProgressBar {
	opts := []progressbar.Option{
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionSetWidth(30),
	}
	if unit != "" {
		opts = append(opts, progressbar.OptionShowIts(), progressbar.OptionSetItsString(unit))
	}
	opts = append(opts,
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionClearOnFinish(),
	)
	return progressbar.NewOptions(total, opts...)
}

// Milestones says when a run crosses each of the Parts-1 inner boundaries
// that split it into Parts equal parts (with Parts 4: 25%, 50% and 75%), so
// that a plain reporter prints one line at each. A step that crosses several
// boundaries at once is due once. The zero value of the counter (with Parts
// set) starts at the first boundary.
type Milestones struct {
	Parts int
	next  int // boundaries already passed
}

// Due reports whether done of total steps crosses the next boundary.
func (m *Milestones) Due(done, total int) bool {
	return m.due(func(k int) bool { return done*m.Parts >= k*total })
}

// DueFrac reports whether the fraction frac of the run crosses the next
// boundary.
func (m *Milestones) DueFrac(frac float64) bool {
	return m.due(func(k int) bool { return frac*float64(m.Parts) >= float64(k) })
}

func (m *Milestones) due(reached func(k int) bool) bool {
	if m.next == 0 {
		m.next = 1
	}
	if m.next >= m.Parts || !reached(m.next) {
		return false
	}
	for m.next < m.Parts && reached(m.next) {
		m.next++
	}
	return true
}
