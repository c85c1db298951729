// Package logx builds the log/slog loggers every gdist component logs
// through, so that one job writes one format: slog's text handler by
// default, its JSON handler when GDIST_LOG_FORMAT=json (gdistrun
// -log-format json sets it for the ranks).
//
// # Usage
//
//	log := logx.FromEnv(os.Stderr, slog.LevelInfo) // text, or JSON per GDIST_LOG_FORMAT
//	log.Info("dist: serving metrics", "addr", addr)
//
// A library's default logger is Default: the program's slog.Default() if it
// set one, else FromEnv(os.Stderr, slog.LevelInfo).
package logx

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
)

// EnvFormat is the environment variable that selects the log format:
// "text" (the default) or "json".
const EnvFormat = "GDIST_LOG_FORMAT"

// The log formats.
const (
	Text = "text" // slog.TextHandler: time=… level=INFO msg=… key=value
	JSON = "json" // slog.JSONHandler: one JSON object per line
)

// ParseFormat returns the format s names: "" and "text" (any case) are
// Text, "json" is JSON; anything else is an error that says what is
// accepted.
func ParseFormat(s string) (string, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", Text:
		return Text, nil
	case JSON:
		return JSON, nil
	}
	return "", fmt.Errorf("log format %q: want text or json", s)
}

// EnvFormatValue returns the format GDIST_LOG_FORMAT selects, or an error
// naming the variable if its value is neither text nor json.
func EnvFormatValue() (string, error) {
	f, err := ParseFormat(os.Getenv(EnvFormat))
	if err != nil {
		return Text, fmt.Errorf("%s: %w", EnvFormat, err)
	}
	return f, nil
}

// New returns a logger writing records at level and above to w in format
// (Text or JSON; any other value is taken as Text).
func New(w io.Writer, format string, level slog.Leveler) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == JSON {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// FromEnv returns New(w, the format GDIST_LOG_FORMAT selects, level). A
// value other than text or json selects text (components that can report
// errors check it with EnvFormatValue).
func FromEnv(w io.Writer, level slog.Leveler) *slog.Logger {
	f, _ := EnvFormatValue()
	return New(w, f, level)
}

// initial is slog's default logger before main ran: while slog.Default()
// is still it, the program has not chosen a logger of its own, and slog's
// default writes through package log in a format of its own ("2026/01/02
// 15:04:05 INFO msg"), which Default replaces.
var initial = slog.Default()

// Default returns the logger a component uses when its caller gave none:
// slog.Default() if the program set one (slog.SetDefault), else a logger
// on stderr at INFO in the format GDIST_LOG_FORMAT selects.
func Default() *slog.Logger {
	if l := slog.Default(); l != initial {
		return l
	}
	return FromEnv(os.Stderr, slog.LevelInfo)
}
