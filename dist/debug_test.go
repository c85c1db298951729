package dist

import (
	"context"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport/transporttest"
)

// TestCallSiteDesync: two ranks reach the same all-reduce (same op, dtype,
// count, position) from different lines. Sequence numbers and fingerprints
// cannot tell them apart, so by default the sums silently mix unrelated
// data; with DebugDetail both fail at that call, naming both call sites.
func TestCallSiteDesync(t *testing.T) {
	branchy := func(r int, g *ProcessGroup) error {
		d := []float32{float32(r + 1)}
		if r == 0 {
			return g.AllReduce(bg, F32(d), Sum) // "weights"
		}
		return g.AllReduce(bg, F32(d), Sum) // "metrics"
	}
	t.Run("off", func(t *testing.T) {
		c := newCluster(t, 2)
		requireNoErrors(t, c.run(branchy)) // undetectable without the call sites
	})
	t.Run("detail", func(t *testing.T) {
		c := newCluster(t, 2, WithDebug(DebugDetail))
		// Both ranks run both lines once first, so each knows the other's
		// call site by name.
		requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error { return branchy(0, g) }))
		requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error { return branchy(1, g) }))
		errs := c.run(branchy)
		for r, err := range errs {
			var de *DesyncError
			require.ErrorAs(t, err, &de, "rank %d", r)
			assert.Regexp(t, `debug_test\.go:\d+$`, de.LocalSite)
			assert.Regexp(t, `debug_test\.go:\d+$`, de.RemoteSite)
			assert.NotEqual(t, de.LocalSite, de.RemoteSite)
			assert.Equal(t, de.Seq, de.PeerSeq)
			t.Logf("rank %d: %v", r, err)
		}
	})
	t.Run("detail same line", func(t *testing.T) {
		c := newCluster(t, 2, WithDebug(DebugDetail))
		for range 3 {
			requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
				return g.AllReduce(bg, F32(make([]float32, 3)), Sum)
			}))
		}
	})
}

func TestDebugEnv(t *testing.T) {
	for v, want := range map[string]DebugLevel{"": DebugOff, "off": DebugOff, "INFO": DebugInfo, "debug": DebugDebug, "detail": DebugDetail} {
		got, err := ParseDebugLevel(v)
		require.NoError(t, err)
		assert.Equal(t, want, got, v)
	}
	_, err := ParseDebugLevel("verbose")
	require.ErrorIs(t, err, ErrInvalidArgument)

	c := newCluster(t, 1)
	t.Setenv(EnvDebug, "loud")
	_, err = New(c.ts[0])
	require.ErrorIs(t, err, ErrEnv)
	t.Setenv(EnvDebug, "detail")
	t.Setenv(EnvStallThreshold, "soon")
	_, err = New(c.ts[0])
	require.ErrorIs(t, err, ErrEnv)
	t.Setenv(EnvStallThreshold, "2m")
	cfg, err := newConfig(nil)
	require.NoError(t, err)
	assert.Equal(t, DebugDetail, cfg.debug)
	assert.Equal(t, 2*60e9, float64(cfg.stall))
	assert.True(t, cfg.logger.Enabled(context.Background(), -4), "debug level logs DEBUG")
	cfg, err = newConfig([]Option{WithDebug(DebugOff), WithStallThreshold(0)})
	require.NoError(t, err, "options win over the environment")
	assert.Equal(t, DebugOff, cfg.debug)
	assert.Zero(t, cfg.stall)
	for _, o := range []Option{WithDebug(9), WithStallThreshold(-1)} {
		_, err := newConfig([]Option{o})
		require.ErrorIs(t, err, ErrInvalidArgument)
	}
}

// BenchmarkDebugDetail is the cost of DebugDetail per collective: a
// 4096-float all-reduce between two in-process ranks with the call site
// walked and hashed per call, against the default.
func BenchmarkDebugDetail(b *testing.B) {
	for _, l := range []DebugLevel{DebugOff, DebugDetail} {
		b.Run(l.String(), func(b *testing.B) {
			benchAllReduce(b, "local", 2, 4096, WithDebug(l), WithLogger(discardLogger))
		})
	}
	b.Run("callSite", func(b *testing.B) {
		c := newCluster(b, 1, WithDebug(DebugDetail))
		b.ReportAllocs()
		for b.Loop() {
			c.gs[0].callSite()
		}
	})
}

var discardLogger = slog.New(slog.DiscardHandler)

// TestEnvLogFormat: GDIST_LOG_FORMAT other than text or json is refused,
// naming the variable; json makes the debug output JSON.
func TestEnvLogFormat(t *testing.T) {
	t.Setenv(EnvLogFormat, "xml")
	ts := transporttest.NewLocal(t, 1)
	_, err := New(ts[0])
	require.ErrorIs(t, err, ErrEnv)
	assert.Contains(t, err.Error(), EnvLogFormat)

	t.Setenv(EnvLogFormat, "json")
	t.Setenv(EnvDebug, "info")
	cfg, err := newConfig(nil)
	require.NoError(t, err)
	assert.IsType(t, &slog.JSONHandler{}, cfg.logger.Handler())
	require.NoError(t, ts[0].Close())
}
