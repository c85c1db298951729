package main

import (
	"bytes"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/timeline"
)

// writeJob writes two ranks' timelines of three DDP-like steps.
func writeJob(t *testing.T) []string {
	dir := t.TempDir()
	t0 := time.Now()
	ms := func(f float64) time.Time { return t0.Add(time.Duration(f * float64(time.Millisecond))) }
	var paths []string
	for r := range 2 {
		rec, err := timeline.New(r)
		require.NoError(t, err)
		for s := range 3 {
			b := float64(10 * s)
			rec.Add(timeline.Event{Lane: "ddp backward", Name: "bucket 0 gradients", Start: ms(b + 1), End: ms(b + 6)})
			rec.Add(timeline.Event{Lane: "collectives", Name: "all_reduce", Start: ms(b + 6), End: ms(b + 8)})
			rec.Add(timeline.Event{Lane: "ddp wait", Name: "exposed communication", Start: ms(b + 7), End: ms(b + 8)})
		}
		p := timeline.RankPath(filepath.Join(dir, "tl.json"), r)
		require.NoError(t, rec.WriteFile(p))
		paths = append(paths, p)
	}
	return paths
}

func TestPlot(t *testing.T) {
	paths := writeJob(t)
	out := filepath.Join(t.TempDir(), "step.png")
	var stdout, stderr bytes.Buffer
	code := run(append([]string{"plot", "-o", out, "-step", "1"}, paths...), &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	assert.Contains(t, stdout.String(), "6 rows, 10 events, step 2")
	f, err := os.Open(out)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	assert.Greater(t, img.Bounds().Dx(), 500)

	code = run(append([]string{"plot", "-o", out, "-from", "0", "-to", "25"}, paths...), &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	code = run(append([]string{"plot", "-o", out, "-step", "9"}, paths...), &stdout, &stderr)
	assert.Equal(t, 2, code, "a step past the end is a usage error")
	stderr.Reset()
	code = run(append([]string{"plot", "-o", out, "-from", "1e6", "-to", "2e6"}, paths...), &stdout, &stderr)
	assert.Equal(t, 2, code, "a window without events is a usage error")
	assert.Contains(t, stderr.String(), "no event in the window")
}

func TestMerge(t *testing.T) {
	paths := writeJob(t)
	out := filepath.Join(t.TempDir(), "job.json")
	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, run(append([]string{"merge", "-o", out}, paths...), &stdout, &stderr), stderr.String())
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	var f struct {
		TraceEvents []struct {
			Pid int `json:"pid"`
		} `json:"traceEvents"`
	}
	require.NoError(t, json.Unmarshal(b, &f))
	pids := map[int]int{}
	for _, e := range f.TraceEvents {
		pids[e.Pid]++
	}
	assert.Len(t, pids, 2)
}

func TestHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	assert.Equal(t, 0, run([]string{"-h"}, &stdout, &stderr))
	assert.Equal(t, 0, run([]string{"plot", "-h"}, &stdout, &stderr))
	assert.Equal(t, 2, run([]string{"bogus"}, &stdout, &stderr))
	assert.Equal(t, 2, run(nil, &stdout, &stderr))
}

// TestStats: in each step the all-reduce (6-8 ms) fills the 1 ms window of
// the exposed communication (7-8 ms); the gradients (1-6 ms) stay out.
func TestStats(t *testing.T) {
	paths := writeJob(t)
	var stdout, stderr bytes.Buffer
	code := run(append([]string{"stats", "-window", "exposed communication"}, paths...), &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	out := stdout.String()
	assert.Regexp(t, `(?m)^ +0 +3 +1\.000 +collectives +all_reduce +1\.0 +1\.000 +100\.0%`, out)
	assert.Regexp(t, `(?m)^ +1 +3 +1\.000 +collectives +all_reduce`, out)
	code = run(append([]string{"stats", "-window", "nothing"}, paths...), &stdout, &stderr)
	assert.Equal(t, 1, code)
	code = run([]string{"stats"}, &stdout, &stderr)
	assert.Equal(t, 2, code)
}
