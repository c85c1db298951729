package main

import (
	"fmt"
	"image/color"
	"os"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// writePlot writes a PNG with two panels: rank 0's training loss (averaged
// over windows of steps) and the all-rank epoch mean loss against epochs,
// and the test accuracy after every epoch.
func writePlot(path string, res *result) error {
	lossPlot, accPlot := plot.New(), plot.New()
	lossPlot.Title.Text = "training loss"
	lossPlot.X.Label.Text = "epoch"
	lossPlot.Y.Label.Text = "cross-entropy"

	var smooth, epochLoss, acc plotter.XYs
	off := 0
	for ei, e := range res.Epochs {
		losses := res.Losses[off : off+e.Steps]
		off += e.Steps
		window := max(1, e.Steps/25)
		for lo := 0; lo < len(losses); lo += window {
			hi := min(lo+window, len(losses))
			var s float64
			for _, l := range losses[lo:hi] {
				s += l
			}
			x := float64(ei) + float64(lo+hi)/2/float64(e.Steps)
			smooth = append(smooth, plotter.XY{X: x, Y: s / float64(hi-lo)})
		}
		epochLoss = append(epochLoss, plotter.XY{X: float64(ei + 1), Y: e.Loss})
		acc = append(acc, plotter.XY{X: float64(ei + 1), Y: 100 * e.Acc})
	}
	line, err := plotter.NewLine(smooth)
	if err != nil {
		return fmt.Errorf("mnist: plot: %w", err)
	}
	line.Color = color.RGBA{R: 31, G: 119, B: 180, A: 255}
	pts, err := plotter.NewScatter(epochLoss)
	if err != nil {
		return fmt.Errorf("mnist: plot: %w", err)
	}
	pts.Color = color.RGBA{R: 214, G: 39, B: 40, A: 255}
	lossPlot.Add(line, pts, plotter.NewGrid())
	lossPlot.Legend.Add("rank 0, window mean", line)
	lossPlot.Legend.Add("epoch mean, all ranks", pts)
	lossPlot.Legend.Top = true
	lossPlot.Y.Min = 0
	lossPlot.X.Min, lossPlot.X.Max = 0, float64(len(res.Epochs))
	ticks := make([]plot.Tick, 0, len(res.Epochs)+1)
	for e := 0; e <= len(res.Epochs); e++ {
		ticks = append(ticks, plot.Tick{Value: float64(e), Label: strconv.Itoa(e)})
	}
	lossPlot.X.Tick.Marker = plot.ConstantTicks(ticks)
	accPlot.X.Tick.Marker = plot.ConstantTicks(ticks[1:])

	accPlot.Title.Text = "test accuracy"
	accPlot.X.Label.Text = "epoch"
	accPlot.Y.Label.Text = "%"
	al, ap, err := plotter.NewLinePoints(acc)
	if err != nil {
		return fmt.Errorf("mnist: plot: %w", err)
	}
	al.Color = color.RGBA{R: 44, G: 160, B: 44, A: 255}
	ap.Color = al.Color
	accPlot.Add(al, ap, plotter.NewGrid())
	accPlot.X.Min = 0.5
	accPlot.X.Max = float64(len(res.Epochs)) + 0.5

	img := vgimg.New(vg.Points(900), vg.Points(340))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Millimeter * 6, PadTop: vg.Millimeter * 2,
		PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4}
	plots := [][]*plot.Plot{{lossPlot, accPlot}}
	canvases := plot.Align(plots, tiles, dc)
	lossPlot.Draw(canvases[0][0])
	accPlot.Draw(canvases[0][1])

	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("mnist: plot: %w", err)
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("mnist: plot %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("mnist: plot %s: %w", path, err)
	}
	return nil
}
