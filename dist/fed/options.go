package fed

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/gdist/gdist/dist/transport/hybrid"
	"github.com/gdist/gdist/dist/transport/tcp"
	"github.com/gdist/gdist/internal/logx"
	"github.com/gdist/gdist/internal/options"
)

// Defaults of the options.
const (
	// DefaultRoundTimeout bounds a round: the leader averages what reached
	// it by then.
	DefaultRoundTimeout = 10 * time.Minute
	// DefaultJoinTimeout is how long Leader.Await waits for the job's
	// clients to join, and how long Join keeps dialing a leader that does
	// not listen yet.
	DefaultJoinTimeout = 5 * time.Minute
	// DefaultReconnectTimeout is how long a client keeps trying to reach the
	// leader again after its link broke, before it gives up on it.
	DefaultReconnectTimeout = time.Minute
	// DefaultBackoff and DefaultMaxBackoff shape the waits between a
	// client's attempts to reach the leader: exponential, from DefaultBackoff
	// doubling up to DefaultMaxBackoff, each drawn at random below that
	// bound ("full jitter"), so that clients cut off together do not all
	// come back at the same instant.
	DefaultBackoff    = 100 * time.Millisecond
	DefaultMaxBackoff = 5 * time.Second
)

// Option configures Lead and Join. Options are validated when applied; an
// invalid one, or one of the other side (WithFraction given to Join), makes
// Lead or Join fail with an error matching ErrInvalidArgument.
type Option func(*config) error

// role says which constructor an option belongs to.
type role uint8

const (
	roleLeader role = 1 << iota
	roleClient
)

type config struct {
	// links
	token      []byte
	insecure   bool
	tcpOpts    []tcp.Option
	hybridOpts []hybrid.Option
	logger     *slog.Logger

	// leader
	fraction     float64
	minFit       int
	minAvailable int
	seed         uint64
	roundTimeout time.Duration
	optimizer    ServerOptimizer
	secure       *SecureAggregation
	scaffold     bool

	// both
	joinTimeout time.Duration

	// client
	reconnect  time.Duration
	backoff    time.Duration
	maxBackoff time.Duration

	roleOf map[string]role // options given that belong to one side only
}

func defaultConfig() config {
	return config{
		fraction:     1,
		minFit:       1,
		minAvailable: 1,
		roundTimeout: DefaultRoundTimeout,
		joinTimeout:  DefaultJoinTimeout,
		reconnect:    DefaultReconnectTimeout,
		backoff:      DefaultBackoff,
		maxBackoff:   DefaultMaxBackoff,
	}
}

// apply applies opts for the side r and checks that each belongs to it.
func apply(opts []Option, r role) (config, error) {
	cfg := defaultConfig()
	if err := options.Apply(&cfg, opts, "fed", ErrInvalidArgument); err != nil {
		return cfg, err
	}
	for name, owner := range cfg.roleOf {
		if owner&r == 0 {
			side := "Lead"
			if owner == roleClient {
				side = "Join"
			}
			return cfg, fmt.Errorf("fed: %w: %s is an option of %s", ErrInvalidArgument, name, side)
		}
	}
	if cfg.minAvailable < cfg.minFit {
		cfg.minAvailable = cfg.minFit
	}
	if cfg.logger == nil {
		cfg.logger = logx.Default()
	}
	return cfg, nil
}

func (c *config) only(name string, r role) {
	if c.roleOf == nil {
		c.roleOf = map[string]role{}
	}
	c.roleOf[name] = r
}

// WithToken sets the job token the links authenticate with (package tcp's
// HMAC handshake, and package shm's for a link on one host), at least 128
// bits. Required unless WithInsecure is given.
func WithToken(token []byte) Option {
	return func(c *config) error {
		if err := tcp.CheckToken(token); err != nil {
			return err
		}
		c.token = append([]byte(nil), token...)
		return nil
	}
}

// WithInsecure allows links without a token, on a trusted network only.
func WithInsecure() Option {
	return func(c *config) error { c.insecure = true; return nil }
}

// WithTLS runs the links over TLS 1.3 with mutual authentication, under the
// token (see tcp.WithTLS, and tcp.LoadTLS for PEM files). The leader's
// certificate must be valid for the address the clients dial (or carry
// cfg.ServerName); a client without a certificate the leader's CA pool
// accepts is refused, and the leader logs it and goes on.
func WithTLS(cfg *tls.Config) Option {
	return func(c *config) error {
		c.tcpOpts = append(c.tcpOpts, tcp.WithTLS(cfg))
		return nil
	}
}

// WithTCP passes options to the TCP links (tcp.Listen on the leader,
// tcp.Dial on a client): heartbeat, maximum frame, socket buffers, ...
// WithListenAddr is refused: the leader listens on the address Lead is
// given.
func WithTCP(opts ...tcp.Option) Option {
	return func(c *config) error {
		if err := options.NoNil("fed: WithTCP", opts, ErrInvalidArgument); err != nil {
			return err
		}
		c.tcpOpts = append(c.tcpOpts, opts...)
		return nil
	}
}

// WithHybrid passes options to the hybrid transport each link is made
// into: whether a client on the leader's host talks to it through shared
// memory (hybrid.WithMode: Auto, the default, uses it where it sets up;
// TCP never), the host identity, the shared-memory options. WithTCP is
// refused here: pass TCP options with fed.WithTCP.
func WithHybrid(opts ...hybrid.Option) Option {
	return func(c *config) error {
		if err := options.NoNil("fed: WithHybrid", opts, ErrInvalidArgument); err != nil {
			return err
		}
		c.hybridOpts = append(c.hybridOpts, opts...)
		return nil
	}
}

