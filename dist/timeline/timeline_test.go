package timeline

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type parsed struct{ TraceEvents []TraceEvent }

func TestWriteValidTrace(t *testing.T) {
	r, err := New(3)
	require.NoError(t, err)
	t0 := time.Now()
	r.Add(Event{Lane: "collectives", Name: "all_reduce", Start: t0, End: t0.Add(1500 * time.Microsecond),
		Args: [4]Arg{{Key: "bytes", Int: 4096}, {Key: "op", Str: "sum"}, {Key: "seq", Int: 7}}})
	r.Add(Event{Lane: "ddp", Name: "bucket 0 hook", Start: t0.Add(time.Millisecond)})
	r.Add(Event{Lane: "collectives", Name: "broadcast", Start: t0.Add(2 * time.Millisecond), End: t0.Add(3 * time.Millisecond)})
	var buf bytes.Buffer
	require.NoError(t, r.Write(&buf))

	var p parsed
	require.NoError(t, json.Unmarshal(buf.Bytes(), &p), buf.String())
	require.Len(t, p.TraceEvents, 2+2+3) // process name + sort index, 2 lanes, 3 events
	assert.Equal(t, "process_name", p.TraceEvents[0].Name)
	assert.Equal(t, "rank 3", p.TraceEvents[0].Args["name"])
	lanes := map[int]string{}
	for _, e := range p.TraceEvents {
		assert.Equal(t, 3, e.Pid)
		if e.Name == "thread_name" {
			lanes[e.Tid] = e.Args["name"].(string)
		}
	}
	assert.ElementsMatch(t, []string{"collectives", "ddp"}, []string{lanes[1], lanes[2]})
	ar := p.TraceEvents[4]
	assert.Equal(t, "all_reduce", ar.Name)
	assert.Equal(t, "X", ar.Ph)
	assert.InDelta(t, 1500, ar.Dur, 0.01)
	assert.InDelta(t, float64(t0.UnixNano())/1e3, ar.Ts, 1)
	assert.Equal(t, float64(4096), ar.Args["bytes"])
	assert.Equal(t, "sum", ar.Args["op"])
	assert.Equal(t, "i", p.TraceEvents[5].Ph)
	assert.Equal(t, lanes[p.TraceEvents[4].Tid], "collectives")
}

func TestNilRecorderIsOffAndFree(t *testing.T) {
	var r *Recorder
	assert.False(t, r.Enabled())
	now := time.Now()
	allocs := testing.AllocsPerRun(1000, func() {
		r.Add(Event{Lane: "collectives", Name: "all_reduce", Start: now, End: now, Args: [4]Arg{{Key: "bytes", Int: 1}}})
	})
	assert.Zero(t, allocs)
	kept, dropped := r.Len()
	assert.Zero(t, kept+dropped)
	assert.Error(t, r.Write(&bytes.Buffer{}))
}

func TestAddAllocatesOnlyToGrow(t *testing.T) {
	r, err := New(0, WithMaxEvents(1<<16))
	require.NoError(t, err)
	now := time.Now()
	e := Event{Lane: "collectives", Name: "all_reduce", Start: now, End: now}
	for range 1 << 12 {
		r.Add(e)
	}
	allocs := testing.AllocsPerRun(1000, func() { r.Add(e) })
	assert.Less(t, allocs, 0.01, "amortised append only")
}

func TestMaxEvents(t *testing.T) {
	_, err := New(0, WithMaxEvents(0))
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "WithMaxEvents(0)")
	_, err = New(0, nil)
	require.ErrorIs(t, err, ErrInvalidArgument)
	r, err := New(0, WithMaxEvents(2))
	require.NoError(t, err)
	for range 5 {
		r.Add(Event{Lane: "x", Name: "e", Start: time.Now()})
	}
	kept, dropped := r.Len()
	assert.Equal(t, 2, kept)
	assert.Equal(t, 3, dropped)
	var buf bytes.Buffer
	require.NoError(t, r.Write(&buf))
	assert.Contains(t, buf.String(), `"gdist_dropped_events":3`)
}

func TestWriteFileAndMerge(t *testing.T) {
	dir := t.TempDir()
	var paths []string
	for rank := range 2 {
		r, err := New(rank)
		require.NoError(t, err)
		r.Add(Event{Lane: "collectives", Name: "barrier", Start: time.Now(), End: time.Now()})
		p := RankPath(filepath.Join(dir, "timeline.json"), rank)
		require.NoError(t, r.WriteFile(p))
		paths = append(paths, p)
	}
	assert.Equal(t, filepath.Join(dir, "timeline.rank1.json"), paths[1])
	var buf bytes.Buffer
	require.NoError(t, Merge(&buf, paths...))
	var p parsed
	require.NoError(t, json.Unmarshal(buf.Bytes(), &p), buf.String())
	pids := map[int]int{}
	for _, e := range p.TraceEvents {
		pids[e.Pid]++
	}
	assert.Equal(t, map[int]int{0: 4, 1: 4}, pids)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 2, "no temporary files left")
}

func TestRankPath(t *testing.T) {
	assert.Equal(t, "out/tl.rank2.json", RankPath("out/tl.json", 2))
	assert.Equal(t, "out/r2/trace.json", RankPath("out/r{rank}/trace.json", 2))
	assert.Equal(t, "trace.rank0", RankPath("trace", 0))
}

// A path whose directory does not exist yet: Prepare and WriteFile create it.
func TestWriteFileCreatesDirectory(t *testing.T) {
	p := filepath.Join(t.TempDir(), "out", "deeper", "timeline.rank0.json")
	require.NoError(t, Prepare(p))
	st, err := os.Stat(filepath.Dir(p))
	require.NoError(t, err)
	assert.True(t, st.IsDir())
	left, err := os.ReadDir(filepath.Dir(p))
	require.NoError(t, err)
	assert.Empty(t, left, "Prepare leaves no probe file behind")

	require.NoError(t, os.RemoveAll(filepath.Dir(filepath.Dir(p))))
	r, err := New(0)
	require.NoError(t, err)
	r.Add(Event{Lane: "x", Name: "y", Start: time.Now(), End: time.Now()})
	require.NoError(t, r.WriteFile(p), "the directory removed since Prepare is created again")
	ev, err := ReadFile(p)
	require.NoError(t, err)
	assert.NotEmpty(t, ev)
}

// A path under a regular file cannot be written (even by root): Prepare
// and WriteFile fail naming it.
func TestPrepareUnwritable(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	p := filepath.Join(file, "out", "timeline.json")
	err := Prepare(p)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "timeline: cannot write "+p+": ")
	r, err := New(0)
	require.NoError(t, err)
	err = r.WriteFile(p)
	require.Error(t, err)
	assert.Contains(t, err.Error(), p)

	if os.Geteuid() != 0 { // root writes anywhere
		dir := filepath.Join(t.TempDir(), "ro")
		require.NoError(t, os.Mkdir(dir, 0o500))
		err := Prepare(filepath.Join(dir, "timeline.json"))
		require.Error(t, err)
		assert.ErrorIs(t, err, os.ErrPermission)
	}
}
