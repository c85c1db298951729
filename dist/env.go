package dist

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/gdist/gdist/dist/metrics"
	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/hybrid"
	"github.com/gdist/gdist/dist/transport/tcp"
	"github.com/gdist/gdist/internal/launchenv"
	"github.com/gdist/gdist/internal/options"
)

// Environment variables InitFromEnv reads.
const (
	EnvRank       = "RANK"              // torchrun / gdistrun
	EnvWorldSize  = "WORLD_SIZE"        // torchrun / gdistrun
	EnvLocalRank  = "LOCAL_RANK"        // torchrun / gdistrun
	EnvMasterAddr = "MASTER_ADDR"       // host of rank 0's rendezvous listener
	EnvMasterPort = "MASTER_PORT"       // its port
	EnvToken      = "GDIST_TOKEN"       // job token (required for world > 1 ...)
	EnvInsecure   = "GDIST_INSECURE"    // ... unless this is "1"
	EnvListenAddr = "GDIST_LISTEN_ADDR" // where ranks other than 0 listen (default 127.0.0.1:0)
	EnvTransport  = "GDIST_TRANSPORT"   // auto (default), tcp or shm: see InitFromEnv
	EnvHostID     = "GDIST_HOST_ID"     // this rank's host identity, replacing the default (tests simulating hosts)
)

// Environment variables InitFromEnv reads to configure the transports.
// Each overrides the transport's default; options given with
// WithTCPOptions (and WithSHMOptions) override them in turn. The heartbeat
// and the maximum frame apply to the TCP and the shared-memory links
// alike; the others to TCP only.
const (
	// EnvHeartbeatTimeout: after how long without a byte from a peer it is
	// reported unresponsive, a Go duration (default 10s on every
	// transport: transport.DefaultHeartbeatTimeout, whose doc says why).
	EnvHeartbeatTimeout = "GDIST_HEARTBEAT_TIMEOUT"
	// EnvHeartbeatInterval: how often each link sends a heartbeat, a Go
	// duration (default: min(timeout/8, 1s)).
	EnvHeartbeatInterval = "GDIST_HEARTBEAT_INTERVAL"
	// EnvInitTimeout: how long the rendezvous may take before every
	// waiting rank fails naming the ranks that never joined, a Go duration
	// (default 5m: tcp.DefaultInitTimeout).
	EnvInitTimeout = "GDIST_INIT_TIMEOUT"
	// EnvMaxFrame: the largest message this rank accepts, in bytes, with an
	// optional K, M or G suffix (binary: 64M = 64 MiB; default 64M).
	EnvMaxFrame = "GDIST_MAX_FRAME"
	// EnvSocketBuffer: kernel send and receive buffer size of every
	// connection, in bytes with an optional K, M or G suffix (default: the
	// kernel's auto-tuning).
	EnvSocketBuffer = "GDIST_SOCKET_BUFFER"
)

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
//   - the transports' heartbeat, init timeout, maximum frame and socket
//     buffers come from GDIST_HEARTBEAT_TIMEOUT, GDIST_HEARTBEAT_INTERVAL,
//     GDIST_INIT_TIMEOUT, GDIST_MAX_FRAME and GDIST_SOCKET_BUFFER when set
//     (gdistrun's -heartbeat-timeout and -init-timeout set the first and
//     the third; the heartbeat and maximum frame apply to shared memory
//     too), then from WithTCPOptions and WithSHMOptions (Linux). With
//     WithMetricsAddr (or GDIST_METRICS_ADDR) the TCP links' heartbeat
//     round trips go to the gdist_heartbeat_rtt_seconds histogram, unless
//     WithTCPOptions sets a tcp.WithHeartbeatObserver of its own.
//
// InitFromEnv returns when every rank has connected, or when ctx ends. A
// missing or malformed variable gives an error matching ErrEnv that names
// it. opts configure the group as in New.
func InitFromEnv(ctx context.Context, opts ...Option) (*ProcessGroup, error) {
	opts, err := envOptions(opts)
	if err != nil {
		return nil, err
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	job, err := launchenv.FromEnv(os.LookupEnv)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrEnv, err)
	}
	if job.WorldSize > MaxWorldSize {
		return nil, fmt.Errorf("%w: world size %d not in [1, %d]", ErrEnv, job.WorldSize, MaxWorldSize)
	}
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
	g, err := New(t, opts...)
	if err != nil {
		t.Close()
		return nil, err
	}
	if g.obs.met != nil {
		rtts.Store(g.obs.met) // the transport's heartbeat round trips, from now on
	}
	g.localRank = job.LocalRank
	return g, nil
}

