package fed

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/transport/hybrid"
	"github.com/gdist/gdist/dist/transport/tcp"
	"github.com/gdist/gdist/internal/envconf"
	"github.com/gdist/gdist/internal/launchenv"
)

// ErrEnv is matched by the errors of FromEnv about a missing or malformed
// variable (it is dist.ErrEnv).
var ErrEnv = dist.ErrEnv

// Environment variables FromEnv reads besides the launcher's (RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT and the others gdist.InitFromEnv
// reads) and the GDIST_TLS_* files (see gdist.EnvTLSCert).
const (
	EnvToken       = "GDIST_TOKEN"        // the job token (at least 128 bits)
	EnvInsecure    = "GDIST_INSECURE"     // "1": no token, on a trusted network only
	EnvTransport   = "GDIST_TRANSPORT"    // auto, tcp or shm: whether a client on the leader's host uses shared memory
	EnvHostID      = "GDIST_HOST_ID"      // this process's host identity (hybrid.WithHostID)
	EnvInitTimeout = "GDIST_INIT_TIMEOUT" // the join timeout (WithJoinTimeout)
	EnvMaxFrame    = "GDIST_MAX_FRAME"    // the largest message a link accepts
	EnvSocketBuf   = "GDIST_SOCKET_BUFFER"
)

// Job is a federation as the launcher's environment describes it: this
// process's rank (0 leads), the number of ranks, the leader's address and
// the options the GDIST_* variables ask for.
type Job struct {
	Rank, World int
	Addr        string   // MASTER_ADDR:MASTER_PORT: where the leader listens and the clients dial
	Options     []Option // from the environment; a caller's options given after them win
}

// FromEnv reads the job from the environment a launcher (gdistrun,
// torchrun, Slurm, an MPI launcher, a Kubernetes Indexed Job) gives every
// process, as gdist.InitFromEnv does: the rank and world size; MASTER_ADDR
// and MASTER_PORT (the leader listens there, rank 0); GDIST_TOKEN (or
// GDIST_INSECURE=1); GDIST_TLS_CERT, GDIST_TLS_KEY and GDIST_TLS_CA (TLS
// with mutual authentication, GDIST_TLS_SERVER_NAME optional);
// GDIST_HEARTBEAT_TIMEOUT and GDIST_HEARTBEAT_INTERVAL; GDIST_INIT_TIMEOUT
// (the join timeout); GDIST_TRANSPORT and GDIST_HOST_ID (shared memory
// for a client on the leader's host); GDIST_MAX_FRAME and
// GDIST_SOCKET_BUFFER. A missing or malformed variable gives an error
// matching ErrEnv that names it.
func FromEnv() (Job, error) {
	return fromEnv(os.LookupEnv)
}