// WithHeartbeat sets the links' heartbeat (TCP and shared memory alike):
// a side silent for timeout is lost, so a client that froze is dropped,
// and a client names a frozen leader, within about timeout. interval 0
// derives it (min(timeout/8, 1 s)). The default is the transports'
// (transport.DefaultHeartbeatTimeout, 10 s).
func WithHeartbeat(interval, timeout time.Duration) Option {
	if interval == 0 {
		interval = tcp.DeriveHeartbeatInterval(timeout)
	}
	return func(c *config) error {
		if interval <= 0 || timeout < 2*interval {
			return fmt.Errorf("fed: %w: heartbeat timeout %v must be at least twice the interval %v", ErrInvalidArgument, timeout, interval)
		}
		c.tcpOpts = append(c.tcpOpts, tcp.WithHeartbeat(interval, timeout))
		c.hybridOpts = append(c.hybridOpts, shmHeartbeat(interval, timeout)...)
		return nil
	}
}

// WithLogger sets where the federation logs: who joined, who left and why,
// refused connections. Default: the program's slog.Default() if it set one,
// else stderr in the format GDIST_LOG_FORMAT selects.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return fmt.Errorf("fed: %w: WithLogger(nil)", ErrInvalidArgument)
		}
		c.logger = l
		return nil
	}
}

// WithJoinTimeout bounds how long Leader.Await waits for every client of
// the job to join (after it, the federation starts with those that did, if
// they are enough for a round), and how long Join keeps dialing a leader
// that does not listen yet (default 5 minutes).
func WithJoinTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("fed: %w: join timeout %v", ErrInvalidArgument, d)
		}
		c.joinTimeout = d
		return nil
	}
}

// WithFraction sets the fraction of the members sampled each round (Flower's
// fraction_fit; default 1, every member): a round samples max(⌊f·n⌋,
// WithMinClients) of the n members, at random with WithSeed. 0 < f <= 1.
// (Lead.)
func WithFraction(f float64) Option {
	return func(c *config) error {
		if !(f > 0 && f <= 1) {
			return fmt.Errorf("fed: %w: fraction %v not in (0, 1]", ErrInvalidArgument, f)
		}
		c.fraction = f
		c.only("WithFraction", roleLeader)
		return nil
	}
}

// WithMinClients sets the fewest clients a round samples (Flower's
// min_fit_clients; default 1). A round waits until at least that many are
// members. (Lead.)
func WithMinClients(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("fed: %w: min clients %d", ErrInvalidArgument, n)
		}
		c.minFit = n
		c.only("WithMinClients", roleLeader)
		return nil
	}
}

// WithMinAvailable sets how many members a round waits for before it
// samples (Flower's min_available_clients; default: WithMinClients). It
// is also the fewest clients Leader.Await accepts to start with when the
// join timeout passes before the whole job joined. (Lead.)
func WithMinAvailable(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("fed: %w: min available %d", ErrInvalidArgument, n)
		}
		c.minAvailable = n
		c.only("WithMinAvailable", roleLeader)
		return nil
	}
}

// WithSeed seeds the sampling of clients (default 0): round k's sample is
// a function of the seed, k and the members, so a run with the same
// members samples the same clients. (Lead.)
func WithSeed(seed uint64) Option {
	return func(c *config) error {
		c.seed = seed
		c.only("WithSeed", roleLeader)
		return nil
	}
}

// WithRoundTimeout bounds each round (default 10 minutes): the leader
// averages the updates that reached it by then and the round ends. A round
// ends earlier once every sampled client reported or left. (Lead.)
func WithRoundTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("fed: %w: round timeout %v", ErrInvalidArgument, d)
		}
		c.roundTimeout = d
		c.only("WithRoundTimeout", roleLeader)
		return nil
	}
}

// WithServerOptimizer sets how the leader moves the model by a round's
// average update (default: plain FedAvg, the model becomes the clients'
// weighted average). See FedAvgM, FedAdam, FedYogi and FedAdagrad. (Lead.)
func WithServerOptimizer(o ServerOptimizer) Option {
	return func(c *config) error {
		if o == nil {
			return fmt.Errorf("fed: %w: WithServerOptimizer(nil)", ErrInvalidArgument)
		}
		c.optimizer = o
		c.only("WithServerOptimizer", roleLeader)
		return nil
	}
}

// WithReconnect sets how a client that lost its link to the leader tries
// to reach it again: for at most timeout (default 1 minute) after the link
// broke, waiting between attempts a random time below a bound that starts
// at backoff and doubles up to maxBackoff (defaults 100 ms and 5 s). A dial
// nobody answers at the leader's address (connection refused: no process
// listens there) ends the attempts at once. (Join.)
func WithReconnect(timeout, backoff, maxBackoff time.Duration) Option {
	return func(c *config) error {
		if timeout <= 0 || backoff <= 0 || maxBackoff < backoff {
			return fmt.Errorf("fed: %w: reconnect timeout %v, backoff %v to %v", ErrInvalidArgument, timeout, backoff, maxBackoff)
		}
		c.reconnect, c.backoff, c.maxBackoff = timeout, backoff, maxBackoff
		c.only("WithReconnect", roleClient)
		return nil
	}
}

// maxSamples is the largest sample count an update may carry.
const maxSamples = math.MaxUint32
