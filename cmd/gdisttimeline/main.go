// Command gdisttimeline merges the per-rank timeline files a gdist job
// writes (GDIST_TIMELINE, dist.WithTimeline) into one Chrome trace for
// chrome://tracing or Perfetto, and draws a window of them as a PNG: one row
// per rank and lane, one bar per event.
//
//	gdisttimeline merge -o job.json timeline.rank*.json
//	gdisttimeline plot -o step.png [-step K] [-mark NAME] timeline.rank*.json
//	gdisttimeline plot -o step.png -from 120.5 -to 150 timeline.rank*.json
//	gdisttimeline stats -window "train step" timeline.rank*.json
//
// plot shows by default one DDP step: from the end of the K-th (-step) event
// named -mark ("exposed communication", which ends every DDP step) on the
// lowest rank to the end of the next one. -from and -to give a window in
// milliseconds since the first event instead.
//
// stats prints, for every rank, where the time of its windows went: the
// windows are the events named -window (one per step, added by the
// program, or DDP's "exposed communication"), and for every lane and event
// name it gives the events per window, their time per window and their
// share of the windows' time (timeline.Summarize) — for instance the share
// of a training step that a tensor-parallel group's all-reduces take.
package main

import (
	"errors"
	"flag"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/gdist/gdist/dist/timeline"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

var errUsage = errors.New("usage")

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
		fmt.Fprint(stdout, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	var err error
	switch args[0] {
	case "merge":
		err = mergeCmd(args[1:], stdout)
	case "plot":
		err = plotCmd(args[1:], stdout)
	case "stats":
		err = statsCmd(args[1:], stdout)
	default:
		err = fmt.Errorf("%w: unknown command %q", errUsage, args[0])
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "gdisttimeline: %v\n%s", err, usage)
		return 2
	}
	fmt.Fprintf(stderr, "gdisttimeline: %v\n", err)
	return 1
}

const usage = `Usage:
  gdisttimeline merge -o OUT.json FILE...     one Chrome trace of every rank's file
  gdisttimeline plot -o OUT.png [flags] FILE... a PNG of a window of the events
  gdisttimeline stats -window NAME FILE...    per rank, each lane's share of the NAME events' time
Run 'gdisttimeline plot -h' for plot's flags.
`

// parse parses flags followed by file names.
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	return nil
}

func mergeCmd(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("merge", flag.ContinueOnError)
	fs.SetOutput(stdout)
	out := fs.String("o", "", "output file (default: standard output)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return fmt.Errorf("%w: merge needs timeline files", errUsage)
	}
	w := stdout
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	return timeline.Merge(w, fs.Args()...)
}

type event = timeline.TraceEvent

type row struct {
	pid  int
	tid  int
	name string
}

func load(paths []string) ([]event, map[row]string, error) {
	var evs []event
	lanes := map[row]string{}
	for _, p := range paths {
		all, err := timeline.ReadFile(p)
		if err != nil {
			return nil, nil, err
		}
		for k, v := range timeline.Lanes(all) {
			lanes[row{pid: k[0], tid: k[1]}] = v
		}
		for _, e := range all {
			if e.Ph == "X" {
				evs = append(evs, e)
			}
		}
	}
	if len(evs) == 0 {
		return nil, nil, errors.New("no complete events in the files")
	}
	return evs, lanes, nil
}

