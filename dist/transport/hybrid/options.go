package hybrid

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/gdist/gdist/dist/transport/tcp"
	"github.com/gdist/gdist/internal/errs"
	"github.com/gdist/gdist/internal/logx"
	"github.com/gdist/gdist/internal/options"
)

// Mode says when the hybrid transport uses shared memory.
type Mode uint8

// The modes.
const (
	// Auto (the default) uses shared memory between the ranks of a host
	// where it sets up, and TCP where it does not (the host's ranks agree,
	// and a warning is logged) and between hosts. On systems without
	// package shm (not Linux) it is TCP.
	Auto Mode = iota
	// TCP never uses shared memory; hosts are still known (Hosts).
	TCP
	// SHM requires shared memory between the ranks of each host: if it
	// cannot be set up, Rendezvous fails naming the rank that failed.
	SHM
)

func (m Mode) String() string {
	switch m {
	case Auto:
		return "auto"
	case TCP:
		return "tcp"
	case SHM:
		return "shm"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// ParseMode parses "auto", "tcp" or "shm" (GDIST_TRANSPORT's values). Any
// other string gives an error matching ErrInvalidArgument.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "auto":
		return Auto, nil
	case "tcp":
		return TCP, nil
	case "shm":
		return SHM, nil
	}
	return 0, fmt.Errorf("hybrid: %w: transport mode %q (want auto, tcp or shm)", ErrInvalidArgument, s)
}

// Defaults for the options.
const (
	// DefaultSetupTimeout bounds the shared-memory setup of a host, after
	// the TCP rendezvous (Auto then falls back to TCP, SHM fails), and the
	// wait for the other ranks' host identities.
	DefaultSetupTimeout = 20 * time.Second
	// MaxHostID is the longest host identity, in bytes.
	MaxHostID = 1024
)

// Errors of package hybrid. Errors of the underlying transports are
// returned as they are (wrapped), so tcp.ErrAuth, shm.ErrNoLink,
// *transport.PeerError and the rest match through them.
var (
	// ErrInvalidArgument is matched by the errors Rendezvous returns for
	// invalid arguments or options. It is the value every gdist package
	// exports under this name (errs.ErrInvalidArgument).
	ErrInvalidArgument = errs.ErrInvalidArgument
	// ErrMismatch means the ranks disagree on the mode: every rank of the
	// job must use the same one.
	ErrMismatch = errors.New("hybrid: ranks disagree on the transport mode")
	// ErrProtocol means a peer sent a setup message the protocol does not
	// allow.
	ErrProtocol = errors.New("hybrid: protocol error")
	// ErrSHMSetup is matched by the *SHMError of a shared-memory setup
	// that failed in mode SHM.
	ErrSHMSetup = errors.New("hybrid: shared-memory setup failed")
)

// SHMError reports that shared memory could not be set up among the ranks
// of a host in mode SHM. Every rank of that host returns it, naming the
// same rank.
type SHMError struct {
	Rank int   // the lowest rank of the host whose own setup failed
	Host int   // its host index (Hosts)
	Err  error // that rank's error (on the other ranks: what it reported)
}

func (e *SHMError) Error() string {
	return fmt.Sprintf("hybrid: shared memory on host %d failed at rank %d: %v", e.Host, e.Rank, e.Err)
}

func (e *SHMError) Unwrap() error { return e.Err }

// Is makes every SHMError match ErrSHMSetup.
func (e *SHMError) Is(target error) bool { return target == ErrSHMSetup }

// Option configures Rendezvous. Options are applied in order and validated
// by Rendezvous, which returns an error matching ErrInvalidArgument for an invalid
// one.
type Option func(*config) error

type config struct {
	mode         Mode
	hostID       string
	token        []byte
	insecure     bool
	logger       *slog.Logger
	setupTimeout time.Duration
	tcpOpts      []tcp.Option
	shmOpts      []any // shm.Option where package shm exists (shm_linux.go)
}

func defaultConfig() config {
	return config{setupTimeout: DefaultSetupTimeout}
}

func apply(opts []Option) (config, error) {
	cfg := defaultConfig()
	if err := options.Apply(&cfg, opts, "hybrid", ErrInvalidArgument); err != nil {
		return cfg, err
	}
	if cfg.logger == nil {
		cfg.logger = logx.Default()
	}
	return cfg, nil
}

// WithMode sets the mode (default Auto).
func WithMode(m Mode) Option {
	return func(c *config) error {
		if m > SHM {
			return fmt.Errorf("hybrid: %w: mode %v", ErrInvalidArgument, m)
		}
		c.mode = m
		return nil
	}
}

// WithHostID sets this rank's host identity, replacing the default
// (DefaultHostID: boot id, host name and network namespace). Ranks with
// equal identities are on one host and, in modes Auto and SHM, talk
// through shared memory; it is meant for tests and benchmarks that
// simulate several hosts on one machine (GDIST_HOST_ID in
// gdist.InitFromEnv). Ranks given one identity must really share a host
// and a network namespace. s must be non-empty and at most MaxHostID
// bytes.
func WithHostID(s string) Option {
	return func(c *config) error {
		if s == "" || len(s) > MaxHostID {
			return fmt.Errorf("hybrid: %w: host id of %d bytes (want 1 to %d)", ErrInvalidArgument, len(s), MaxHostID)
		}
		c.hostID = s
		return nil
	}
}

// WithToken sets the job token both transports authenticate with: it is
// given to the TCP transport (tcp.WithToken, which checks its length) and
// to the shared-memory one. Without it (a token given only inside WithTCP,
// or WithInsecure) the shared-memory links authenticate with a random
// session value rank 0 sends over the authenticated TCP links. The token
// is copied.
func WithToken(token []byte) Option {
	return func(c *config) error {
		if err := tcp.CheckToken(token); err != nil {
			return fmt.Errorf("hybrid: %w: %w", ErrInvalidArgument, err)
		}
		c.token = append([]byte(nil), token...)
		return nil
	}
}

// WithInsecure runs the job without a token (tcp.WithInsecure); the
// shared-memory links still authenticate with the session value.
func WithInsecure() Option {
	return func(c *config) error { c.insecure = true; return nil }
}

// WithLogger sets the logger of both transports and of the setup (the
// fallback warning of mode Auto). The default is the program's
// slog.Default() if it set one, else stderr in the format GDIST_LOG_FORMAT
// selects (text or json). Loggers
// given with WithTCP or WithSHM win for their transport.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return fmt.Errorf("hybrid: %w: nil logger", ErrInvalidArgument)
		}
		c.logger = l
		return nil
	}
}

// WithSetupTimeout bounds the wait for the other ranks' host identities
// and the shared-memory setup of this rank's host, which start once the
// TCP rendezvous is done (default DefaultSetupTimeout). d must be
// positive.
func WithSetupTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("hybrid: %w: setup timeout %v", ErrInvalidArgument, d)
		}
		c.setupTimeout = d
		return nil
	}
}

// WithTCP passes opts to the TCP transport, after the options Rendezvous
// derives (token, logger), so they win. Given several times, the lists add
// up. The TCP transport validates them: Rendezvous fails with its error
// (matching tcp.ErrInvalidArgument) for a bad one.
func WithTCP(opts ...tcp.Option) Option {
	return func(c *config) error {
		if err := options.NoNil("hybrid: WithTCP", opts, ErrInvalidArgument); err != nil {
			return err
		}
		c.tcpOpts = append(c.tcpOpts, opts...)
		return nil
	}
}
