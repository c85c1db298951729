package tcp

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/transporttest"
	"github.com/gdist/gdist/internal/certs"
)

// testTLS returns a configuration for loopback ranks signed by a fresh CA,
// and that CA.
func testTLS(t testing.TB) (*tls.Config, *certs.CA) {
	t.Helper()
	ca, err := certs.NewCA("tcp test CA")
	require.NoError(t, err)
	leaf, err := ca.Issue("rank", "127.0.0.1")
	require.NoError(t, err)
	return leaf.Config(), ca
}

func TestTLSConformance(t *testing.T) {
	cfg, _ := testTLS(t)
	transporttest.Run(t, func(t *testing.T, n int) []transport.Transport {
		return asTransports(mesh(t, n, WithTLS(cfg)))
	}, transporttest.WithLimited(func(t *testing.T, n, limit int) []transport.Transport {
		return asTransports(mesh(t, n, WithTLS(cfg), WithQueueLimit(limit)))
	}))
}

// TestTLSRendezvous: a rendezvous and a closing goodbye over TLS; the
// links really are TLS 1.3.
func TestTLSRendezvous(t *testing.T) {
	cfg, _ := testTLS(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	master := ln.Addr().String()
	ln.Close()
	const n = 3
	ts := make([]*Transport, n)
	errs := make([]error, n)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			ts[r], errs[r] = Rendezvous(ctx, r, n, master, WithToken(testToken), WithLogger(quiet()), WithTLS(cfg))
		})
	}
	wg.Wait()
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	for _, tr := range ts {
		for q := range n {
			if p := tr.peers[q].Load(); p != nil {
				ts, ok := p.conn.(tlsStream)
				require.True(t, ok, "rank %d's link to %d is TLS", tr.rank, q)
				assert.Equal(t, uint16(tls.VersionTLS13), ts.ConnectionState().Version)
			}
		}
	}
	require.NoError(t, ts[2].Send(ctx, 0, 5, transport.Header{1}, []byte("over tls")))
	m, err := ts[0].Recv(ctx, 2, 5)
	require.NoError(t, err)
	assert.Equal(t, "over tls", string(m.Payload))
	for _, tr := range ts {
		require.NoError(t, tr.Close())
	}
}

