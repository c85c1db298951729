package dist

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/timeline"
	"github.com/gdist/gdist/dist/transport/transporttest"
)

type traceFile struct{ TraceEvents []timeline.TraceEvent }

func readTrace(t *testing.T, path string) traceFile {
	t.Helper()
	evs, err := timeline.ReadFile(path)
	require.NoError(t, err, "valid trace-event JSON")
	return traceFile{evs}
}

// TestTimeline: every collective of every rank is on the rank's timeline,
// with its sequence number, bytes, algorithm and status.
func TestTimeline(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "timeline.json")
	ts := transporttest.NewLocal(t, 3)
	gs := make([]*ProcessGroup, 3)
	for r := range gs {
		g, err := New(ts[r], WithTimeline(path), WithSmallThreshold(1024))
		require.NoError(t, err)
		gs[r] = g
	}
	c := &cluster{gs: gs, ts: ts}
	errs := c.run(func(r int, g *ProcessGroup) error {
		small := []float32{1, 2, 3}
		big := make([]float32, 1000)
		return errors.Join(g.AllReduce(bg, F32(small), Sum), g.AllReduce(bg, F32(big), Sum),
			g.Broadcast(bg, F32(small), 0), g.Barrier(bg), g.AllReduceAsync(bg, F32(small), Max).Wait(bg))
	})
	require.NoError(t, errors.Join(errs...))
	g0 := gs[0]
	g0.Timeline().Add(timeline.Event{Lane: "user", Name: "my step", Start: time.Now(), End: time.Now()})
	for _, g := range gs {
		require.NoError(t, g.Close())
	}
	var paths []string
	for r := range gs {
		p := timeline.RankPath(path, r)
		paths = append(paths, p)
		tf := readTrace(t, p)
		var names []string
		for _, e := range tf.TraceEvents {
			assert.Equal(t, r, e.Pid)
			if e.Ph == "X" && e.Args["status"] != nil {
				names = append(names, e.Name)
				assert.Equal(t, "ok", e.Args["status"])
				assert.GreaterOrEqual(t, e.Dur, 0.0)
			}
		}
		assert.Equal(t, []string{"all_reduce", "all_reduce", "broadcast", "barrier", "all_reduce"}, names, "rank %d", r)
		var algos []string
		for _, e := range tf.TraceEvents {
			if e.Name == "all_reduce" {
				algos = append(algos, e.Args["algorithm"].(string))
				if e.Args["bytes"] == 4000.0 {
					assert.Equal(t, 2.0, e.Args["seq"])
				}
			}
		}
		assert.Equal(t, []string{"recursive_doubling", "ring", "recursive_doubling"}, algos)
	}
	tf := readTrace(t, paths[0])
	found := false
	for _, e := range tf.TraceEvents {
		found = found || e.Name == "my step"
	}
	assert.True(t, found, "a program's own events land on the same timeline")
}

// A timeline under a directory that does not exist: the group creates it
// at start, writes the file at Close and names it in the log.
func TestTimelineCreatesDirectory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out", "run1", "timeline.json")
	var logs transporttest.LogBuffer
	ts := transporttest.NewLocal(t, 1)
	g, err := New(ts[0], WithTimeline(path), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	_, err = os.Stat(filepath.Dir(path))
	require.NoError(t, err, "the directory exists from the start")
	require.NoError(t, g.Barrier(bg))
	require.NoError(t, g.Close())
	p := timeline.RankPath(path, 0)
	assert.NotEmpty(t, readTrace(t, p).TraceEvents)
	assert.Contains(t, logs.String(), `msg="dist: wrote timeline" rank=0 path=`+p+" events=")
}

// A timeline that cannot be written fails the group at start, naming the
// path, rather than after the work. (A path under a regular file: root,
// which runs CI, may write into any directory.)
func TestTimelineUnwritableFailsAtStart(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	path := filepath.Join(file, "timeline.json")
	ts := transporttest.NewLocal(t, 1)
	_, err := New(ts[0], WithTimeline(path))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "dist: rank 0: timeline: cannot write "+timeline.RankPath(path, 0)+": ")
	require.NoError(t, ts[0].Close(), "the transport is still the caller's")
}

