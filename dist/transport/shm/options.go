//go:build linux

package shm

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/shm/internal/ring"
	"github.com/gdist/gdist/internal/errs"
	"github.com/gdist/gdist/internal/logx"
	"github.com/gdist/gdist/internal/options"
)

// Defaults for the options.
const (
	DefaultRingSize          = 8 << 20  // bytes per direction of each pair
	DefaultMaxFrame          = 64 << 20 // bytes
	DefaultQueueLimit        = 64 << 20 // bytes per source
	DefaultHeartbeatInterval = 500 * time.Millisecond
	// DefaultHeartbeatTimeout is transport.DefaultHeartbeatTimeout, the
	// same on every transport (its doc says why).
	DefaultHeartbeatTimeout = transport.DefaultHeartbeatTimeout
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultSpin             = 50 * time.Microsecond
	DefaultSingleCopy       = 0 // off: see WithSingleCopy
)

// Errors of package shm. Failures caused by a peer are reported as
// *transport.PeerError wrapping transport.ErrPeerLost (or ErrPeerClosed)
// and, where it applies, one of these.
var (
	// ErrInvalidArgument is matched by the errors the constructors return
	// for invalid arguments or options. It is the value every gdist package
	// exports under this name (errs.ErrInvalidArgument).
	ErrInvalidArgument = errs.ErrInvalidArgument
	// ErrAuth means a peer failed to prove the job token or runs as another user.
	ErrAuth = errors.New("shm: authentication failed")
	// ErrProtocol means a peer sent something the protocol does not allow,
	// or wrote something invalid into the shared memory.
	ErrProtocol = errors.New("shm: protocol error")
	// ErrHeartbeatTimeout means a peer's heartbeat counter stopped moving
	// for the heartbeat timeout. It matches transport.ErrPeerUnresponsive
	// (and so transport.ErrPeerLost) itself.
	ErrHeartbeatTimeout = errs.Narrow("shm: heartbeat timeout", transport.ErrPeerUnresponsive)
	// ErrNoLink is returned for a peer this transport has no link to (New
	// was given no connection for it).
	ErrNoLink = errors.New("shm: no shared-memory link to this rank")
)

// Option configures New and Rendezvous. Options are applied in order and
// validated by the constructor, which returns an error matching ErrInvalidArgument
// for an invalid one.
type Option func(*config) error

type config struct {
	token      []byte
	insecure   bool
	ringSize   int
	maxFrame   int
	queueLimit int
	hbInterval time.Duration
	hbTimeout  time.Duration
	hsTimeout  time.Duration
	spin       time.Duration
	remoteMin  int
	logger     *slog.Logger
	quietLoss  bool
}

func defaultConfig() config {
	return config{
		ringSize:   DefaultRingSize,
		maxFrame:   DefaultMaxFrame,
		queueLimit: DefaultQueueLimit,
		hbInterval: DefaultHeartbeatInterval,
		hbTimeout:  DefaultHeartbeatTimeout,
		hsTimeout:  DefaultHandshakeTimeout,
		spin:       DefaultSpin,
		remoteMin:  DefaultSingleCopy,
	}
}

// apply applies opts to a default configuration.
func apply(opts []Option) (config, error) {
	cfg := defaultConfig()
	err := options.Apply(&cfg, opts, "shm", ErrInvalidArgument)
	return cfg, err
}

// WithToken sets the job token every rank proves it knows in the handshake
// (HMAC-SHA256 challenge-response, as package tcp does). It is required
// when the world has more than one rank, unless WithInsecure is given. The
// token is copied; an empty token is invalid.
func WithToken(token []byte) Option {
	return func(c *config) error {
		if len(token) == 0 {
			return fmt.Errorf("shm: %w: empty token", ErrInvalidArgument)
		}
		c.token = append([]byte(nil), token...)
		return nil
	}
}

// WithInsecure allows a job without a token: ranks and world size are still
// checked, and so is the peer's user id, but any process of that user that
// can reach the socket can join.
func WithInsecure() Option {
	return func(c *config) error { c.insecure = true; return nil }
}

// WithRingSize sets the data capacity, in bytes, of each direction's ring
// of the links this rank creates (the lower rank of a pair creates the
// memory, so its setting governs the pair). n must be a power of two
// between 4 KiB and 1 GiB; the default is 8 MiB. Messages of any size
// stream through a ring of any size.
func WithRingSize(n int) Option {
	return func(c *config) error {
		if err := ring.CheckSize(n); err != nil {
			return fmt.Errorf("shm: %w: %w", ErrInvalidArgument, err)
		}
		c.ringSize = n
		return nil
	}
}

