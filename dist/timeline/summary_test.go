package timeline

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSummarize: two ranks, two steps each; events inside, across the edge
// of and outside the steps are counted by the part inside, per lane and
// name, and a rank without steps is left out.
func TestSummarize(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(x float64) time.Time { return t0.Add(time.Duration(x * float64(time.Millisecond))) }
	var all []TraceEvent
	for rank, shift := range []float64{0, 0.5, 0} {
		r, err := New(rank)
		require.NoError(t, err)
		if rank < 2 {
			r.Add(Event{Lane: "bench", Name: "step", Start: ms(shift), End: ms(shift + 10)})
			r.Add(Event{Lane: "bench", Name: "step", Start: ms(shift + 20), End: ms(shift + 30)})
		}
		ar := "collectives on tp"
		r.Add(Event{Lane: ar, Name: "all_reduce", Start: ms(shift + 1), End: ms(shift + 2)})     // 1 ms in
		r.Add(Event{Lane: ar, Name: "all_reduce", Start: ms(shift + 9), End: ms(shift + 12)})    // 1 ms in
		r.Add(Event{Lane: ar, Name: "all_reduce", Start: ms(shift + 14), End: ms(shift + 15)})   // between steps
		r.Add(Event{Lane: ar, Name: "all_reduce", Start: ms(shift + 21), End: ms(shift + 23.5)}) // 2.5 ms in
		r.Add(Event{Lane: "collectives", Name: "barrier", Start: ms(shift + 25), End: ms(shift + 26)})
		r.Add(Event{Lane: "collectives", Name: "instant", Start: ms(shift + 5)}) // not a complete event
		var buf bytes.Buffer
		require.NoError(t, r.Write(&buf))
		evs, err := Read(&buf)
		require.NoError(t, err)
		all = append(all, evs...)
	}
	spans := Summarize(all, "step")
	require.Len(t, spans, 4) // ranks 0 and 1: all_reduce, barrier
	for i, want := range []struct {
		rank  int
		lane  string
		name  string
		count int
		total time.Duration
	}{
		{0, "collectives on tp", "all_reduce", 3, 4500 * time.Microsecond},
		{0, "collectives", "barrier", 1, time.Millisecond},
		{1, "collectives on tp", "all_reduce", 3, 4500 * time.Microsecond},
		{1, "collectives", "barrier", 1, time.Millisecond},
	} {
		s := spans[i]
		assert.Equal(t, want.rank, s.Rank, i)
		assert.Equal(t, want.lane, s.Lane, i)
		assert.Equal(t, want.name, s.Name, i)
		assert.Equal(t, want.count, s.Count, i)
		assert.InDelta(t, want.total.Seconds(), s.Total.Seconds(), 1e-6, i)
		assert.Equal(t, 2, s.Windows, i)
		assert.InDelta(t, 0.020, s.WindowTotal.Seconds(), 1e-6, i)
	}
	assert.InDelta(t, 0.225, spans[0].Share(), 1e-6)
	n, d := spans[0].PerWindow()
	assert.InDelta(t, 1.5, n, 1e-9)
	assert.InDelta(t, 2.25e-3, d.Seconds(), 1e-6)
	assert.Empty(t, Summarize(all, "no such window"))
}
