package dist

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/tcp"
	"github.com/gdist/gdist/internal/launchenv"
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
//     the job token GDIST_TOKEN, which is required unless GDIST_INSECURE=1.
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
	if job.WorldSize == 1 && job.MasterAddr == "" {
		ls, err := transport.NewLocal(1)
		if err != nil {
			return nil, err
		}
		t = ls[0]
	} else {
		tt, err := dialFromEnv(ctx, job, &cfg)
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
	g.localRank = job.LocalRank
	return g, nil
}

func dialFromEnv(ctx context.Context, job launchenv.Job, cfg *config) (*tcp.Transport, error) {
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
	var topts []tcp.Option
	switch token, insecure := os.Getenv(EnvToken), os.Getenv(EnvInsecure); {
	case token != "":
		topts = append(topts, tcp.WithToken([]byte(token)))
	case insecure == "1":
		topts = append(topts, tcp.WithInsecure())
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
	if cfg.loggerSet {
		topts = append(topts, tcp.WithLogger(cfg.logger))
	}
	t, err := tcp.Rendezvous(ctx, rank, world, net.JoinHostPort(addr, port), topts...)
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
		env = append(env, WithMetricsAddr(v))
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
