package dist

// Observability: the group's timeline (WithTimeline; gdist.InitFromEnv
// reads GDIST_TIMELINE) and Prometheus metrics (WithMetricsAddr;
// GDIST_METRICS_ADDR). Both are off by
// default; off, a collective pays one branch and allocates nothing.

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/gdist/gdist/dist/metrics"
	"github.com/gdist/gdist/dist/timeline"
	"github.com/gdist/gdist/internal/logx"
)

// WithTimeline records every collective (and, through Timeline, DDP buckets
// and pipeline micro-batches) and writes them when the group closes, as a
// Chrome trace-event JSON file that chrome://tracing and Perfetto open. path
// names rank 0's file and the others': "{rank}" in it is replaced by the
// rank, else ".rankN" goes before the extension (timeline.json ->
// timeline.rank1.json). Timestamps share the host's clock, so the ranks'
// files can be merged into one view (timeline.Merge). The group creates
// the file's directory and checks that it can write there when it starts
// (timeline.Prepare): New fails with an error naming the path if it cannot.
// Close writes the file, logs its path at INFO (see WithMetricsAddr for
// where), and returns the error if writing fails.
func WithTimeline(path string) Option {
	return func(c *config) error {
		if path == "" {
			return invalidOption("WithTimeline(%q): empty path", path)
		}
		c.timeline = path
		return nil
	}
}

// WithMetricsAddr serves the group's Prometheus metrics at
// http://addr/metrics (addr is host:port; port 0 picks a free one, see
// MetricsAddr) until the group closes: bytes per peer, collective counts,
// bytes and latency histograms, DDP communication and exposed communication,
// heartbeat round trips (reported by the transport's owner to Metrics, as
// gdist.InitFromEnv does for its TCP links), restarts (WithRestartCount),
// and the Go runtime's own. The group logs the address it bound at INFO:
// to the group's logger when WithLogger or a debug level is given, else to
// stderr (in the format GDIST_LOG_FORMAT selects). gdist.InitFromEnv takes
// GDIST_METRICS_ADDR with the port moved by the local rank
// (metrics.RankAddr), so that the ranks of one host do not collide; New
// serves on addr as given.
func WithMetricsAddr(addr string) Option {
	return func(c *config) error {
		if addr == "" {
			return invalidOption("WithMetricsAddr(%q): empty address", addr)
		}
		c.metricsAddr = addr
		return nil
	}
}

// observability is the group's timeline and metrics; the zero value is off.
type observability struct {
	tl     *timeline.Recorder
	tlPath string
	met    *metrics.Metrics
	srv    *metrics.Server
	// log is where the group says what it serves and writes: the group's
	// logger if the user chose one (WithLogger, WithDebug), else stderr at
	// INFO, since a user who turned these on wants to know where they are.
	log *slog.Logger
}

func (o *observability) on() bool { return o.tl != nil || o.met != nil }

// startObservability turns on what cfg asks for.
func (d *domain) startObservability(cfg *config) error {
	if cfg.timeline == "" && cfg.metricsAddr == "" {
		return nil
	}
	d.obs.log = d.log
	if !cfg.loggerSet && cfg.debug == DebugOff {
		d.obs.log = logx.FromEnv(os.Stderr, slog.LevelInfo).With("rank", d.rank)
	}
	if cfg.timeline != "" {
		tl, err := timeline.New(d.rank)
		if err != nil {
			return err
		}
		path := timeline.RankPath(cfg.timeline, d.rank)
		if err := timeline.Prepare(path); err != nil {
			return fmt.Errorf("dist: rank %d: %w", d.rank, err)
		}
		d.obs.tl, d.obs.tlPath = tl, path
	}
	if cfg.metricsAddr != "" {
		names := make([]string, 0, len(opNames))
		for _, n := range opNames {
			if n != "" {
				names = append(names, n)
			}
		}
		m := metrics.New(d.rank, d.world, names)
		srv, err := m.Serve(cfg.metricsAddr)
		if err != nil {
			return fmt.Errorf("dist: rank %d: %w", d.rank, err)
		}
		m.SetRestarts(cfg.restarts)
		d.obs.met, d.obs.srv = m, srv
		d.obs.log.Info("dist: serving metrics", "addr", "http://"+srv.Addr().String()+"/metrics")
	}
	return nil
}

