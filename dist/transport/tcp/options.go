package tcp

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/tcp/internal/wire"
	"github.com/gdist/gdist/internal/errs"
	"github.com/gdist/gdist/internal/logx"
	"github.com/gdist/gdist/internal/options"
)

// Defaults for the options.
const (
	DefaultMaxFrame          = 64 << 20 // bytes
	DefaultQueueLimit        = 64 << 20 // bytes per source
	DefaultHeartbeatInterval = time.Second
	// DefaultHeartbeatTimeout is how long a peer may stay silent before it
	// is reported unresponsive: transport.DefaultHeartbeatTimeout, the same
	// on every transport (its doc says why). With the default interval a
	// frozen peer is named 10 to 10.25 s after the last frame it sent; a
	// healthy idle peer sends something at least every ~1.25 s.
	DefaultHeartbeatTimeout = transport.DefaultHeartbeatTimeout
	// DefaultHandshakeTimeout bounds how long an incoming connection may
	// hold one of the handshake slots before it has authenticated.
	DefaultHandshakeTimeout = 3 * time.Second
	// DefaultInitTimeout bounds New and Rendezvous: after it every waiting
	// rank fails with an *InitTimeoutError naming the ranks that never
	// joined.
	DefaultInitTimeout = 5 * time.Minute
	DefaultListenAddr  = "127.0.0.1:0"
	// MinTokenBytes is the shortest job token WithToken accepts: 128 bits.
	// A token written in hex counts its decoded bytes (see WithToken).
	MinTokenBytes = 16
	// defaultMaxPendingHS is how many incoming connections may be in the
	// handshake at once.
	defaultMaxPendingHS = 64
)

// Errors of package tcp. Failures caused by a peer are reported as
// *transport.PeerError wrapping transport.ErrPeerLost (or ErrPeerClosed) and,
// where it applies, one of these.
var (
	// ErrInvalidArgument is matched by the errors New and Rendezvous return
	// for invalid arguments or options. It is the value every gdist package
	// exports under this name (errs.ErrInvalidArgument).
	ErrInvalidArgument = errs.ErrInvalidArgument
	// ErrAuth means a peer failed to prove the job token.
	ErrAuth = errors.New("tcp: authentication failed")
	// ErrProtocol means a peer sent something the protocol does not allow.
	ErrProtocol = errors.New("tcp: protocol error")
	// ErrHeartbeatTimeout means nothing was received from a peer for the
	// heartbeat timeout. It matches transport.ErrPeerUnresponsive (and so
	// transport.ErrPeerLost) itself, so code that classifies failures
	// needs no import of this package.
	ErrHeartbeatTimeout = errs.Narrow("tcp: heartbeat timeout", transport.ErrPeerUnresponsive)
	// ErrInitTimeout is matched by the *InitTimeoutError of a setup that
	// did not complete within the init timeout (WithInitTimeout).
	ErrInitTimeout = errors.New("tcp: setup timed out")
)

// ErrSelfDial is matched by the *SelfDialError of a rank whose dial
// reached its own listener.
var ErrSelfDial = errors.New("tcp: dialed this process's own listener")

// SelfDialError is returned by New and Rendezvous when the address this
// rank dialed to reach rank To is its own listener's: typically
// MASTER_PORT (the rendezvous address) happened to be the ephemeral port
// the operating system gave this rank's listener. The rank gives up at
// once; rank 0 then fails at its init timeout naming this rank as one that
// never joined.
type SelfDialError struct {
	Rank, To int
	Addr     string
	Master   bool // Addr is the rendezvous address, rank 0's
}

func (e *SelfDialError) Error() string {
	if e.Master {
		return fmt.Sprintf("tcp: rank %d: MASTER_ADDR:MASTER_PORT (%s) is this process's own listener: pick a MASTER_PORT outside the ephemeral range (/proc/sys/net/ipv4/ip_local_port_range)",
			e.Rank, e.Addr)
	}
	return fmt.Sprintf("tcp: rank %d: rank %d's address %s is this process's own listener: give every rank a port outside the ephemeral range (/proc/sys/net/ipv4/ip_local_port_range)",
		e.Rank, e.To, e.Addr)
}

// Unwrap returns ErrSelfDial.
func (e *SelfDialError) Unwrap() error { return ErrSelfDial }

