// Package metrics exposes what a rank does as Prometheus metrics: bytes
// exchanged with each peer, collective counts, bytes and latency histograms,
// DDP communication and exposed (waited-for) communication per step,
// heartbeat round trips, and the launcher's restart count. It uses the
// Prometheus client library with a registry of its own (nothing is
// registered globally) and serves it over HTTP in the text exposition
// format.
//
// A nil *Metrics is valid and records nothing: instrumented code pays one
// nil check when metrics are off. When on, every series an operation can
// touch is created up front, so recording allocates nothing.
//
// # Usage
//
//	m := metrics.New(rank, world, []string{"all_reduce", "broadcast"})
//	srv, err := m.Serve("127.0.0.1:9400") // GET /metrics
//	defer srv.Close()
//	m.Collective("all_reduce", 4096, elapsed)
package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics holds one rank's series. It is safe for concurrent use.
type Metrics struct {
	reg   *prometheus.Registry
	colls map[string]collSeries

	sent, recvd []prometheus.Counter // by peer rank
	hbRTT       []prometheus.Observer

	ddpComm, ddpExposed prometheus.Observer
	ddpSteps            prometheus.Counter
	restarts            prometheus.Gauge
}

type collSeries struct {
	count   prometheus.Counter
	bytes   prometheus.Counter
	seconds prometheus.Observer
}

// latencyBuckets span 5 µs to about 10 s.
var latencyBuckets = prometheus.ExponentialBuckets(5e-6, 2.5, 17)

// New returns the metrics of rank in a world of world ranks, with series for
// the collectives named in ops.
func New(rank, world int, ops []string) *Metrics {
	reg := prometheus.NewRegistry()
	constLabels := prometheus.Labels{"rank": strconv.Itoa(rank)}
	f := func(c prometheus.Collector) { reg.MustRegister(c) }
	f(collectors.NewGoCollector())
	f(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	count := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "gdist", Name: "collectives_total",
		Help: "Collectives completed (successfully or not), by operation.", ConstLabels: constLabels}, []string{"op"})
	bytes := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "gdist", Name: "collective_bytes_total",
		Help: "Bytes of the caller's buffers passed to collectives, by operation.", ConstLabels: constLabels}, []string{"op"})
	secs := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "gdist", Name: "collective_seconds",
		Help: "Collective latency, from its turn to run until it finished, by operation.", ConstLabels: constLabels,
		Buckets: latencyBuckets}, []string{"op"})
	sent := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "gdist", Name: "peer_sent_bytes_total",
		Help: "Payload bytes sent to each peer.", ConstLabels: constLabels}, []string{"peer"})
	recvd := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "gdist", Name: "peer_received_bytes_total",
		Help: "Payload bytes received from each peer.", ConstLabels: constLabels}, []string{"peer"})
	rtt := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "gdist", Name: "heartbeat_rtt_seconds",
		Help: "Heartbeat round trips to each peer.", ConstLabels: constLabels, Buckets: latencyBuckets}, []string{"peer"})
	ddpComm := prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "gdist", Name: "ddp_comm_seconds",
		Help:        "DDP gradient all-reduce time per step, from the first bucket's launch to the last one's end.",
		ConstLabels: constLabels, Buckets: latencyBuckets})
	ddpExposed := prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "gdist", Name: "ddp_exposed_seconds",
		Help:        "DDP communication per step not hidden behind backprop (time the step waited for buckets).",
		ConstLabels: constLabels, Buckets: latencyBuckets})
	ddpSteps := prometheus.NewCounter(prometheus.CounterOpts{Namespace: "gdist", Name: "ddp_steps_total",
		Help: "DDP optimiser steps.", ConstLabels: constLabels})
	restarts := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "gdist", Name: "restarts",
		Help: "How many times the launcher restarted the job before this run (GDIST_RESTART_COUNT).", ConstLabels: constLabels})
	worldG := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "gdist", Name: "world_size",
		Help: "Ranks in the job.", ConstLabels: constLabels})
	for _, c := range []prometheus.Collector{count, bytes, secs, sent, recvd, rtt, ddpComm, ddpExposed, ddpSteps, restarts, worldG} {
		f(c)
	}
	worldG.Set(float64(world))

	m := &Metrics{reg: reg, colls: make(map[string]collSeries, len(ops)),
		ddpComm: ddpComm, ddpExposed: ddpExposed, ddpSteps: ddpSteps, restarts: restarts}
	for _, op := range ops {
		m.colls[op] = collSeries{count.WithLabelValues(op), bytes.WithLabelValues(op), secs.WithLabelValues(op)}
	}
	for p := range world {
		l := strconv.Itoa(p)
		m.sent = append(m.sent, sent.WithLabelValues(l))
		m.recvd = append(m.recvd, recvd.WithLabelValues(l))
		m.hbRTT = append(m.hbRTT, rtt.WithLabelValues(l))
	}
	return m
}

