package gdist

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/metrics"
	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/hybrid"
	"github.com/gdist/gdist/dist/transport/tcp"
	"github.com/gdist/gdist/internal/errs"
	"github.com/gdist/gdist/internal/launchenv"
	"github.com/gdist/gdist/internal/options"
)

// ErrInvalidArgument is matched by the error of an invalid option. It is
// the value every gdist package exports under this name
// (dist.ErrInvalidArgument, tcp.ErrInvalidArgument, ...).
var ErrInvalidArgument = errs.ErrInvalidArgument

// Option configures InitFromEnv. Each option checks its value when
// InitFromEnv applies it, and InitFromEnv fails with the first refusal: an
// error wrapping ErrInvalidArgument that names the option. A nil Option is
// refused the same way.
type Option func(*config) error

type config struct {
	groupOpts  []dist.Option   // WithGroupOptions, WithLogger
	tcpOpts    []tcp.Option    // WithTCPOptions
	hybridOpts []hybrid.Option // WithSHMOptions (options_linux.go)
	logger     *slog.Logger    // WithLogger; nil: the transports log to slog.Default()
}

// newConfig applies opts, in order, to the zero config.
func newConfig(opts []Option) (config, error) {
	var cfg config
	if err := options.Apply(&cfg, opts, "gdist", ErrInvalidArgument); err != nil {
		return config{}, err
	}
	return cfg, nil
}

// invalidOption is the error of an option that refuses its value.
func invalidOption(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...) // the sentinel says "gdist:"
}

// WithGroupOptions passes opts to dist.New, after the options InitFromEnv
// derives from the environment (GDIST_TIMELINE, GDIST_METRICS_ADDR, ...),
// so they win. Given several times, the lists add up. A nil option is
// refused here; the others are checked, as dist.New checks them, before
// InitFromEnv connects.
func WithGroupOptions(opts ...dist.Option) Option {
	return func(c *config) error {
		if err := options.NoNil("gdist: WithGroupOptions", opts, ErrInvalidArgument); err != nil {
			return err
		}
		c.groupOpts = append(c.groupOpts, opts...)
		return nil
	}
}

// WithTCPOptions passes opts to the TCP transport InitFromEnv creates,
// after the options InitFromEnv derives from the environment (GDIST_TOKEN,
// GDIST_LISTEN_ADDR, GDIST_HEARTBEAT_TIMEOUT, ...), so they win. Given
// several times, the lists add up. The transport validates them:
// InitFromEnv fails with its error (matching tcp.ErrInvalidArgument) for a
// bad one. A nil option is refused. A world of one without MASTER_ADDR
// makes no TCP transport and ignores them.
func WithTCPOptions(opts ...tcp.Option) Option {
	return func(c *config) error {
		if err := options.NoNil("gdist: WithTCPOptions", opts, ErrInvalidArgument); err != nil {
			return err
		}
		c.tcpOpts = append(c.tcpOpts, opts...)
		return nil
	}
}

// WithLogger sets where the group (dist.WithLogger) and the transports
// InitFromEnv makes log. Without it the group discards its messages and
// the transports log to slog.Default(). l must not be nil.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return invalidOption("WithLogger(nil)")
		}
		c.logger = l
		c.groupOpts = append(c.groupOpts, dist.WithLogger(l))
		return nil
	}
}