func dialFromEnv(ctx context.Context, job launchenv.Job, cfg *config, rtts *atomic.Pointer[metrics.Metrics]) (*hybrid.Transport, error) {
	rank, world := job.Rank, job.WorldSize
	if job.MasterAddr == "" {
		hint := ""
		if job.Launcher == launchenv.OpenMPI || job.Launcher == launchenv.PMI {
			hint = " (the ranks span hosts: pass the first host, e.g. mpirun -x MASTER_ADDR=host0)"
		}
		return nil, fmt.Errorf("%w: %s is not set (needed for a world of %d ranks)%s", ErrEnv, EnvMasterAddr, world, hint)
	}
	if job.MasterPort == 0 {
		return nil, fmt.Errorf("%w: %s is not set", ErrEnv, EnvMasterPort)
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
			return nil, fmt.Errorf("%w: %s: %w", ErrEnv, EnvToken, err)
		}
		hopts = append(hopts, hybrid.WithToken([]byte(token)))
	case insecure == "1":
		hopts = append(hopts, hybrid.WithInsecure())
	case world > 1:
		return nil, fmt.Errorf("%w: %s is not set (set it to the job token, or %s=1 on a trusted network)", ErrEnv, EnvToken, EnvInsecure)
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
	if cfg.loggerSet {
		hopts = append(hopts, hybrid.WithLogger(cfg.logger))
	}
	eopts, err := tcpEnvOptions(os.LookupEnv)
	if err != nil {
		return nil, err
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
		return nil, fmt.Errorf("dist: rank %d of %d: join %s:%s: %w", rank, world, addr, port, err)
	}
	return t, nil
}

// envOptions puts the options the environment asks for (GDIST_TIMELINE,
// GDIST_METRICS_ADDR, GDIST_RESTART_COUNT) before the caller's, which win.
func envOptions(opts []Option) ([]Option, error) {
	var env []Option
	if v := os.Getenv(EnvTimeline); v != "" {
		env = append(env, WithTimeline(v))
	}
	if v := os.Getenv(EnvMetricsAddr); v != "" {
		job, _ := launchenv.FromEnv(os.LookupEnv) // its errors are InitFromEnv's to report
		addr, err := metrics.RankAddr(v, job.LocalRank)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrEnv, EnvMetricsAddr, err)
		}
		env = append(env, WithMetricsAddr(addr))
	}
	if v := os.Getenv(EnvRestartCount); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%w: %s=%q is not a count", ErrEnv, EnvRestartCount, v)
		}
		env = append(env, func(c *config) error { c.restarts = n; return nil })
	}
	return append(env, opts...), nil
}

