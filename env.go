package gdist

import (
	"crypto/tls"
	"fmt"
	"strconv"
	"time"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/metrics"
	"github.com/gdist/gdist/dist/transport/hybrid"
	"github.com/gdist/gdist/dist/transport/tcp"
	"github.com/gdist/gdist/internal/envconf"
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
	EnvTransport  = "GDIST_TRANSPORT"   // auto (default), tcp or shm: see InitFromEnv
	EnvHostID     = "GDIST_HOST_ID"     // this rank's host identity, replacing the default (tests simulating hosts)
)

// Environment variables InitFromEnv reads to turn the group's observability
// on and to tell it about restarts.
const (
	EnvTimeline     = "GDIST_TIMELINE"      // path of the per-rank Chrome trace file (see dist.WithTimeline)
	EnvMetricsAddr  = "GDIST_METRICS_ADDR"  // host:port of the Prometheus endpoint; each rank serves on port + LOCAL_RANK (port 0: a free one), see metrics.RankAddr
	EnvRestartCount = "GDIST_RESTART_COUNT" // set by gdistrun -max-restarts; exported as gdist_restarts (dist.WithRestartCount)
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
	// EnvTLSCert, EnvTLSKey and EnvTLSCA: PEM files of this rank's
	// certificate chain, its private key and the CA certificates it trusts
	// for its peers. Set all three to run every TCP link over TLS 1.3 with
	// mutual authentication (tcp.WithTLS, tcp.LoadTLS); the certificate must
	// be valid for client and server authentication and for the address
	// its peers dial, unless EnvTLSServerName names the one name every
	// certificate carries.
	EnvTLSCert       = envconf.TLSCert
	EnvTLSKey        = envconf.TLSKey
	EnvTLSCA         = envconf.TLSCA
	EnvTLSServerName = envconf.TLSServerName
)

// groupEnvOptions returns the group options the environment asks for
// (GDIST_TIMELINE, GDIST_METRICS_ADDR, GDIST_RESTART_COUNT); InitFromEnv
// puts them before the caller's, which win. A malformed value is an error
// matching dist.ErrEnv that names the variable.
func groupEnvOptions(lookup func(string) (string, bool)) ([]dist.Option, error) {
	var opts []dist.Option
	if v, ok := lookup(EnvTimeline); ok && v != "" {
		opts = append(opts, dist.WithTimeline(v))
	}
	if addr, err := envMetricsAddr(lookup); err != nil {
		return nil, err
	} else if addr != "" {
		opts = append(opts, dist.WithMetricsAddr(addr))
	}
	if v, ok := lookup(EnvRestartCount); ok && v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%w: %s=%q is not a count", dist.ErrEnv, EnvRestartCount, v)
		}
		opts = append(opts, dist.WithRestartCount(n))
	}
	return opts, nil
}

// envMetricsAddr returns GDIST_METRICS_ADDR with its port moved by the
// launcher's local rank (metrics.RankAddr), so that the ranks of one host
// do not collide, or "" if it is not set. A malformed address is an error
// matching dist.ErrEnv that names the variable.
func envMetricsAddr(lookup func(string) (string, bool)) (string, error) {
	v, ok := lookup(EnvMetricsAddr)
	if !ok || v == "" {
		return "", nil
	}
	job, _ := launchenv.FromEnv(lookup) // its errors are InitFromEnv's to report
	addr, err := metrics.RankAddr(v, job.LocalRank)
	if err != nil {
		return "", fmt.Errorf("%w: %s: %w", dist.ErrEnv, EnvMetricsAddr, err)
	}
	return addr, nil
}

// tcpEnvOptions returns the TCP transport options the environment asks
// for (GDIST_HEARTBEAT_TIMEOUT, GDIST_HEARTBEAT_INTERVAL,
// GDIST_INIT_TIMEOUT, GDIST_MAX_FRAME, GDIST_SOCKET_BUFFER). A malformed
// value is an error matching dist.ErrEnv that names the variable.
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
// is an error matching dist.ErrEnv that names the variable.
func hybridEnvOptions(lookup func(string) (string, bool)) ([]hybrid.Option, error) {
	var opts []hybrid.Option
	if v, ok := lookup(EnvTransport); ok && v != "" {
		m, err := hybrid.ParseMode(v)
		if err != nil {
			return nil, fmt.Errorf("%w: %s=%q is not auto, tcp or shm", dist.ErrEnv, EnvTransport, v)
		}
		opts = append(opts, hybrid.WithMode(m))
	}
	if v, ok := lookup(EnvHostID); ok && v != "" {
		if len(v) > hybrid.MaxHostID {
			return nil, fmt.Errorf("%w: %s has %d bytes, at most %d", dist.ErrEnv, EnvHostID, len(v), hybrid.MaxHostID)
		}
		opts = append(opts, hybrid.WithHostID(v))
	}
	return opts, nil
}

// envHeartbeat returns the heartbeat GDIST_HEARTBEAT_TIMEOUT and
// GDIST_HEARTBEAT_INTERVAL ask for: ok is false when neither is set;
// interval is 0 (derived by the transport) unless set.
func envHeartbeat(lookup func(string) (string, bool)) (interval, timeout time.Duration, ok bool, err error) {
	interval, timeout, ok, err = envconf.Heartbeat(lookup, tcp.DefaultHeartbeatTimeout)
	return interval, timeout, ok, envErr(err)
}

// envDuration parses the positive duration in variable name, if set.
func envDuration(lookup func(string) (string, bool), name string) (time.Duration, bool, error) {
	d, ok, err := envconf.Duration(lookup, name)
	return d, ok, envErr(err)
}

// envSize parses the positive byte count in variable name, if set.
func envSize(lookup func(string) (string, bool), name string) (int, bool, error) {
	n, ok, err := envconf.Size(lookup, name)
	return n, ok, envErr(err)
}

// envTLS returns the TLS configuration GDIST_TLS_CERT, GDIST_TLS_KEY,
// GDIST_TLS_CA and GDIST_TLS_SERVER_NAME ask for, or nil when none is set.
// Files that cannot be loaded give an error matching dist.ErrEnv that names
// them.
func envTLS(lookup func(string) (string, bool)) (*tls.Config, error) {
	f, ok, err := envconf.TLS(lookup)
	if err != nil || !ok {
		return nil, envErr(err)
	}
	cfg, err := tcp.LoadTLS(f.Cert, f.Key, f.CA, f.ServerName)
	if err != nil {
		return nil, fmt.Errorf("%w: %s, %s, %s: %w", dist.ErrEnv, EnvTLSCert, EnvTLSKey, EnvTLSCA, err)
	}
	return cfg, nil
}

// envErr wraps a malformed variable's error with dist.ErrEnv.
func envErr(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", dist.ErrEnv, err)
}