// Enabled reports whether m records (is not nil).
func (m *Metrics) Enabled() bool { return m != nil }

// Collective records one collective of op (one of the ops given to New;
// others are ignored) over n bytes that took d.
func (m *Metrics) Collective(op string, n int, d time.Duration) {
	if m == nil {
		return
	}
	s, ok := m.colls[op]
	if !ok {
		return
	}
	s.count.Inc()
	s.bytes.Add(float64(n))
	s.seconds.Observe(d.Seconds())
}

// Sent records n payload bytes sent to peer.
func (m *Metrics) Sent(peer, n int) {
	if m == nil || peer < 0 || peer >= len(m.sent) {
		return
	}
	m.sent[peer].Add(float64(n))
}

// Received records n payload bytes received from peer.
func (m *Metrics) Received(peer, n int) {
	if m == nil || peer < 0 || peer >= len(m.recvd) {
		return
	}
	m.recvd[peer].Add(float64(n))
}

// HeartbeatRTT records one heartbeat round trip to peer.
func (m *Metrics) HeartbeatRTT(peer int, d time.Duration) {
	if m == nil || peer < 0 || peer >= len(m.hbRTT) {
		return
	}
	m.hbRTT[peer].Observe(d.Seconds())
}

// DDPStep records one DDP step's communication and exposed communication.
func (m *Metrics) DDPStep(comm, exposed time.Duration) {
	if m == nil {
		return
	}
	m.ddpSteps.Inc()
	m.ddpComm.Observe(comm.Seconds())
	m.ddpExposed.Observe(exposed.Seconds())
}

// SetRestarts records the launcher's restart count.
func (m *Metrics) SetRestarts(n int) {
	if m == nil {
		return
	}
	m.restarts.Set(float64(n))
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// RankAddr returns the address the rank with local rank localRank (its
// index among the ranks on its host, LOCAL_RANK) serves its metrics on,
// given the host:port of GDIST_METRICS_ADDR: the port plus the local rank,
// so that the ranks of one host get distinct ports without the user
// computing them (127.0.0.1:9464 gives 9464 to local rank 0, 9465 to local
// rank 1, ...). Port 0 stays 0: every rank then picks a free port and logs
// the one it bound. The host is kept as given (empty: all interfaces). An
// address that is not host:port, a port that is not a number in [0, 65535],
// or a port plus local rank past 65535 is an error naming addr.
func RankAddr(addr string, localRank int) (string, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("metrics: address %q: want host:port (port 0: a free one): %w", addr, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", fmt.Errorf("metrics: address %q: port %q is not a number in [0, 65535]", addr, p)
	}
	if localRank < 0 {
		return "", fmt.Errorf("metrics: address %q: negative local rank %d", addr, localRank)
	}
	if port == 0 {
		return addr, nil
	}
	if port+localRank > 65535 {
		return "", fmt.Errorf("metrics: address %q: port %d + local rank %d is past 65535", addr, port, localRank)
	}
	return net.JoinHostPort(host, strconv.Itoa(port+localRank)), nil
}

// Server is a running metrics endpoint.
type Server struct {
	srv  *http.Server
	ln   net.Listener
	done chan struct{}
	err  error
	once sync.Once
}

// Serve listens on addr (host:port; port 0 picks one) and serves /metrics
// until Close.
func (m *Metrics) Serve(addr string) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	s := &Server{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, ln: ln, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.err = err
		}
	}()
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Close stops the server and waits for it. It is idempotent.
func (s *Server) Close() error {
	s.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := s.srv.Shutdown(ctx); err != nil {
			s.srv.Close()
		}
		<-s.done
	})
	return s.err
}