// RejectedError is returned by New and Rendezvous when the peer they dialed
// refused the connection (wrong token, wrong world size, rank taken, ...).
type RejectedError struct {
	Rank   int               // the rank that refused
	Reason wire.RejectReason // why
	// Detail qualifies some reasons: for a world size mismatch, the world
	// size of the refusing rank's job (0 if unknown).
	Detail uint64
}

func (e *RejectedError) Error() string {
	switch {
	case e.Reason == wire.RejectAuth:
		return fmt.Sprintf("tcp: rank %d refused the connection: %v: wrong GDIST_TOKEN? (every rank needs the same token)", e.Rank, e.Reason)
	case e.Reason == wire.RejectWorld && e.Detail != 0:
		return fmt.Sprintf("tcp: rank %d refused the connection: %v: its job has %d ranks", e.Rank, e.Reason, e.Detail)
	}
	return fmt.Sprintf("tcp: rank %d refused the connection: %v", e.Rank, e.Reason)
}

// Is makes a rejection for a bad token match ErrAuth.
func (e *RejectedError) Is(target error) bool {
	return target == ErrAuth && e.Reason == wire.RejectAuth
}

// Option configures New and Rendezvous. Options are applied in order and
// validated by the constructor, which returns an error matching ErrInvalidArgument
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
	initTimeout  time.Duration
	logger       *slog.Logger
	sockBuf      int
	maxPendingHS int
	hbObserver   func(peer int, rtt time.Duration)
	tls          *tls.Config // WithTLS; nil: plain TCP
}

func defaultConfig() config {
	return config{
		listenAddr:   DefaultListenAddr,
		maxFrame:     DefaultMaxFrame,
		queueLimit:   DefaultQueueLimit,
		hbInterval:   DefaultHeartbeatInterval,
		hbTimeout:    DefaultHeartbeatTimeout,
		hsTimeout:    DefaultHandshakeTimeout,
		initTimeout:  DefaultInitTimeout,
		maxPendingHS: defaultMaxPendingHS,
	}
}

// apply applies opts to a default configuration.
// apply applies opts to a default configuration.
func apply(opts []Option) (config, error) {
	cfg := defaultConfig()
	err := options.Apply(&cfg, opts, "tcp", ErrInvalidArgument)
	return cfg, err
}

// WithToken sets the job token every rank proves it knows in the handshake
// (HMAC-SHA256 challenge-response). It is required when the world has more
// than one rank, unless WithInsecure is given. The token is copied.
//
// A token shorter than 128 bits is refused: a shorter one could be guessed
// online by anyone who can connect. Its strength is counted in the bytes it
// stands for: a token made only of hex digits (such as `openssl rand -hex
// 32` prints) counts two digits a byte, so it needs at least 32 of them;
// any other token needs at least 16 bytes. The
// bytes are used as given, hex or not (the HMAC key is the token itself).
// gdistrun's generated tokens are 64 hex digits (256 bits).
func WithToken(token []byte) Option {
	return func(c *config) error {
		if err := CheckToken(token); err != nil {
			return err
		}
		c.token = append([]byte(nil), token...)
		return nil
	}
}

// CheckToken returns an error matching ErrInvalidArgument if WithToken would refuse
// token (see there), and nil otherwise.
func CheckToken(token []byte) error {
	if n := tokenStrength(token); n < MinTokenBytes {
		return fmt.Errorf("tcp: %w: job token too short: %s; it must hold at least %d random bytes (128 bits), e.g. GDIST_TOKEN=$(openssl rand -hex 32)",
			ErrInvalidArgument, describeToken(token), MinTokenBytes)
	}
	return nil
}

// tokenStrength is the number of bytes a token stands for: half its
// length (rounded down) if it is all hex digits, else its length.
func tokenStrength(token []byte) int {
	if isHex(token) {
		return len(token) / 2
	}
	return len(token)
}