func fromEnv(lookup envconf.Lookup) (Job, error) {
	job, err := launchenv.FromEnv(lookup)
	if err != nil {
		return Job{}, fmt.Errorf("%w: %w", ErrEnv, err)
	}
	if job.WorldSize < 2 {
		return Job{}, fmt.Errorf("%w: a federation needs a leader and at least one client; WORLD_SIZE is %d", ErrEnv, job.WorldSize)
	}
	if job.MasterAddr == "" || job.MasterPort == 0 {
		return Job{}, fmt.Errorf("%w: %s and %s must name where the leader (rank 0) listens", ErrEnv, launchenv.EnvMasterAddr, launchenv.EnvMasterPort)
	}
	j := Job{Rank: job.Rank, World: job.WorldSize, Addr: net.JoinHostPort(job.MasterAddr, strconv.Itoa(job.MasterPort))}
	add := func(o ...Option) { j.Options = append(j.Options, o...) }
	switch token, _ := lookup(EnvToken); {
	case token != "":
		if err := tcp.CheckToken([]byte(token)); err != nil {
			return Job{}, fmt.Errorf("%w: %s: %w", ErrEnv, EnvToken, err)
		}
		add(WithToken([]byte(token)))
	case get(lookup, EnvInsecure) == "1":
		add(WithInsecure())
	default:
		return Job{}, fmt.Errorf("%w: %s is not set (set it to the job token, or %s=1 on a trusted network)", ErrEnv, EnvToken, EnvInsecure)
	}
	files, ok, err := envconf.TLS(lookup)
	if err != nil {
		return Job{}, fmt.Errorf("%w: %w", ErrEnv, err)
	}
	if ok {
		cfg, err := tcp.LoadTLS(files.Cert, files.Key, files.CA, files.ServerName)
		if err != nil {
			return Job{}, fmt.Errorf("%w: %s, %s, %s: %w", ErrEnv, envconf.TLSCert, envconf.TLSKey, envconf.TLSCA, err)
		}
		add(WithTLS(cfg))
	}
	interval, timeout, ok, err := envconf.Heartbeat(lookup, tcp.DefaultHeartbeatTimeout)
	if err != nil {
		return Job{}, fmt.Errorf("%w: %w", ErrEnv, err)
	}
	if ok {
		add(WithHeartbeat(interval, timeout))
	}
	if d, ok, err := envconf.Duration(lookup, EnvInitTimeout); err != nil {
		return Job{}, fmt.Errorf("%w: %w", ErrEnv, err)
	} else if ok {
		add(WithJoinTimeout(d))
	}
	if n, ok, err := envconf.Size(lookup, EnvMaxFrame); err != nil {
		return Job{}, fmt.Errorf("%w: %w", ErrEnv, err)
	} else if ok {
		add(WithTCP(tcp.WithMaxFrame(n)))
		add(WithHybrid(shmMaxFrame(n)...))
	}
	if n, ok, err := envconf.Size(lookup, EnvSocketBuf); err != nil {
		return Job{}, fmt.Errorf("%w: %w", ErrEnv, err)
	} else if ok {
		add(WithTCP(tcp.WithSocketBuffer(n)))
	}
	if v := get(lookup, EnvTransport); v != "" {
		m, err := hybrid.ParseMode(v)
		if err != nil {
			return Job{}, fmt.Errorf("%w: %s=%q is not auto, tcp or shm", ErrEnv, EnvTransport, v)
		}
		add(WithHybrid(hybrid.WithMode(m)))
	}
	if v := get(lookup, EnvHostID); v != "" {
		if len(v) > hybrid.MaxHostID {
			return Job{}, fmt.Errorf("%w: %s has %d bytes, at most %d", ErrEnv, EnvHostID, len(v), hybrid.MaxHostID)
		}
		add(WithHybrid(hybrid.WithHostID(v)))
	}
	return j, nil
}

func get(lookup envconf.Lookup, name string) string {
	v, _ := lookup(name)
	return v
}

// Lead leads the job's federation from this process, which must be rank
// 0: Lead on the job's address with its options and then opts, and Await
// its clients. On failure everything it started is closed.
func (j Job) Lead(ctx context.Context, init []float32, opts ...Option) (*Leader, error) {
	if j.Rank != 0 {
		return nil, fmt.Errorf("fed: %w: rank %d is a client; rank 0 leads", ErrInvalidArgument, j.Rank)
	}
	l, err := Lead(ctx, j.Addr, j.World, init, append(append([]Option(nil), j.Options...), opts...)...)
	if err != nil {
		return nil, err
	}
	if err := l.Await(ctx); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// Join joins the job's federation from this process, a rank other than 0,
// with the job's options and then opts.
func (j Job) Join(ctx context.Context, opts ...Option) (*Client, error) {
	if j.Rank == 0 {
		return nil, fmt.Errorf("fed: %w: rank 0 leads the federation (Job.Lead)", ErrInvalidArgument)
	}
	return Join(ctx, j.Addr, j.Rank, j.World, append(append([]Option(nil), j.Options...), opts...)...)
}