// InitFromEnv joins the job described by the environment and returns this
// rank's group:
//
//   - rank, world size and local rank from the launcher's variables:
//     RANK, WORLD_SIZE, LOCAL_RANK (gdistrun, torchrun); JOB_COMPLETION_INDEX
//     and WORLD_SIZE (a Kubernetes Indexed Job); SLURM_PROCID, SLURM_NTASKS,
//     SLURM_LOCALID (Slurm); OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK (Open
//     MPI); PMI_RANK, PMI_SIZE, MPI_LOCALRANKID (MPICH, Intel MPI). With none
//     of them the world is this one process.
//   - a world of one without MASTER_ADDR runs on the in-process transport.
//   - otherwise the ranks meet over TCP through rank 0, which listens on
//     MASTER_ADDR:MASTER_PORT. Where the launcher tells enough, these need
//     not be set: under Slurm the master is the first host of the step's node
//     list (loopback for a one-node step) and the port is derived from the
//     job id; under Open MPI, MPICH and Intel MPI a job whose ranks are all
//     on this host meets on loopback on a port derived from the job id;
//     under torchrun the port after MASTER_PORT is used, since torchrun's own
//     store holds MASTER_PORT. GDIST_MASTER_PORT overrides a derived port.
//     See package internal/launchenv for the exact rules.
//   - the other ranks listen on GDIST_LISTEN_ADDR; by default on loopback
//     (127.0.0.1:0) when the launcher says every rank is on this host, and
//     on all interfaces (0.0.0.0:0, advertising the address that reaches rank
//     0) when the ranks may span hosts. Connections are authenticated with
//     the job token GDIST_TOKEN, which is required unless GDIST_INSECURE=1
//     and must hold at least 128 bits (32 hex digits or 16 bytes; see
//     tcp.WithToken).
//   - then ranks on one host talk through shared memory and the others
//     over TCP (package transport/hybrid): every rank tells the others its
//     host identity — boot id, host name and network namespace, or
//     GDIST_HOST_ID when set (to simulate hosts on one machine) — and the
//     ranks of each host set up package shm among themselves.
//     GDIST_TRANSPORT chooses: "auto" (the default) uses shared memory
//     where it sets up and falls back to TCP, with a warning, on a host
//     where it does not (and on systems without it); "tcp" never uses
//     shared memory; "shm" requires it between the ranks of every host
//     and fails naming the rank where it could not be set up. Every rank
//     must use the same value. The group's Transport is then a
//     *hybrid.Transport (Via tells the route to each peer).
//   - with GDIST_TLS_CERT, GDIST_TLS_KEY and GDIST_TLS_CA set (PEM files:
//     this rank's certificate, its key, the CA it trusts for its peers), every
//     TCP link runs over TLS 1.3 with mutual authentication, under the token
//     (tcp.WithTLS; GDIST_TLS_SERVER_NAME names the one name every
//     certificate carries, else each is checked against the address dialed).
//   - the transports' heartbeat, init timeout, maximum frame and socket
//     buffers come from GDIST_HEARTBEAT_TIMEOUT, GDIST_HEARTBEAT_INTERVAL,
//     GDIST_INIT_TIMEOUT, GDIST_MAX_FRAME and GDIST_SOCKET_BUFFER when set
//     (gdistrun's -heartbeat-timeout and -init-timeout set the first and
//     the third; the heartbeat and maximum frame apply to shared memory
//     too), then from WithTCPOptions and WithSHMOptions (Linux). With
//     dist.WithMetricsAddr (or GDIST_METRICS_ADDR) the TCP links' heartbeat
//     round trips go to the gdist_heartbeat_rtt_seconds histogram, unless
//     WithTCPOptions sets a tcp.WithHeartbeatObserver of its own.
//   - the group is made by dist.New with the options the environment asks
//     for (GDIST_TIMELINE, GDIST_METRICS_ADDR, GDIST_RESTART_COUNT, the
//     launcher's local rank) followed by those of WithGroupOptions, which
//     win; dist.New itself reads GDIST_DEBUG, GDIST_STALL_THRESHOLD and
//     GDIST_HIERARCHICAL.
//
// InitFromEnv returns when every rank has connected, or when ctx ends. A
// missing or malformed variable gives an error matching dist.ErrEnv that
// names it. An invalid option gives one matching ErrInvalidArgument: an
// option of InitFromEnv or of the group before anything connects, a
// transport's option when the transport checks it.
func InitFromEnv(ctx context.Context, opts ...Option) (*dist.ProcessGroup, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	gopts, err := groupEnvOptions(os.LookupEnv)
	if err != nil {
		return nil, err
	}
	if err := dist.CheckOptions(slices.Concat(gopts, cfg.groupOpts)...); err != nil {
		return nil, err // before connecting
	}
	job, err := launchenv.FromEnv(os.LookupEnv)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", dist.ErrEnv, err)
	}
	if job.WorldSize > dist.MaxWorldSize {
		return nil, fmt.Errorf("%w: world size %d not in [1, %d]", dist.ErrEnv, job.WorldSize, dist.MaxWorldSize)
	}
	gopts = slices.Concat(gopts, []dist.Option{dist.WithLocalRank(job.LocalRank)}, cfg.groupOpts)
	var t transport.Transport
	var rtts atomic.Pointer[metrics.Metrics] // where heartbeat round trips go, once the group has metrics
	if job.WorldSize == 1 && job.MasterAddr == "" {
		ls, err := transport.NewLocal(1)
		if err != nil {
			return nil, err
		}
		t = ls[0]
	} else {
		tt, err := dialFromEnv(ctx, job, &cfg, &rtts)
		if err != nil {
			return nil, err
		}
		t = tt
	}
	g, err := dist.New(t, gopts...)
	if err != nil {
		t.Close()
		return nil, err
	}
	if m := g.Metrics(); m != nil {
		rtts.Store(m) // the transport's heartbeat round trips, from now on
	}
	return g, nil
}