func isHex(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

func describeToken(token []byte) string {
	switch {
	case len(token) == 0:
		return "empty"
	case isHex(token):
		return fmt.Sprintf("%d hex digits (%d bytes)", len(token), len(token)/2)
	}
	return fmt.Sprintf("%d bytes", len(token))
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
			return fmt.Errorf("tcp: %w: empty listen address", ErrInvalidArgument)
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
			return fmt.Errorf("tcp: %w: max frame %d not in [1, %d]", ErrInvalidArgument, n, uint64(wire.MaxPayload))
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
			return fmt.Errorf("tcp: %w: queue limit %d", ErrInvalidArgument, n)
		}
		c.queueLimit = n
		return nil
	}
}

// WithHeartbeat sets how often a link sends a heartbeat (default 1 s) and
// after how long without receiving anything from a peer it is reported
// unresponsive (default 10 s, transport.DefaultHeartbeatTimeout): calls
// involving it fail with a
// *transport.PeerError matching transport.ErrPeerUnresponsive and
// ErrHeartbeatTimeout. Liveness is checked four times per interval, so a
// peer that stops is named between timeout and timeout + interval/4 after
// the last bytes it sent. timeout must be at least twice the interval.
// interval 0 derives it from timeout: min(timeout/8, 1 s). interval < 0
// disables heartbeats (and the timeout).
func WithHeartbeat(interval, timeout time.Duration) Option {
	if interval == 0 { // computed once: the Option may be shared and applied concurrently
		interval = DeriveHeartbeatInterval(timeout)
	}
	return func(c *config) error {
		if interval > 0 && timeout < 2*interval {
			return fmt.Errorf("tcp: %w: heartbeat timeout %v must be at least twice the interval %v", ErrInvalidArgument, timeout, interval)
		}
		c.hbInterval, c.hbTimeout = interval, timeout
		return nil
	}
}

// DeriveHeartbeatInterval is the heartbeat interval WithHeartbeat uses for
// timeout when none is given: min(timeout/8, 1 s), at least 1 ms.
func DeriveHeartbeatInterval(timeout time.Duration) time.Duration {
	return max(min(timeout/8, DefaultHeartbeatInterval), time.Millisecond)
}

// WithHeartbeatObserver has f called with the round-trip time of each
// answered heartbeat: every heartbeat carries a stamp the peer echoes. f
// runs on the link's reader goroutine and must return quickly; it may be
// called for several peers at once. Heartbeats go out every interval on
// every link, busy or idle, so f sees about one sample per interval per
// peer. nil removes the observer.
func WithHeartbeatObserver(f func(peer int, rtt time.Duration)) Option {
	return func(c *config) error { c.hbObserver = f; return nil }
}

// WithInitTimeout bounds New and Rendezvous (default 5 minutes): a setup
// that is not complete by then fails with an *InitTimeoutError naming the
// ranks that never joined and the connections this rank refused meanwhile.
// The caller's context still ends the setup earlier if it ends first. d
// must be positive.
func WithInitTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("tcp: %w: init timeout %v", ErrInvalidArgument, d)
		}
		c.initTimeout = d
		return nil
	}
}

// WithHandshakeTimeout bounds how long an incoming connection may take to
// authenticate, and so how long one connection that does not may hold one
// of the handshake slots (default 3 s). d must be positive.
func WithHandshakeTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("tcp: %w: handshake timeout %v", ErrInvalidArgument, d)
		}
		c.hsTimeout = d
		return nil
	}
}

// WithLogger sets where refused connections and lost peers are logged
// (default: the program's slog.Default() if it set one, else stderr in the
// format GDIST_LOG_FORMAT selects, text or json).
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
		return fmt.Errorf("tcp: %w: max frame %d not in [1, %d]", ErrInvalidArgument, c.maxFrame, uint64(wire.MaxPayload))
	case c.hbInterval > 0 && c.hbTimeout < 2*c.hbInterval:
		return fmt.Errorf("tcp: %w: heartbeat timeout %v must be at least twice the interval %v", ErrInvalidArgument, c.hbTimeout, c.hbInterval)
	case c.hsTimeout <= 0:
		return fmt.Errorf("tcp: %w: handshake timeout %v", ErrInvalidArgument, c.hsTimeout)
	case world > 1 && len(c.token) == 0 && !c.insecure:
		return fmt.Errorf("tcp: %w: a token is required (WithToken) unless WithInsecure is given", ErrInvalidArgument)
	}
	if c.logger == nil {
		c.logger = logx.Default()
	}
	return nil
}
