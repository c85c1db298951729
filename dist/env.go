package dist

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/tcp"
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

// rankVars are the (rank, world size, local rank) variables of the launchers
// InitFromEnv understands, in order of precedence.
var rankVars = [][3]string{
	{EnvRank, EnvWorldSize, EnvLocalRank},                                          // torchrun, gdistrun
	{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"}, // Open MPI
	{"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},                              // Slurm srun
}

// InitFromEnv joins the job described by the environment and returns this
// rank's group:
//
//   - rank and world size from RANK and WORLD_SIZE (torchrun, gdistrun),
//     else OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE (Open MPI), else
//     SLURM_PROCID and SLURM_NTASKS (Slurm); the local rank from LOCAL_RANK,
//     OMPI_COMM_WORLD_LOCAL_RANK or SLURM_LOCALID (see LocalRank). With none
//     of them the world is this one process.
//   - a world of one without MASTER_ADDR runs on the in-process transport.
//   - otherwise the ranks meet over TCP through rank 0, which listens on
//     MASTER_ADDR:MASTER_PORT; the others listen on GDIST_LISTEN_ADDR
//     (default 127.0.0.1:0, loopback). Connections are authenticated with
//     the job token GDIST_TOKEN, which is required unless GDIST_INSECURE=1.
//
// InitFromEnv returns when every rank has connected, or when ctx ends. A
// missing or malformed variable gives an error matching ErrEnv that names
// it. opts configure the group as in New.
func InitFromEnv(ctx context.Context, opts ...Option) (*ProcessGroup, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.err != nil {
		return nil, cfg.err
	}
	rank, world, local, err := rankFromEnv()
	if err != nil {
		return nil, err
	}
	addr, haveAddr := lookupEnv(EnvMasterAddr)
	var t transport.Transport
	if world == 1 && !haveAddr {
		ls, err := transport.NewLocal(1)
		if err != nil {
			return nil, err
		}
		t = ls[0]
	} else {
		tt, err := dialFromEnv(ctx, rank, world, addr, haveAddr, &cfg)
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
	g.localRank = local
	return g, nil
}

func dialFromEnv(ctx context.Context, rank, world int, addr string, haveAddr bool, cfg *config) (*tcp.Transport, error) {
	if !haveAddr {
		return nil, fmt.Errorf("%w: %s is not set (needed for a world of %d ranks)", ErrEnv, EnvMasterAddr, world)
	}
	port := os.Getenv(EnvMasterPort)
	if port == "" {
		return nil, fmt.Errorf("%w: %s is not set", ErrEnv, EnvMasterPort)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return nil, fmt.Errorf("%w: %s=%q is not a port number", ErrEnv, EnvMasterPort, port)
	}
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
	if listen == "" {
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

// rankFromEnv reads rank, world size and local rank from the first launcher
// whose rank variable is set.
func rankFromEnv() (rank, world, local int, err error) {
	for _, vars := range rankVars {
		rs, ok := lookupEnv(vars[0])
		if !ok {
			continue
		}
		if rank, err = envInt(vars[0], rs); err != nil {
			return 0, 0, 0, err
		}
		ws, ok := lookupEnv(vars[1])
		if !ok {
			return 0, 0, 0, fmt.Errorf("%w: %s is set but %s is not", ErrEnv, vars[0], vars[1])
		}
		if world, err = envInt(vars[1], ws); err != nil {
			return 0, 0, 0, err
		}
		if world < 1 || world > MaxWorldSize {
			return 0, 0, 0, fmt.Errorf("%w: %s=%d not in [1, %d]", ErrEnv, vars[1], world, MaxWorldSize)
		}
		if rank < 0 || rank >= world {
			return 0, 0, 0, fmt.Errorf("%w: %s=%d not in [0, %s=%d)", ErrEnv, vars[0], rank, vars[1], world)
		}
		local = rank
		if ls, ok := lookupEnv(vars[2]); ok {
			if local, err = envInt(vars[2], ls); err != nil {
				return 0, 0, 0, err
			}
			if local < 0 || local >= world {
				return 0, 0, 0, fmt.Errorf("%w: %s=%d not in [0, %d)", ErrEnv, vars[2], local, world)
			}
		}
		return rank, world, local, nil
	}
	return 0, 1, 0, nil
}

// lookupEnv is os.LookupEnv treating an empty value as unset.
func lookupEnv(name string) (string, bool) {
	v := os.Getenv(name)
	return v, v != ""
}

func envInt(name, v string) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%w: %s=%q is not an integer", ErrEnv, name, v)
	}
	return n, nil
}