// TestTLSRefusesUntrustedPeers: connections without a certificate, with
// one from another CA, or without TLS at all are refused with a log line
// naming the TLS failure, and the job then forms with the right rank 1.
// A rank whose certificate is refused fails at once with ErrTLS (it does
// not retry until the init timeout).
func TestTLSRefusesUntrustedPeers(t *testing.T) {
	cfg, _ := testTLS(t)
	var logs transporttest.LogBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	lns, addrs := listeners(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type result struct {
		t   *Transport
		err error
	}
	rank0 := make(chan result, 1)
	go func() {
		tr, err := New(ctx, 0, 2, lns[0], addrs, WithToken(testToken), WithLogger(log), WithTLS(cfg))
		rank0 <- result{tr, err}
	}()

	// No certificate: a TLS client that offers none.
	noCert := &tls.Config{RootCAs: cfg.RootCAs, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13}
	c, err := tls.Dial("tcp", addrs[0], noCert)
	if err == nil { // TLS 1.3: the refusal arrives with the first read
		_, err = c.Read(make([]byte, 1))
		c.Close()
	}
	require.Error(t, err)

	// A certificate from an impostor CA of the same name (a client sends
	// its certificate only to a server that names its issuer), through the
	// transport itself: rank 1 fails with ErrTLS, promptly.
	other, err := certs.NewCA("tcp test CA")
	require.NoError(t, err)
	stranger, err := other.Issue("stranger", "127.0.0.1")
	require.NoError(t, err)
	scfg := stranger.Config()
	scfg.RootCAs = cfg.RootCAs // it trusts rank 0; rank 0 does not trust it
	ln1, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	start := time.Now()
	_, err = New(ctx, 1, 2, ln1, addrs, WithToken(testToken), WithLogger(quiet()), WithTLS(scfg))
	require.ErrorIs(t, err, ErrTLS)
	assert.Less(t, time.Since(start), 5*time.Second, "refused, not retried until the init timeout")

	// Plain TCP speaking the job token's handshake: not TLS.
	plain, err := net.Dial("tcp", addrs[0])
	require.NoError(t, err)
	plain.Write(bytes.Repeat([]byte{0x47}, 64))
	plain.Read(make([]byte, 1))
	plain.Close()

	// The right rank 1 joins and the job goes on.
	tr1, err := New(ctx, 1, 2, lns[1], addrs, WithToken(testToken), WithLogger(quiet()), WithTLS(cfg))
	require.NoError(t, err)
	r0 := <-rank0
	require.NoError(t, r0.err)
	require.NoError(t, tr1.Send(ctx, 0, 1, transport.Header{}, []byte("hi")))
	m, err := r0.t.Recv(ctx, 1, 1)
	require.NoError(t, err)
	assert.Equal(t, "hi", string(m.Payload))

	for _, want := range []string{
		"tcp: refused connection",
		"TLS handshake failed: tls: client didn't provide a certificate",
		"TLS handshake failed: tls: failed to verify certificate",
		"TLS handshake failed: tls: first record does not look like a TLS handshake",
	} { // rank 0 logs on its serving goroutines, maybe after the dialer has its answer (and not once it closes)
		assert.Eventually(t, func() bool { return strings.Contains(logs.String(), want) }, 10*time.Second, 5*time.Millisecond,
			"rank 0 logs %q:\n%s", want, logs.String())
	}
	require.NoError(t, tr1.Close())
	require.NoError(t, r0.t.Close())
}

// TestTLSServerName: a dialing rank checks the certificate against the
// host it dials, or against the ServerName every certificate carries.
func TestTLSServerName(t *testing.T) {
	ca, err := certs.NewCA("tcp test CA")
	require.NoError(t, err)
	elsewhere, err := ca.Issue("rank", "10.9.9.9")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	lns, addrs := listeners(t, 2)
	go New(ctx, 0, 2, lns[0], addrs, WithToken(testToken), WithLogger(quiet()), WithTLS(elsewhere.Config()))
	_, err = New(ctx, 1, 2, lns[1], addrs, WithToken(testToken), WithLogger(quiet()), WithTLS(elsewhere.Config()))
	require.ErrorIs(t, err, ErrTLS)
	var verr *tls.CertificateVerificationError
	require.True(t, errors.As(err, &verr), "%v", err)

	named, err := ca.Issue("rank", "gdist-job")
	require.NoError(t, err)
	cfg := named.Config()
	cfg.ServerName = "gdist-job"
	ts := mesh(t, 3, WithTLS(cfg))
	for _, tr := range ts {
		require.NoError(t, tr.Close())
	}
}

func TestTLSOptionRefusals(t *testing.T) {
	good, _ := testTLS(t)
	for name, cfg := range map[string]*tls.Config{
		"nil":            nil,
		"skip verify":    {Certificates: good.Certificates, RootCAs: good.RootCAs, InsecureSkipVerify: true},
		"no certificate": {RootCAs: good.RootCAs},
		"no CA":          {Certificates: good.Certificates},
		"TLS 1.2":        {Certificates: good.Certificates, RootCAs: good.RootCAs, MaxVersion: tls.VersionTLS12},
	} {
		_, err := apply([]Option{WithTLS(cfg)})
		assert.ErrorIs(t, err, ErrInvalidArgument, name)
	}
	_, err := apply([]Option{WithTLS(good)})
	assert.NoError(t, err)
}

func TestLoadTLS(t *testing.T) {
	ca, err := certs.NewCA("tcp test CA")
	require.NoError(t, err)
	leaf, err := ca.Issue("rank", "127.0.0.1")
	require.NoError(t, err)
	f, err := leaf.Write(t.TempDir())
	require.NoError(t, err)
	cfg, err := LoadTLS(f.Cert, f.Key, f.CA, "")
	require.NoError(t, err)
	ts := mesh(t, 2, WithTLS(cfg))
	for _, tr := range ts {
		require.NoError(t, tr.Close())
	}
	_, err = LoadTLS(f.Cert, f.Key, f.Cert+".missing", "")
	assert.ErrorContains(t, err, f.Cert+".missing")
	_, err = LoadTLS(f.Key, f.Key, f.CA, "")
	assert.ErrorContains(t, err, f.Key)
}