// The metrics address goes to the group's logger when the user gave one.
func TestMetricsAddrLogged(t *testing.T) {
	var logs transporttest.LogBuffer
	ts := transporttest.NewLocal(t, 1)
	g, err := New(ts[0], WithMetricsAddr("127.0.0.1:0"), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	defer g.Close()
	assert.Contains(t, logs.String(), `msg="dist: serving metrics" rank=0 addr=http://`+g.MetricsAddr()+"/metrics")
}

func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	require.NoError(t, err)
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.Metric {
			key := name
			for _, l := range m.Label {
				if l.GetName() != "rank" {
					key += "," + l.GetName() + "=" + l.GetValue()
				}
			}
			switch {
			case m.Counter != nil:
				out[key] = m.Counter.GetValue()
			case m.Gauge != nil:
				out[key] = m.Gauge.GetValue()
			case m.Histogram != nil:
				out[key] = float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return out
}

func TestMetricsEndpoint(t *testing.T) {
	c := newCluster(t, 2, WithMetricsAddr("127.0.0.1:0"))
	errs := c.run(func(r int, g *ProcessGroup) error {
		d := make([]float32, 100)
		for range 5 {
			if err := g.AllReduce(bg, F32(d), Sum); err != nil {
				return err
			}
		}
		return g.Barrier(bg)
	})
	require.NoError(t, errors.Join(errs...))
	for _, g := range c.gs {
		require.NotEmpty(t, g.MetricsAddr())
		m := scrape(t, g.MetricsAddr())
		assert.Equal(t, 5.0, m["gdist_collectives_total,op=all_reduce"])
		assert.Equal(t, 2000.0, m["gdist_collective_bytes_total,op=all_reduce"])
		assert.Equal(t, 5.0, m["gdist_collective_seconds,op=all_reduce"])
		assert.Equal(t, 1.0, m["gdist_collectives_total,op=barrier"])
		assert.Equal(t, 2.0, m["gdist_world_size"])
		peer := "1"
		if g.Rank() == 1 {
			peer = "0"
		}
		// 5 all-reduces of 400 bytes: recursive doubling swaps the whole vector.
		assert.GreaterOrEqual(t, m["gdist_peer_sent_bytes_total,peer="+peer], 2000.0)
		assert.GreaterOrEqual(t, m["gdist_peer_received_bytes_total,peer="+peer], 2000.0)
	}
	addr := c.gs[0].MetricsAddr()
	require.NoError(t, c.gs[0].Close())
	_, err := http.Get("http://" + addr + "/metrics")
	assert.Error(t, err, "Close stops the endpoint")
}

func TestObservabilityOptions(t *testing.T) {
	ts := transporttest.NewLocal(t, 1)
	_, err := New(ts[0], WithTimeline(""))
	assert.ErrorIs(t, err, ErrInvalidArgument)
	_, err = New(ts[0], WithMetricsAddr(""))
	assert.ErrorIs(t, err, ErrInvalidArgument)
	_, err = New(ts[0], WithMetricsAddr("256.0.0.1:99999"))
	assert.Error(t, err)
	require.NoError(t, ts[0].Close())
}

// BenchmarkObservability is the cost of the timeline and the metrics per
// all-reduce of 4096 float32 between 2 in-process ranks, each setting
// measured in the same run.
func BenchmarkObservability(b *testing.B) {
	for _, s := range []struct {
		name string
		opts []Option
	}{
		{"off", nil},
		{"metrics", []Option{WithMetricsAddr("127.0.0.1:0")}},
		{"timeline", []Option{WithTimeline(filepath.Join(b.TempDir(), "tl.json"))}},
	} {
		b.Run(s.name, func(b *testing.B) { benchAllReduce(b, "local", 2, 4096, s.opts...) })
	}
}
