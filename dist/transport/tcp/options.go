package tcp

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/gdist/gdist/dist/transport/tcp/internal/wire"
)

// Defaults for the options.
const (
	DefaultMaxFrame          = 64 << 20 // bytes
	DefaultQueueLimit        = 64 << 20 // bytes per source
	DefaultHeartbeatInterval = time.Second
	DefaultHeartbeatTimeout  = 30 * time.Second
	DefaultHandshakeTimeout  = 10 * time.Second
	DefaultListenAddr        = "127.0.0.1:0"
)

// Errors of package tcp. Failures caused by a peer are reported as
// *transport.PeerError wrapping transport.ErrPeerLost (or ErrPeerClosed) and,
// where it applies, one of these.
var (
	// ErrConfig is returned by New and Rendezvous for invalid arguments or options.
	ErrConfig = errors.New("tcp: invalid configuration")
	// ErrAuth means a peer failed to prove the job token.
	ErrAuth = errors.New("tcp: authentication failed")
	// ErrProtocol means a peer sent something the protocol does not allow.
	ErrProtocol = errors.New("tcp: protocol error")
	// ErrHeartbeatTimeout means nothing was received from a peer for the
	// heartbeat timeout.
	ErrHeartbeatTimeout = errors.New("tcp: heartbeat timeout")
)

// RejectedError is returned by New and Rendezvous when the peer they dialed
// refused the connection (wrong token, wrong world size, rank taken, ...).
type RejectedError struct {
	Rank   int               // the rank that refused
	Reason wire.RejectReason // why
}

func (e *RejectedError) Error() string {
	return fmt.Sprintf("tcp: rank %d refused the connection: %v", e.Rank, e.Reason)
}

// Is makes a rejection for a bad token match ErrAuth.
func (e *RejectedError) Is(target error) bool {
	return target == ErrAuth && e.Reason == wire.RejectAuth
}

// Option configures New and Rendezvous. Options are applied in order and
// validated by the constructor, which returns an error matching ErrConfig
// for an invalid one.
type Option func(*config) error

type config struct {
	token        []byte
	insecure     bool
	listenAddr   string
	listenSet    bool // WithListenAddr was given
	maxFrame     int
	queueLimit   int
	hbInterval   time.Duration
	hbTimeout    time.Duration
	hsTimeout    time.Duration
	logger       *slog.Logger
	sockBuf      int
	maxPendingHS int
}

func defaultConfig() config {
	return config{
		listenAddr:   DefaultListenAddr,
		maxFrame:     DefaultMaxFrame,
		queueLimit:   DefaultQueueLimit,
		hbInterval:   DefaultHeartbeatInterval,
		hbTimeout:    DefaultHeartbeatTimeout,
		hsTimeout:    DefaultHandshakeTimeout,
		maxPendingHS: 64,
	}
}

// apply applies opts to a default configuration.
func apply(opts []Option) (config, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			return cfg, fmt.Errorf("%w: nil option", ErrConfig)
		}
		if err := o(&cfg); err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}

// WithToken sets the job token every rank proves it knows in the handshake
// (HMAC-SHA256 challenge-response). It is required when the world has more
// than one rank, unless WithInsecure is given. The token is copied; an
// empty token is invalid.
func WithToken(token []byte) Option {
	return func(c *config) error {
		if len(token) == 0 {
			return fmt.Errorf("%w: empty token", ErrConfig)
		}
		c.token = append([]byte(nil), token...)
		return nil
	}
}

// WithInsecure allows a job without a token: the handshake still checks
// ranks and world size but anyone who can connect can join. Use it only on
// a trusted network.
func WithInsecure() Option {
	return func(c *config) error { c.insecure = true; return nil }
}

// WithListenAddr sets the address a non-zero rank listens on in Rendezvous
// (default "127.0.0.1:0": loopback, any port). Name an interface address,
// or "0.0.0.0:port" to listen on all of them, for a multi-host job. New
// takes its listener from the caller and refuses this option.
func WithListenAddr(addr string) Option {
	return func(c *config) error {
		if addr == "" {
			return fmt.Errorf("%w: empty listen address", ErrConfig)
		}
		c.listenAddr, c.listenSet = addr, true
		return nil
	}
}

// WithMaxFrame sets the largest message, in bytes, this rank accepts
// (default 64 MiB, at most 1 TiB). A peer announcing a larger frame is
// treated as lost; Send refuses a message larger than the receiver's maximum
// with an error matching transport.ErrFrameTooLarge.
func WithMaxFrame(n int) Option {
	return func(c *config) error {
		if n <= 0 || uint64(n) > wire.MaxPayload {
			return fmt.Errorf("%w: max frame %d not in [1, %d]", ErrConfig, n, uint64(wire.MaxPayload))
		}
		c.maxFrame = n
		return nil
	}
}

// WithQueueLimit bounds the bytes this rank queues from each peer before that
// peer's sends wait (default 64 MiB); n == 0 means unbounded, n < 0 is
// invalid. A single message larger than the bound still passes when nothing
// is queued.
func WithQueueLimit(n int) Option {
	return func(c *config) error {
		if n < 0 {
			return fmt.Errorf("%w: queue limit %d", ErrConfig, n)
		}
		c.queueLimit = n
		return nil
	}
}

// WithHeartbeat sets how often an idle link sends a heartbeat (default 1 s)
// and after how long without receiving anything a peer is considered lost
// (default 30 s). timeout must exceed interval. interval <= 0 disables both.
func WithHeartbeat(interval, timeout time.Duration) Option {
	return func(c *config) error {
		if interval > 0 && timeout <= interval {
			return fmt.Errorf("%w: heartbeat timeout %v must exceed interval %v", ErrConfig, timeout, interval)
		}
		c.hbInterval, c.hbTimeout = interval, timeout
		return nil
	}
}

// WithHandshakeTimeout bounds how long an incoming connection may take to
// authenticate (default 10 s). d must be positive.
func WithHandshakeTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: handshake timeout %v", ErrConfig, d)
		}
		c.hsTimeout = d
		return nil
	}
}

// WithLogger sets where refused connections and lost peers are logged
// (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error { c.logger = l; return nil }
}

// WithSocketBuffer sets the kernel send and receive buffer sizes of every
// connection, in bytes. The default (n <= 0) leaves the kernel's
// auto-tuning alone, which is usually best; sizes well below 64 KiB make
// loopback TCP stall (a kernel effect that raw sockets show too).
func WithSocketBuffer(n int) Option {
	return func(c *config) error { c.sockBuf = n; return nil }
}

func (c *config) validate(world int) error {
	switch {
	case c.maxFrame <= 0 || uint64(c.maxFrame) > wire.MaxPayload:
		return fmt.Errorf("%w: max frame %d not in [1, %d]", ErrConfig, c.maxFrame, uint64(wire.MaxPayload))
	case c.hbInterval > 0 && c.hbTimeout <= c.hbInterval:
		return fmt.Errorf("%w: heartbeat timeout %v must exceed interval %v", ErrConfig, c.hbTimeout, c.hbInterval)
	case c.hsTimeout <= 0:
		return fmt.Errorf("%w: handshake timeout %v", ErrConfig, c.hsTimeout)
	case world > 1 && len(c.token) == 0 && !c.insecure:
		return fmt.Errorf("%w: a token is required (WithToken) unless WithInsecure is given", ErrConfig)
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	return nil
}