// WithMaxFrame sets the largest message, in bytes, this rank accepts
// (default 64 MiB, at most 1 TiB - 1). A peer announcing a longer record
// is treated as lost; Send refuses a message longer than the receiver's maximum with an error
// matching transport.ErrFrameTooLarge.
func WithMaxFrame(n int) Option {
	return func(c *config) error {
		if n <= 0 || uint64(n) > ring.MaxLen {
			return fmt.Errorf("shm: %w: max frame %d (1 to %d)", ErrInvalidArgument, n, uint64(ring.MaxLen))
		}
		c.maxFrame = n
		return nil
	}
}

// WithQueueLimit bounds the bytes this rank queues from each peer before
// that peer's sends wait (default 64 MiB); n == 0 means unbounded, n < 0 is
// invalid. A single message larger than the bound still passes when
// nothing is queued.
func WithQueueLimit(n int) Option {
	return func(c *config) error {
		if n < 0 {
			return fmt.Errorf("shm: %w: queue limit %d", ErrInvalidArgument, n)
		}
		c.queueLimit = n
		return nil
	}
}

// WithHeartbeat sets how often this rank advances its heartbeat counters
// in shared memory (default 500 ms) and after how long without a peer's
// counter moving that peer is considered unresponsive (default 10 s,
// transport.DefaultHeartbeatTimeout; a
// peer that dies is noticed at once, through its socket). timeout must
// exceed interval; interval <= 0 disables both.
func WithHeartbeat(interval, timeout time.Duration) Option {
	return func(c *config) error {
		if interval > 0 && timeout <= interval {
			return fmt.Errorf("shm: %w: heartbeat timeout %v must exceed interval %v", ErrInvalidArgument, timeout, interval)
		}
		c.hbInterval, c.hbTimeout = interval, timeout
		return nil
	}
}

// WithHandshakeTimeout bounds how long a connection may take to
// authenticate and set up its memory (default 10 s). d must be positive.
func WithHandshakeTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("shm: %w: handshake timeout %v", ErrInvalidArgument, d)
		}
		c.hsTimeout = d
		return nil
	}
}

// WithSpin sets how long a waiting reader or sender polls the shared
// memory before it parks on the futex, and how long a receive polls the
// ring itself (since it last delivered something) before it waits for the
// reader (default 50 µs). Longer spins lower latency under bursts and cost
// CPU while idle; 0 parks at once. The reader waiting for a peer's next
// message polls longer, up to 4 ms, while its waits keep ending within a
// few milliseconds of parking (a pipeline stage waiting for each
// micro-batch): about twice the length of its recent waits. A wait that
// outlasts 4 ms halves that, and once parked a wait polls no longer than
// the spin again, so an idle rank polls for at most 4 ms before it sleeps.
func WithSpin(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 || d > time.Second {
			return fmt.Errorf("shm: %w: spin %v not in [0, 1s]", ErrInvalidArgument, d)
		}
		c.spin = d
		return nil
	}
}

// WithSingleCopy sets the size from which a message is not streamed
// through the ring but read by the receiver straight from the sender's
// buffer with process_vm_readv(2): one copy instead of two, while Send
// waits until the receiver is done. It is used only on links whose
// receiver could read a probe word of the sender's memory (the kernel
// allows it between processes of one user unless ptrace is restricted);
// 0 (the default) disables it, for messages to and from this rank. It is
// off by default because it did not pay where it was measured: on this
// project's 2-vCPU VM process_vm_readv moved 16 MiB messages at 4.0-4.6
// GB/s against 7.3-8.9 GB/s streamed through the default ring (paired
// runs of examples/transport_bench). Try it (e.g. 8 MiB) where that
// system call is fast.
func WithSingleCopy(min int) Option {
	return func(c *config) error {
		if min < 0 {
			return fmt.Errorf("shm: %w: single-copy size %d", ErrInvalidArgument, min)
		}
		c.remoteMin = min
		return nil
	}
}

// WithLogger sets where refused connections and lost peers are logged
// (default: the program's slog.Default() if it set one, else stderr in the
// format GDIST_LOG_FORMAT selects, text or json).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error { c.logger = l; return nil }
}

// WithQuietLoss logs a lost peer at debug level instead of as an error, for
// links whose loss the layer above reports itself (package dist/fed drops a
// client and logs it once).
func WithQuietLoss() Option {
	return func(c *config) error { c.quietLoss = true; return nil }
}

func (c *config) validate(rank, world int) error {
	switch {
	case world < 1 || int64(world) > 1<<20:
		return fmt.Errorf("shm: %w: world size %d", ErrInvalidArgument, world)
	case rank < 0 || rank >= world:
		return fmt.Errorf("shm: %w: rank %d not in [0, %d)", ErrInvalidArgument, rank, world)
	case world > 1 && len(c.token) == 0 && !c.insecure:
		return fmt.Errorf("shm: %w: a token is required (WithToken) unless WithInsecure is given", ErrInvalidArgument)
	}
	if c.logger == nil {
		c.logger = logx.Default()
	}
	return nil
}
