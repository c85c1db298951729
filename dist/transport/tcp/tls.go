package tcp

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"
)

// ErrTLS is matched by the errors of a TLS handshake that failed for a
// reason retrying cannot fix: a certificate the other side does not trust
// (or none), a peer that does not speak TLS, no common protocol version.
var ErrTLS = errors.New("tcp: TLS handshake failed")

// stream is a link's byte stream: the TCP connection itself, or TLS over
// it. Both shut down their write side with CloseWrite.
type stream interface {
	net.Conn
	CloseWrite() error
}

// tlsStream is TLS over a TCP connection. CloseWrite sends TLS's
// close_notify and then shuts down the TCP write side as well, so the peer
// sees the end of the stream as it does without TLS.
type tlsStream struct {
	*tls.Conn
	raw *net.TCPConn
}

func (s tlsStream) CloseWrite() error {
	err := s.Conn.CloseWrite()
	if rerr := s.raw.CloseWrite(); err == nil {
		err = rerr
	}
	return err
}

// WithTLS runs every connection of the transport over TLS 1.3 (crypto/tls)
// with mutual authentication, under the job token's handshake, which still
// runs inside TLS: a peer must present a certificate the other side's CA
// pool accepts and prove the token. cfg gives this rank's certificate
// (Certificates or GetCertificate) and the pool of CAs it trusts for its
// peers' certificates (RootCAs; ClientCAs if set is used for the
// connections this rank accepts, else RootCAs). Every rank both dials and
// accepts, so its certificate must be valid for client and server
// authentication (extended key usages clientAuth and serverAuth, or none).
//
// A dialing rank checks the certificate of the rank it dials against the
// host it dials (an IP address or DNS name in the certificate's subject
// alternative names), unless cfg.ServerName names the one name every
// rank's certificate carries. The configuration is cloned; TLS versions
// below 1.3 are refused. cfg with InsecureSkipVerify, without a certificate
// or without a CA pool is refused with an error matching ErrInvalidArgument.
//
// A connection whose TLS handshake fails is refused and logged on the
// accepting rank ("TLS handshake failed: tls: client didn't provide a
// certificate"); the dialing side gets an error matching ErrTLS and stops
// retrying. LoadTLS builds cfg from PEM files. Shared-memory links (package
// shm) never leave the host and are not affected.
func WithTLS(cfg *tls.Config) Option {
	return func(c *config) error {
		if err := checkTLS(cfg); err != nil {
			return err
		}
		c.tls = cfg.Clone()
		return nil
	}
}

func checkTLS(cfg *tls.Config) error {
	switch {
	case cfg == nil:
		return fmt.Errorf("tcp: %w: WithTLS(nil)", ErrInvalidArgument)
	case cfg.InsecureSkipVerify:
		return fmt.Errorf("tcp: %w: WithTLS: InsecureSkipVerify defeats the peer authentication TLS is for; give the CA pool (RootCAs)", ErrInvalidArgument)
	case len(cfg.Certificates) == 0 && cfg.GetCertificate == nil:
		return fmt.Errorf("tcp: %w: WithTLS: no certificate (Certificates or GetCertificate): every rank proves itself to its peers", ErrInvalidArgument)
	case cfg.RootCAs == nil && cfg.ClientCAs == nil:
		return fmt.Errorf("tcp: %w: WithTLS: no CA pool (RootCAs) to check the peers' certificates against", ErrInvalidArgument)
	case cfg.MaxVersion != 0 && cfg.MaxVersion < tls.VersionTLS13:
		return fmt.Errorf("tcp: %w: WithTLS: MaxVersion %#x is below TLS 1.3", ErrInvalidArgument, cfg.MaxVersion)
	}
	return nil
}

// LoadTLS builds the configuration WithTLS takes from PEM files: this
// rank's certificate chain and private key, and the CA certificates it
// trusts for its peers (one file, one or more certificates). serverName, if
// not empty, is the name every rank's certificate carries and the dialing
// side checks instead of the host it dials (tls.Config.ServerName). Its
// errors name the file at fault.
func LoadTLS(certFile, keyFile, caFile, serverName string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("tcp: load TLS certificate %s and key %s: %w", certFile, keyFile, err)
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("tcp: load TLS CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("tcp: load TLS CA: no PEM certificate in %s", caFile)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool,
		ClientCAs:    pool,
		ServerName:   serverName,
		MinVersion:   tls.VersionTLS13,
	}, nil
}