func dialFromEnv(ctx context.Context, job launchenv.Job, cfg *config, rtts *atomic.Pointer[metrics.Metrics]) (*hybrid.Transport, error) {
	rank, world := job.Rank, job.WorldSize
	if job.MasterAddr == "" {
		hint := ""
		if job.Launcher == launchenv.OpenMPI || job.Launcher == launchenv.PMI {
			hint = " (the ranks span hosts: pass the first host, e.g. mpirun -x MASTER_ADDR=host0)"
		}
		return nil, fmt.Errorf("%w: %s is not set (needed for a world of %d ranks)%s", dist.ErrEnv, EnvMasterAddr, world, hint)
	}
	if job.MasterPort == 0 {
		return nil, fmt.Errorf("%w: %s is not set", dist.ErrEnv, EnvMasterPort)
	}
	addr, port := job.MasterAddr, strconv.Itoa(job.MasterPort)
	hopts, err := hybridEnvOptions(os.LookupEnv)
	if err != nil {
		return nil, err
	}
	var topts []tcp.Option
	switch token, insecure := os.Getenv(EnvToken), os.Getenv(EnvInsecure); {
	case token != "":
		if err := tcp.CheckToken([]byte(token)); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", dist.ErrEnv, EnvToken, err)
		}
		hopts = append(hopts, hybrid.WithToken([]byte(token)))
	case insecure == "1":
		hopts = append(hopts, hybrid.WithInsecure())
	case world > 1:
		return nil, fmt.Errorf("%w: %s is not set (set it to the job token, or %s=1 on a trusted network)", dist.ErrEnv, EnvToken, EnvInsecure)
	}
	listen := os.Getenv(EnvListenAddr)
	switch {
	case listen != "":
	case job.Multihost:
		listen = "0.0.0.0:0"
	default:
		listen = "127.0.0.1:0"
	}
	topts = append(topts, tcp.WithListenAddr(listen))
	topts = append(topts, tcp.WithHeartbeatObserver(func(peer int, rtt time.Duration) {
		if m := rtts.Load(); m != nil {
			m.HeartbeatRTT(peer, rtt)
		}
	}))
	if cfg.logger != nil {
		hopts = append(hopts, hybrid.WithLogger(cfg.logger))
	}
	eopts, err := tcpEnvOptions(os.LookupEnv)
	if err != nil {
		return nil, err
	}
	if tc, err := envTLS(os.LookupEnv); err != nil {
		return nil, err
	} else if tc != nil {
		topts = append(topts, tcp.WithTLS(tc))
	}
	topts = append(append(topts, eopts...), cfg.tcpOpts...)
	hopts = append(hopts, hybrid.WithTCP(topts...))
	sopts, err := shmEnvOptions(os.LookupEnv)
	if err != nil {
		return nil, err
	}
	hopts = append(append(hopts, sopts...), cfg.hybridOpts...)
	t, err := hybrid.Rendezvous(ctx, rank, world, net.JoinHostPort(addr, port), hopts...)
	if err != nil {
		return nil, fmt.Errorf("gdist: rank %d of %d: join %s:%s: %w", rank, world, addr, port, err)
	}
	return t, nil
}
