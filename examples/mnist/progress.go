package main

import (
	"fmt"
	"io"
	"time"

	"github.com/schollz/progressbar/v3"

	iprogress "github.com/gdist/gdist/internal/progress"
)

// progress shows how an epoch is going.
type progress interface {
	step(i int, loss float64) // after step i (from 1) with this rank's loss
	finish()
}

// newProgress returns a redrawing progress bar on a terminal and sparse
// plain lines otherwise (a pipe, as under gdistrun, or a file), where
// thousands of '\r' redraws would be noise. The epoch has steps steps, of
// which the first from were done before a resume: the rate counts only
// the steps taken since newProgress, against the time since.
func newProgress(w io.Writer, tty bool, epoch, epochs, from, steps, samplesPerStep int) progress {
	desc := fmt.Sprintf("epoch %d/%d", epoch, epochs)
	if !tty {
		return &plainProgress{w: w, desc: desc, from: from, steps: steps, samples: samplesPerStep, begin: time.Now(),
			now: time.Now, marks: iprogress.Milestones{Parts: 4}}
	}
	if from > 0 {
		desc += fmt.Sprintf(" (resumed at step %d)", from)
	}
	// The bar covers the steps left, so that its rate and time left are
	// those of this run.
	bar := iprogress.NewBar(w, (steps-from)*samplesPerStep, desc, "samples")
	return &barProgress{bar: bar, desc: desc, samples: samplesPerStep}
}

type barProgress struct {
	bar     *progressbar.ProgressBar
	desc    string
	samples int
	loss    iprogress.EMA
}

func (p *barProgress) step(i int, loss float64) {
	l := p.loss.Add(loss)
	if i%10 == 1 {
		p.bar.Describe(fmt.Sprintf("%s loss %.4f", p.desc, l))
	}
	_ = p.bar.Add(p.samples)
}

func (p *barProgress) finish() {
	_ = p.bar.Finish()
}

// plainProgress prints a line at every quarter of the epoch.
type plainProgress struct {
	w       io.Writer
	desc    string
	from    int // steps of the epoch done before a resume
	steps   int
	samples int
	begin   time.Time
	now     func() time.Time
	marks   iprogress.Milestones
	loss    iprogress.EMA
}

func (p *plainProgress) step(i int, loss float64) {
	l := p.loss.Add(loss)
	if !p.marks.Due(i, p.steps) {
		return
	}
	// Only the steps this run took, i-from, took the time since begin.
	rate := float64((i-p.from)*p.samples) / p.now().Sub(p.begin).Seconds()
	fmt.Fprintf(p.w, "%s %3d%% (%d/%d steps)  loss %.4f  %.0f samples/s\n", p.desc, 100*i/p.steps, i, p.steps, l, rate)
}

func (p *plainProgress) finish() {}
