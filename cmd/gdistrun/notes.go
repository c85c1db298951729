package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/gdist/gdist/internal/logx"
)

// errVersion reports that -version printed the version: exit 0.
var errVersion = errors.New("version printed")

// notes writes gdistrun's own messages to stderr: "gdistrun: ..." lines in
// the text format, as a command speaks to its user, and slog JSON records
// ({"time":…,"level":"WARN","msg":"gdistrun: …"}) in the json format, so
// that a job logging JSON writes nothing else on stderr but its ranks'
// own output.
type notes struct {
	w    io.Writer
	json *slog.Logger // nil: text lines
}

// newNotes returns the notes of a run of cfg with environment environ: in
// -log-format's format, else GDIST_LOG_FORMAT's.
func newNotes(w io.Writer, cfg config, environ []string) notes {
	format := cfg.logFormat
	if format == "" {
		format, _ = logx.ParseFormat(lookupEnv(environ, logx.EnvFormat)) // refused by resolveJob if bad
	}
	if format == logx.JSON {
		return notes{w: w, json: logx.New(w, logx.JSON, slog.LevelInfo)}
	}
	return notes{w: w}
}

// say writes one message at level.
func (n notes) say(level slog.Level, format string, args ...any) {
	msg := "gdistrun: " + fmt.Sprintf(format, args...)
	if n.json != nil {
		n.json.Log(context.Background(), level, msg)
		return
	}
	fmt.Fprintln(n.w, msg)
}

// printVersion writes gdistrun's module version and the VCS revision it
// was built from, as the build info records them (versionLine).
func printVersion(w io.Writer) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	fmt.Fprintln(w, versionLine(bi))
}

// versionLine describes the build bi (nil: none recorded), e.g.
//
//	gdistrun github.com/gdist/gdist (devel), revision 497369b… (2026-01-02T10:00:00Z, modified), go1.26.8 linux/amd64
//
// go build records the revision when it builds in a git checkout with
// -buildvcs on (the default where git is installed); otherwise the line
// says "no VCS revision recorded".
func versionLine(bi *debug.BuildInfo) string {
	module, version, vcs := "github.com/gdist/gdist", "(unknown)", "no VCS revision recorded"
	if bi != nil {
		if bi.Main.Path != "" {
			module = bi.Main.Path
		}
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
		var rev string
		var extra []string
		for _, s := range bi.Settings {
			switch {
			case s.Key == "vcs.revision":
				rev = s.Value
			case s.Key == "vcs.time":
				extra = append([]string{s.Value}, extra...)
			case s.Key == "vcs.modified" && s.Value == "true":
				extra = append(extra, "modified")
			}
		}
		if rev != "" {
			vcs = "revision " + rev
			if len(extra) > 0 {
				vcs += " (" + strings.Join(extra, ", ") + ")"
			}
		}
	}
	return fmt.Sprintf("gdistrun %s %s, %s, %s %s/%s", module, version, vcs, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
