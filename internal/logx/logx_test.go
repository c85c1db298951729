package logx

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseFormat(t *testing.T) {
	for in, want := range map[string]string{"": Text, "text": Text, "TEXT": Text, " json ": JSON, "JSON": JSON} {
		got, err := ParseFormat(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	_, err := ParseFormat("xml")
	require.Error(t, err)
	assert.Contains(t, err.Error(), `"xml": want text or json`)
}

func TestNewFormats(t *testing.T) {
	var b bytes.Buffer
	New(&b, JSON, slog.LevelInfo).Info("hello", "rank", 1)
	New(&b, JSON, slog.LevelInfo).Debug("not shown")
	var rec map[string]any
	require.NoError(t, json.Unmarshal(b.Bytes(), &rec), b.String())
	assert.Equal(t, "hello", rec["msg"])
	assert.Equal(t, "INFO", rec["level"])
	assert.EqualValues(t, 1, rec["rank"])

	b.Reset()
	New(&b, Text, slog.LevelInfo).Warn("careful", "peer", 2)
	assert.Regexp(t, `^time=\S+ level=WARN msg=careful peer=2\n$`, b.String())
}

func TestFromEnv(t *testing.T) {
	var b bytes.Buffer
	t.Setenv(EnvFormat, "json")
	FromEnv(&b, slog.LevelInfo).Info("x")
	assert.True(t, json.Valid(b.Bytes()), b.String())

	t.Setenv(EnvFormat, "yaml")
	_, err := EnvFormatValue()
	require.Error(t, err)
	assert.Contains(t, err.Error(), EnvFormat)
	b.Reset()
	FromEnv(&b, slog.LevelInfo).Info("x")
	assert.True(t, strings.HasPrefix(b.String(), "time="), "a bad value falls back to text: %q", b.String())
}

func TestDefault(t *testing.T) {
	// Not set by the program: a handler of logx's own, not package log's.
	assert.NotSame(t, slog.Default(), Default())
	assert.IsType(t, &slog.TextHandler{}, Default().Handler())
	t.Setenv(EnvFormat, "json")
	assert.IsType(t, &slog.JSONHandler{}, Default().Handler())

	// Set by the program: that one.
	prev := slog.Default()
	t.Cleanup(func() { slog.SetDefault(prev) })
	mine := slog.New(slog.NewTextHandler(os.Stdout, nil))
	slog.SetDefault(mine)
	assert.Same(t, mine, Default())
}
