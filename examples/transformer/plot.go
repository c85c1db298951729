package main

import (
	"fmt"
	"image/color"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// writePlot writes a PNG of the training loss (mean over the ranks,
// averaged over windows of steps) and the validation loss against steps.
func writePlot(path string, res *trainResult) error {
	p := plot.New()
	p.Title.Text = "char-level transformer on Newton's Opticks"
	p.X.Label.Text = "step"
	p.Y.Label.Text = "cross-entropy (nats/char)"

	var train, val plotter.XYs
	window := max(1, len(res.Losses)/100)
	for lo := 0; lo < len(res.Losses); lo += window {
		hi := min(lo+window, len(res.Losses))
		var s float64
		for _, l := range res.Losses[lo:hi] {
			s += l
		}
		// Step numbers are 1-based: steps lo+1..hi.
		train = append(train, plotter.XY{X: float64(lo+1+hi) / 2, Y: s / float64(hi-lo)})
	}
	for _, pt := range res.Curve {
		val = append(val, plotter.XY{X: float64(pt.Step), Y: pt.Val})
	}
	if len(train) == 0 || len(val) == 0 {
		return fmt.Errorf("transformer: plot: no points")
	}
	tl, err := plotter.NewLine(train)
	if err != nil {
		return fmt.Errorf("transformer: plot: %w", err)
	}
	tl.Color = color.RGBA{R: 31, G: 119, B: 180, A: 255}
	vl, vp, err := plotter.NewLinePoints(val)
	if err != nil {
		return fmt.Errorf("transformer: plot: %w", err)
	}
	vl.Color = color.RGBA{R: 214, G: 39, B: 40, A: 255}
	vp.Color = vl.Color
	p.Add(tl, vl, vp, plotter.NewGrid())
	p.Legend.Add("train (window mean)", tl)
	p.Legend.Add("validation (held-out tail)", vl, vp)
	p.Legend.Top = true
	p.Y.Min = 0

	if err := p.Save(7*vg.Inch, 4*vg.Inch, path); err != nil {
		return fmt.Errorf("transformer: plot %s: %w", path, err)
	}
	return nil
}
