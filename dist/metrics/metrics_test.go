package metrics

import (
	"io"
	"net"
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

func TestRankAddr(t *testing.T) {
	for _, c := range []struct {
		addr  string
		local int
		want  string
	}{
		{"127.0.0.1:9464", 0, "127.0.0.1:9464"},
		{"127.0.0.1:9464", 1, "127.0.0.1:9465"},
		{":9464", 3, ":9467"},
		{"[::1]:9000", 2, "[::1]:9002"},
		{"127.0.0.1:0", 5, "127.0.0.1:0"}, // every rank picks a free port
		{"localhost:65534", 1, "localhost:65535"},
	} {
		got, err := RankAddr(c.addr, c.local)
		require.NoError(t, err, c.addr)
		assert.Equal(t, c.want, got, "RankAddr(%q, %d)", c.addr, c.local)
	}
	for _, c := range []struct {
		addr  string
		local int
		msg   string
	}{
		{"9464", 0, `"9464": want host:port`},
		{"host:http", 0, `port "http" is not a number`},
		{"host:70000", 0, `port "70000" is not a number in [0, 65535]`},
		{"host:65535", 1, "port 65535 + local rank 1 is past 65535"},
		{"host:9464", -1, "negative local rank"},
	} {
		_, err := RankAddr(c.addr, c.local)
		require.Error(t, err, c.addr)
		assert.Contains(t, err.Error(), c.msg)
	}
}

// Two ranks of one host given the same address serve on distinct ports.
func TestRankAddrTwoRanksServe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	base := ln.Addr().String()
	require.NoError(t, ln.Close())
	var srvs []*Server
	for local := range 2 {
		addr, err := RankAddr(base, local)
		require.NoError(t, err)
		s, err := New(local, 2, nil).Serve(addr)
		if err != nil && local == 1 {
			t.Skipf("the port after %s is taken: %v", base, err)
		}
		require.NoError(t, err)
		srvs = append(srvs, s)
	}
	for _, s := range srvs {
		require.NoError(t, s.Close())
	}
	assert.NotEqual(t, srvs[0].Addr().String(), srvs[1].Addr().String())
}
