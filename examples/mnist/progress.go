package main

import (
	"fmt"
	"io"
	"time"

	"github.com/schollz/progressbar/v3"
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
		return &plainProgress{w: w, desc: desc, steps: steps, samples: samplesPerStep, begin: time.Now(), next: 1}
	}
	bar := progressbar.NewOptions(steps*samplesPerStep,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionSetWidth(30),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString("samples"),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionClearOnFinish(),
	)
	return &barProgress{bar: bar, desc: desc, samples: samplesPerStep}
}

// emaLoss smooths the per-step loss for display.
type emaLoss struct {
	v   float64
	set bool
}

func (e *emaLoss) add(x float64) float64 {
	if !e.set {
		e.v, e.set = x, true
	} else {
		e.v += 0.05 * (x - e.v)
	}
	return e.v
}

type barProgress struct {
	bar     *progressbar.ProgressBar
	desc    string
	samples int
	loss    emaLoss
}

func (p *barProgress) step(i int, loss float64) {
	l := p.loss.add(loss)
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
	next    int // next quarter to report
	loss    emaLoss
}

func (p *plainProgress) step(i int, loss float64) {
	l := p.loss.add(loss)
	if p.next > 3 || i*4 < p.next*p.steps {
		return
	}
	for p.next <= 3 && i*4 >= p.next*p.steps {
		p.next++
	}
	rate := float64(i*p.samples) / time.Since(p.begin).Seconds()
	fmt.Fprintf(p.w, "%s %3d%% (%d/%d steps)  loss %.4f  %.0f samples/s\n", p.desc, 100*i/p.steps, i, p.steps, l, rate)
}

func (p *plainProgress) finish() {}
