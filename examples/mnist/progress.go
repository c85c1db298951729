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
// thousands of '\r' redraws would be noise.
func newProgress(w io.Writer, tty bool, epoch, epochs, steps, samplesPerStep int) progress {
	desc := fmt.Sprintf("epoch %d/%d", epoch, epochs)
	if !tty {
		return &plainProgress{w: w, desc: desc, steps: steps, samples: samplesPerStep, begin: time.Now(),
			marks: iprogress.Milestones{Parts: 4}}
	}
	bar := iprogress.NewBar(w, steps*samplesPerStep, desc, "samples")
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
	steps   int
	samples int
	begin   time.Time
	marks   iprogress.Milestones
	loss    iprogress.EMA
}

func (p *plainProgress) step(i int, loss float64) {
	l := p.loss.Add(loss)
	if !p.marks.Due(i, p.steps) {
		return
	}
	rate := float64(i*p.samples) / time.Since(p.begin).Seconds()
	fmt.Fprintf(p.w, "%s %3d%% (%d/%d steps)  loss %.4f  %.0f samples/s\n", p.desc, 100*i/p.steps, i, p.steps, l, rate)
}

func (p *plainProgress) finish() {}
