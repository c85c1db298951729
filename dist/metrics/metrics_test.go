package metrics

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestServeTextFormat(t *testing.T) {
	m := New(1, 2, []string{"all_reduce", "broadcast"})
	m.Collective("all_reduce", 4096, 120*time.Microsecond)
	m.Collective("all_reduce", 4096, 80*time.Microsecond)
	m.Collective("unknown", 1, time.Second) // ignored
	m.Sent(0, 100)
	m.Received(0, 50)
	m.Sent(7, 1) // out of range: ignored
	m.HeartbeatRTT(0, 40*time.Microsecond)
	m.DDPStep(time.Millisecond, 300*time.Microsecond)
	m.SetRestarts(2)

	srv, err := m.Serve("127.0.0.1:0")
	require.NoError(t, err)
	defer srv.Close()
	resp, err := http.Get("http://" + srv.Addr().String() + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)

	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	require.NoError(t, err, "valid Prometheus text format")
	val := func(name string, labels map[string]string) float64 {
		f := fams[name]
		require.NotNil(t, f, name)
	next:
		for _, mt := range f.Metric {
			for _, l := range mt.Label {
				if want, ok := labels[l.GetName()]; ok && want != l.GetValue() {
					continue next
				}
			}
			switch {
			case mt.Counter != nil:
				return mt.Counter.GetValue()
			case mt.Gauge != nil:
				return mt.Gauge.GetValue()
			case mt.Histogram != nil:
				return float64(mt.Histogram.GetSampleCount())
			}
		}
		t.Fatalf("%s %v not found", name, labels)
		return 0
	}
	assert.Equal(t, 2.0, val("gdist_collectives_total", map[string]string{"op": "all_reduce", "rank": "1"}))
	assert.Equal(t, 0.0, val("gdist_collectives_total", map[string]string{"op": "broadcast"}))
	assert.Equal(t, 8192.0, val("gdist_collective_bytes_total", map[string]string{"op": "all_reduce"}))
	assert.Equal(t, 2.0, val("gdist_collective_seconds", map[string]string{"op": "all_reduce"}))
	assert.Equal(t, 100.0, val("gdist_peer_sent_bytes_total", map[string]string{"peer": "0"}))
	assert.Equal(t, 50.0, val("gdist_peer_received_bytes_total", map[string]string{"peer": "0"}))
	assert.Equal(t, 1.0, val("gdist_heartbeat_rtt_seconds", map[string]string{"peer": "0"}))
	assert.Equal(t, 1.0, val("gdist_ddp_steps_total", nil))
	assert.Equal(t, 1.0, val("gdist_ddp_exposed_seconds", nil))
	assert.Equal(t, 2.0, val("gdist_restarts", nil))
	assert.Equal(t, 2.0, val("gdist_world_size", nil))
	require.NoError(t, srv.Close())
	require.NoError(t, srv.Close(), "idempotent")
}

func TestNilIsOffAndFree(t *testing.T) {
	var m *Metrics
	assert.False(t, m.Enabled())
	allocs := testing.AllocsPerRun(1000, func() {
		m.Collective("all_reduce", 1, time.Microsecond)
		m.Sent(0, 1)
		m.Received(0, 1)
		m.HeartbeatRTT(0, time.Microsecond)
		m.DDPStep(time.Microsecond, time.Microsecond)
		m.SetRestarts(1)
	})
	assert.Zero(t, allocs)
}

func TestOnAllocatesNothing(t *testing.T) {
	m := New(0, 4, []string{"all_reduce"})
	allocs := testing.AllocsPerRun(1000, func() {
		m.Collective("all_reduce", 4096, 100*time.Microsecond)
		m.Sent(3, 4096)
		m.Received(3, 4096)
	})
	assert.Zero(t, allocs)
}

func BenchmarkCollectiveOn(b *testing.B) {
	m := New(0, 2, []string{"all_reduce"})
	b.ReportAllocs()
	for b.Loop() {
		m.Collective("all_reduce", 4096, 100*time.Microsecond)
	}
}

func BenchmarkCollectiveOff(b *testing.B) {
	var m *Metrics
	b.ReportAllocs()
	for b.Loop() {
		m.Collective("all_reduce", 4096, 100*time.Microsecond)
	}
}