// stopObservability writes the timeline and stops the metrics server.
func (d *domain) stopObservability() error {
	var errs []error
	if d.obs.tl != nil {
		if err := d.obs.tl.WriteFile(d.obs.tlPath); err != nil {
			errs = append(errs, fmt.Errorf("dist: rank %d: %w", d.rank, err))
		} else {
			kept, dropped := d.obs.tl.Len()
			d.obs.log.Info("dist: wrote timeline", "path", d.obs.tlPath, "events", kept, "dropped", dropped)
		}
	}
	if d.obs.srv != nil {
		if err := d.obs.srv.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Timeline returns the job's timeline recorder, or nil when the timeline
// is off (a nil recorder records nothing). Layers above dist (ddp, pipeline)
// and programs add their own events to it.
func (g *ProcessGroup) Timeline() *timeline.Recorder { return g.d.obs.tl }

// Metrics returns the job's metrics, or nil when they are off (nil records
// nothing).
func (g *ProcessGroup) Metrics() *metrics.Metrics { return g.d.obs.met }

// MetricsAddr returns the address the metrics endpoint listens on, or "" if
// it is off.
func (g *ProcessGroup) MetricsAddr() string {
	if g.d.obs.srv == nil {
		return ""
	}
	return g.d.obs.srv.Addr().String()
}

// algorithm names the algorithm the group runs for c, for the timeline.
func (g *ProcessGroup) algorithm(c *call) string {
	if g.size == 1 {
		return "local"
	}
	small := len(c.data) < g.net.Small
	if g.net.Hier != nil && (c.kind == kAllReduce || c.kind == kBroadcast) {
		return "hierarchical"
	}
	switch c.kind {
	case kAllReduce:
		if g.size == 2 && g.net.PairSegment > 0 && !small {
			return "pair"
		}
		if small || (g.size == 2 && len(c.data) < g.net.SmallPair) {
			return "recursive_doubling"
		}
		return "ring"
	case kAllGather, kAllGatherV, kReduceScatter, kNewGroup, kSplit:
		return "ring"
	case kBroadcast, kReduce:
		if small {
			return "tree"
		}
		return "chain"
	case kAllToAll, kAllToAllV:
		return "pairwise"
	case kGather, kScatter:
		return "linear"
	case kBarrier:
		return "dissemination"
	}
	return ""
}

// observe records collective c (sequence number seq): it was called at
// queued, got its turn at start and finished at end with err.
func (g *ProcessGroup) observe(c *call, seq uint64, queued, start, end time.Time, err error) {
	obs := &g.d.obs
	name := c.kind.String()
	obs.met.Collective(name, len(c.data), end.Sub(start))
	if obs.tl == nil {
		return
	}
	lane := g.lane
	if !queued.IsZero() && start.Sub(queued) > time.Microsecond {
		obs.tl.Add(timeline.Event{Lane: lane, Name: name + " (waiting for its turn)", Cat: "queue",
			Start: queued, End: start, Args: [4]timeline.Arg{{Key: "seq", Int: int64(seq)}}})
	}
	status := "ok"
	if err != nil {
		status = err.Error()
	}
	obs.tl.Add(timeline.Event{Lane: lane, Name: name, Cat: "collective", Start: start, End: end,
		Args: [4]timeline.Arg{
			{Key: "seq", Int: int64(seq)},
			{Key: "bytes", Int: int64(len(c.data))},
			{Key: "algorithm", Str: g.algorithm(c)},
			{Key: "status", Str: status},
		}})
}
