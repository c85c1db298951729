package main

import (
	"fmt"
	"io"
	"math"
	"time"

	"github.com/schollz/progressbar/v3"

	iprogress "github.com/gdist/gdist/internal/progress"
)

// progress shows how training is going (rank 0).
type progress interface {
	// step is called after every step with the mean loss over the ranks,
	// the fraction of the run done and the throughput in tokens/s.
	step(step int, loss, frac, tokPerSec float64)
	// eval is called after every validation.
	eval(p point)
	finish()
}

// newProgress returns a redrawing progress bar on stderr when it is a
// terminal, and sparse plain lines otherwise (a pipe, as under gdistrun, or
// a file), where thousands of '\r' redraws would be noise. Validation lines
// go to out in both cases.
func newProgress(out, stderr io.Writer, tty bool) progress {
	if !tty {
		return &plainProgress{out: out, w: stderr, marks: iprogress.Milestones{Parts: 10}}
	}
	return &barProgress{out: out, bar: iprogress.NewBar(stderr, 1000, "train", "")}
}

// evalLine formats a validation point.
func evalLine(p point) string {
	train := "    -"
	if !math.IsNaN(p.Train) {
		train = fmt.Sprintf("%.3f", p.Train)
	}
	return fmt.Sprintf("step %5d  %7s  train %s  val %.3f", p.Step, p.Elapsed.Round(time.Second), train, p.Val)
}

type barProgress struct {
	out  io.Writer
	bar  *progressbar.ProgressBar
	loss iprogress.EMA
	val  float64
	vset bool
}

func (p *barProgress) step(step int, loss, frac, tokPerSec float64) {
	l := p.loss.Add(loss)
	desc := fmt.Sprintf("step %d  loss %.3f", step, l)
	if p.vset {
		desc += fmt.Sprintf("  val %.3f", p.val)
	}
	p.bar.Describe(fmt.Sprintf("%s  %.0f tok/s", desc, tokPerSec))
	_ = p.bar.Set(int(frac * 1000))
}

func (p *barProgress) eval(pt point) {
	p.val, p.vset = pt.Val, true
	_ = p.bar.Clear()
	fmt.Fprintln(p.out, evalLine(pt))
}

func (p *barProgress) finish() { _ = p.bar.Finish() }

// plainProgress prints a line at every tenth of the run.
type plainProgress struct {
	out, w io.Writer
	marks  iprogress.Milestones // a line at every tenth
	loss   iprogress.EMA
}

func (p *plainProgress) step(step int, loss, frac, tokPerSec float64) {
	l := p.loss.Add(loss)
	if !p.marks.DueFrac(frac) {
		return
	}
	fmt.Fprintf(p.w, "train %3.0f%%  step %d  loss %.3f  %.0f tok/s\n", 100*frac, step, l, tokPerSec)
}

func (p *plainProgress) eval(pt point) { fmt.Fprintln(p.out, evalLine(pt)) }

func (p *plainProgress) finish() {}