// serverTLS is the configuration of the connections this rank accepts.
func serverTLS(cfg *tls.Config) *tls.Config {
	s := cfg.Clone()
	s.MinVersion = tls.VersionTLS13
	s.ClientAuth = tls.RequireAndVerifyClientCert
	if s.ClientCAs == nil {
		s.ClientCAs = s.RootCAs
	}
	return s
}

// clientTLS is the configuration of a connection this rank dials to addr.
func clientTLS(cfg *tls.Config, addr string) *tls.Config {
	c := cfg.Clone()
	c.MinVersion = tls.VersionTLS13
	if c.RootCAs == nil {
		c.RootCAs = c.ClientCAs
	}
	if c.ServerName == "" {
		if host, _, err := net.SplitHostPort(addr); err == nil {
			c.ServerName = host
		} else {
			c.ServerName = addr
		}
	}
	return c
}

// secure returns the stream a link runs over: conn itself without TLS,
// else TLS over conn once its handshake has completed (within the
// handshake timeout and ctx). addr is the address dialed, "" on the
// accepting side. A handshake that fails for a reason retrying cannot fix
// matches ErrTLS.
func (t *Transport) secure(ctx context.Context, conn *net.TCPConn, addr string, accepted bool) (stream, error) {
	if t.cfg.tls == nil {
		return conn, nil
	}
	var tc *tls.Conn
	if accepted {
		tc = tls.Server(conn, serverTLS(t.cfg.tls))
	} else {
		tc = tls.Client(conn, clientTLS(t.cfg.tls, addr))
	}
	hctx, cancel := context.WithTimeout(ctx, t.cfg.hsTimeout)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		if accepted && !timedOut(err) {
			// Whatever the accepting side refuses (no certificate, one
			// it does not trust, not TLS at all) ends this connection.
			return nil, &tlsError{err}
		}
		return nil, tlsHandshakeError(err)
	}
	return tlsStream{Conn: tc, raw: conn}, nil
}

// tlsError is a TLS handshake failure retrying cannot fix. It matches
// ErrTLS and the cause.
type tlsError struct{ err error }

func (e *tlsError) Error() string   { return "tcp: TLS handshake failed: " + e.err.Error() }
func (e *tlsError) Unwrap() []error { return []error{ErrTLS, e.err} }

func timedOut(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, context.DeadlineExceeded)
}

// tlsHandshakeError marks a handshake failure that retrying cannot fix
// (the other side refused us or we refused it, or it does not speak TLS)
// with ErrTLS; anything else (a timeout, a broken connection) is left for
// the caller to retry.
func tlsHandshakeError(err error) error {
	var (
		verify *tls.CertificateVerificationError
		record tls.RecordHeaderError
	)
	switch {
	case tlsAlert(err), errors.As(err, &verify), errors.As(err, &record):
		return &tlsError{err}
	}
	return fmt.Errorf("tls handshake: %w", err)
}

// tlsAlert reports whether err is a TLS alert from the peer. crypto/tls
// reports one as a *net.OpError whose Op is "remote error" around an
// unexported alert type (tls.AlertError is only used with QUIC).
func tlsAlert(err error) bool {
	var alert tls.AlertError
	var op *net.OpError
	return errors.As(err, &alert) || errors.As(err, &op) && op.Op == "remote error"
}

// tlsLinger bounds how long a refused TLS connection is drained.
const tlsLinger = 250 * time.Millisecond

// lingerClose closes a connection whose TLS handshake this side refused so
// that the peer reads the alert: TLS 1.3 lets the dialing side send its
// first bytes before it learns of the refusal, and closing a socket with
// unread bytes resets the connection, which can destroy the alert before
// the peer reads it (it would then retry instead of failing with ErrTLS).
// So: shut down the write side after the alert, read and drop what the
// peer still sends, briefly, then close.
func lingerClose(c *net.TCPConn) {
	c.CloseWrite()
	c.SetReadDeadline(time.Now().Add(tlsLinger))
	io.Copy(io.Discard, io.LimitReader(c, 1<<16))
	c.Close()
}