func plotCmd(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("plot", flag.ContinueOnError)
	fs.SetOutput(stdout)
	out := fs.String("o", "timeline.png", "output PNG")
	mark := fs.String("mark", "exposed communication", "event that ends a step")
	step := fs.Int("step", 100, "show the step after the -step'th -mark event of the lowest rank")
	from := fs.Float64("from", math.NaN(), "window start, ms since the first event (with -to, instead of -step)")
	to := fs.Float64("to", math.NaN(), "window end, ms since the first event")
	title := fs.String("title", "", "plot title (default: what the window shows)")
	width := fs.Float64("width", 28, "width in cm")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return fmt.Errorf("%w: plot needs timeline files", errUsage)
	}
	evs, lanes, err := load(fs.Args())
	if err != nil {
		return err
	}
	t0 := slices.MinFunc(evs, func(a, b event) int { return cmpF(a.Ts, b.Ts) }).Ts
	var lo, hi float64
	desc := ""
	if !math.IsNaN(*from) || !math.IsNaN(*to) {
		if math.IsNaN(*from) || math.IsNaN(*to) || *to <= *from {
			return fmt.Errorf("%w: -from and -to go together, with -to > -from", errUsage)
		}
		lo, hi = t0+*from*1e3, t0+*to*1e3
		desc = fmt.Sprintf("%.1f-%.1f ms", *from, *to)
	} else {
		minPid := slices.MinFunc(evs, func(a, b event) int { return a.Pid - b.Pid }).Pid
		var ends []float64
		for _, e := range evs {
			if e.Pid == minPid && e.Name == *mark {
				ends = append(ends, e.Ts+e.Dur)
			}
		}
		sort.Float64s(ends)
		if *step < 1 || *step+1 > len(ends)-1 {
			return fmt.Errorf("%w: -step %d: the files hold %d %q events on rank %d", errUsage, *step, len(ends), *mark, minPid)
		}
		lo, hi = ends[*step-1], ends[*step]
		pad := (hi - lo) * 0.02
		lo, hi = lo-pad, hi+pad
		desc = fmt.Sprintf("step %d", *step+1)
	}

	// Rows: every (rank, lane) with an event, rank by rank.
	present := map[row]bool{}
	for _, e := range evs {
		if e.Ts+e.Dur >= lo && e.Ts <= hi {
			present[row{pid: e.Pid, tid: e.Tid}] = true
		}
	}
	if len(present) == 0 {
		return fmt.Errorf("%w: no event in the window %s", errUsage, desc)
	}
	var rows []row
	for r := range present {
		r.name = fmt.Sprintf("rank %d  %s", r.pid, lanes[r])
		rows = append(rows, r)
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].pid != rows[j].pid {
			return rows[i].pid < rows[j].pid
		}
		return rows[i].tid < rows[j].tid
	})
	index := map[row]int{}
	for i, r := range rows {
		index[row{pid: r.pid, tid: r.tid}] = len(rows) - 1 - i // rank 0 on top
	}

	p := plot.New()
	if *title == "" {
		*title = "gdist timeline, " + desc
	}
	p.Title.Text = *title
	p.X.Label.Text = "ms"
	p.X.Min, p.X.Max = 0, (hi-lo)/1e3
	p.Y.Min, p.Y.Max = -0.5, float64(len(rows))-0.5
	names := make([]string, len(rows))
	for i, r := range rows {
		names[len(rows)-1-i] = r.name
	}
	p.NominalY(names...)
	p.Add(plotter.NewGrid())
	bars := &gantt{lo: lo, hi: hi, colors: map[string]color.Color{}}
	for _, e := range evs {
		if e.Ts+e.Dur < lo || e.Ts > hi {
			continue
		}
		bars.add(float64(index[row{pid: e.Pid, tid: e.Tid}]), e)
	}
	p.Add(bars)
	for _, k := range bars.order {
		p.Legend.Add(k, legendBox{bars.colors[k]})
	}
	p.Legend.Top = true
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	// Room above the rows for the legend.
	p.Y.Max += 0.45 * float64(len(bars.order))
	height := vg.Length(3+0.9*float64(len(rows))+0.4*float64(len(bars.order))) * vg.Centimeter
	if err := p.Save(vg.Length(*width)*vg.Centimeter, height, *out); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "gdisttimeline: %s: %d rows, %d events, %s (%.2f ms)\n", *out, len(rows), len(bars.bars), desc, (hi-lo)/1e3)
	return nil
}

func cmpF(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// kind groups event names for colouring: "bucket 3 all-reduce" and
// "bucket 0 all-reduce" share one colour.
func kind(name string) string {
	f := strings.Fields(name)
	out := f[:0]
	for _, w := range f {
		if strings.Trim(w, "0123456789") != "" {
			out = append(out, w)
		}
	}
	return strings.Join(out, " ")
}

type bar struct {
	y, x0, x1 float64
	c         color.Color
}

// gantt draws one bar per event.
type gantt struct {
	lo, hi float64
	bars   []bar
	colors map[string]color.Color
	order  []string
}

var palette = []color.Color{
	color.RGBA{0x4e, 0x79, 0xa7, 0xff}, color.RGBA{0xf2, 0x8e, 0x2b, 0xff}, color.RGBA{0xe1, 0x57, 0x59, 0xff},
	color.RGBA{0x76, 0xb7, 0xb2, 0xff}, color.RGBA{0x59, 0xa1, 0x4f, 0xff}, color.RGBA{0xed, 0xc9, 0x48, 0xff},
	color.RGBA{0xb0, 0x7a, 0xa1, 0xff}, color.RGBA{0xff, 0x9d, 0xa7, 0xff}, color.RGBA{0x9c, 0x75, 0x5f, 0xff},
	color.RGBA{0xba, 0xb0, 0xac, 0xff},
}

func (g *gantt) add(y float64, e event) {
	k := kind(e.Name)
	c, ok := g.colors[k]
	if !ok {
		c = palette[len(g.order)%len(palette)]
		g.colors[k] = c
		g.order = append(g.order, k)
	}
	x0 := max(e.Ts, g.lo) - g.lo
	x1 := min(e.Ts+e.Dur, g.hi) - g.lo
	g.bars = append(g.bars, bar{y: y, x0: x0 / 1e3, x1: x1 / 1e3, c: c})
}

// Plot implements plot.Plotter.
func (g *gantt) Plot(c draw.Canvas, p *plot.Plot) {
	tx, ty := p.Transforms(&c)
	for _, b := range g.bars {
		x0, x1 := tx(b.x0), tx(b.x1)
		if x1-x0 < 1 { // keep sub-pixel events visible
			x1 = x0 + 1
		}
		y0, y1 := ty(b.y-0.35), ty(b.y+0.35)
		c.FillPolygon(b.c, []vg.Point{{X: x0, Y: y0}, {X: x1, Y: y0}, {X: x1, Y: y1}, {X: x0, Y: y1}})
	}
}

type legendBox struct{ c color.Color }

func (l legendBox) Thumbnail(c *draw.Canvas) {
	pts := []vg.Point{{X: c.Min.X, Y: c.Min.Y}, {X: c.Max.X, Y: c.Min.Y}, {X: c.Max.X, Y: c.Max.Y}, {X: c.Min.X, Y: c.Max.Y}}
	c.FillPolygon(l.c, pts)
}