// tcpEnvOptions returns the TCP transport options the environment asks
// for (GDIST_HEARTBEAT_TIMEOUT, GDIST_HEARTBEAT_INTERVAL,
// GDIST_INIT_TIMEOUT, GDIST_MAX_FRAME, GDIST_SOCKET_BUFFER). A malformed
// value is an error matching ErrEnv that names the variable.
func tcpEnvOptions(lookup func(string) (string, bool)) ([]tcp.Option, error) {
	var opts []tcp.Option
	if interval, timeout, ok, err := envHeartbeat(lookup); err != nil {
		return nil, err
	} else if ok {
		opts = append(opts, tcp.WithHeartbeat(interval, timeout)) // interval 0: derived
	}
	if d, ok, err := envDuration(lookup, EnvInitTimeout); err != nil {
		return nil, err
	} else if ok {
		opts = append(opts, tcp.WithInitTimeout(d))
	}
	if n, ok, err := envSize(lookup, EnvMaxFrame); err != nil {
		return nil, err
	} else if ok {
		opts = append(opts, tcp.WithMaxFrame(n))
	}
	if n, ok, err := envSize(lookup, EnvSocketBuffer); err != nil {
		return nil, err
	} else if ok {
		opts = append(opts, tcp.WithSocketBuffer(n))
	}
	return opts, nil
}

// hybridEnvOptions returns the options of the hybrid transport the
// environment asks for (GDIST_TRANSPORT, GDIST_HOST_ID). A malformed value
// is an error matching ErrEnv that names the variable.
func hybridEnvOptions(lookup func(string) (string, bool)) ([]hybrid.Option, error) {
	var opts []hybrid.Option
	if v, ok := lookup(EnvTransport); ok && v != "" {
		m, err := hybrid.ParseMode(v)
		if err != nil {
			return nil, fmt.Errorf("%w: %s=%q is not auto, tcp or shm", ErrEnv, EnvTransport, v)
		}
		opts = append(opts, hybrid.WithMode(m))
	}
	if v, ok := lookup(EnvHostID); ok && v != "" {
		if len(v) > hybrid.MaxHostID {
			return nil, fmt.Errorf("%w: %s has %d bytes, at most %d", ErrEnv, EnvHostID, len(v), hybrid.MaxHostID)
		}
		opts = append(opts, hybrid.WithHostID(v))
	}
	return opts, nil
}

// envHeartbeat returns the heartbeat GDIST_HEARTBEAT_TIMEOUT and
// GDIST_HEARTBEAT_INTERVAL ask for: ok is false when neither is set;
// interval is 0 (derived by the transport) unless set.
func envHeartbeat(lookup func(string) (string, bool)) (interval, timeout time.Duration, ok bool, err error) {
	hbTimeout, tset, err := envDuration(lookup, EnvHeartbeatTimeout)
	if err != nil {
		return 0, 0, false, err
	}
	hbInterval, iset, err := envDuration(lookup, EnvHeartbeatInterval)
	if err != nil {
		return 0, 0, false, err
	}
	if !tset && !iset {
		return 0, 0, false, nil
	}
	if !tset {
		hbTimeout = tcp.DefaultHeartbeatTimeout
	}
	if iset && hbTimeout < 2*hbInterval {
		return 0, 0, false, fmt.Errorf("%w: %s=%v must be at least twice %s=%v", ErrEnv,
			EnvHeartbeatTimeout, hbTimeout, EnvHeartbeatInterval, hbInterval)
	}
	return hbInterval, hbTimeout, true, nil
}

// envDuration parses the positive duration in variable name, if set.
func envDuration(lookup func(string) (string, bool), name string) (time.Duration, bool, error) {
	v, ok := lookup(name)
	if !ok || v == "" {
		return 0, false, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, false, fmt.Errorf("%w: %s=%q is not a positive duration (e.g. 10s)", ErrEnv, name, v)
	}
	return d, true, nil
}

// envSize parses the positive byte count in variable name, if set.
func envSize(lookup func(string) (string, bool), name string) (int, bool, error) {
	v, ok := lookup(name)
	if !ok || v == "" {
		return 0, false, nil
	}
	n, err := options.ParseBytes(v)
	if err != nil || n <= 0 {
		return 0, false, fmt.Errorf("%w: %s=%q is not a positive size in bytes (e.g. 67108864 or 64M)", ErrEnv, name, v)
	}
	return n, true, nil
}
