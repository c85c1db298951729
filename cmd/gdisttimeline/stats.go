package main

import (
	"flag"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/gdist/gdist/dist/timeline"
)

// statsCmd prints, per rank, where the time of the -window events went
// (timeline.Summarize).
func statsCmd(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("stats", flag.ContinueOnError)
	fs.SetOutput(stdout)
	window := fs.String("window", "exposed communication", "name of the events that delimit the windows (a step each)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return fmt.Errorf("%w: stats needs timeline files", errUsage)
	}
	var evs []timeline.TraceEvent
	for _, p := range fs.Args() {
		e, err := timeline.ReadFile(p)
		if err != nil {
			return err
		}
		evs = append(evs, e...)
	}
	spans := timeline.Summarize(evs, *window)
	if len(spans) == 0 {
		return fmt.Errorf("no events overlap a %q event in the files", *window)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "rank\twindows\tms/window\tlane\tname\tevents/window\tms/window\tshare\t")
	for _, s := range spans {
		n, d := s.PerWindow()
		fmt.Fprintf(tw, "%d\t%d\t%.3f\t%s\t%s\t%.1f\t%.3f\t%.1f%%\t\n", s.Rank, s.Windows,
			s.WindowTotal.Seconds()*1e3/float64(s.Windows), s.Lane, s.Name, n, d.Seconds()*1e3, 100*s.Share())
	}
	return tw.Flush()
}
