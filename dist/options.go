package dist

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/gdist/gdist/internal/options"
)

// DefaultTimeout is the per-collective timeout applied when the caller's
// context has no deadline (torch.distributed's default is also 30 minutes).
const DefaultTimeout = 30 * time.Minute

// DefaultSmallThreshold is the message size, in bytes, below which AllReduce
// uses recursive doubling (latency-optimal: about log2(n) rounds, each moving
// the whole vector) instead of the ring (bandwidth-optimal: 2(n-1) rounds
// moving 2(n-1)/n of the vector in all). Broadcast and Reduce switch from a
// binomial tree to a pipelined chain at the same size.
//
// It was measured on the project's 2-core development machine with
// bench/collectives: ranks as OS processes (GOMAXPROCS=1 each) over the TCP
// transport on loopback, all_reduce of float32, median of 3 runs of 60
// iterations, -small 1G forcing recursive doubling (rd) and -small 0 the
// ring. Time per all-reduce in microseconds, rd / ring:
//
//	size      n=2          n=3          n=4
//	1 KiB     22 / 53     105 / 154    186 / 264
//	16 KiB    29 / 58      99 / 184    162 / 284
//	32 KiB    37 / 67     123 / 186    218 / 330
//	64 KiB    58 / 78     271 / 234    325 / 362
//	128 KiB   89 / 122    217 / 267    448 / 405
//	256 KiB  137 / 185    332 / 400    706 / 639
//	512 KiB  222 / 282    597 / 624   1264 / 858
//	1 MiB    783 / 750   1291 / 1009  2805 / 1907
//
// With 4 ranks the ring wins from 128 KiB on. With 2 ranks both algorithms
// move the same bytes (the ring in twice as many steps), and with 3 recursive
// doubling moves barely more, so it stays ahead until about 1 MiB; 128 KiB
// costs them up to a quarter between 128 KiB and 1 MiB, and is right for the
// larger worlds that matter more. (In-process, go test -bench AllReduceAlgo
// puts the crossover at 16 KiB on the in-process transport and between 64
// and 128 KiB on TCP with the ranks as goroutines.) Use WithSmallThreshold to
// tune it for another network.
const DefaultSmallThreshold = 128 << 10

// DefaultPairThreshold is DefaultSmallThreshold for an all-reduce between
// 2 ranks. There both algorithms move the same bytes, and recursive
// doubling in one exchange, against the ring's reduce-scatter and
// all-gather, was as fast or faster up to 8 MiB with 2 OS-process ranks
// (GOMAXPROCS=1) on the development machine, medians of paired runs at a
// load of 9-11 (2026-12-01). Busbw recursive doubling / ring, over shared
// memory (bench/peers -small, 6-8 pairs) and over TCP (bench/collectives
// -small, 4 pairs):
//
//	size     shm     tcp
//	256 KiB  0.97x   0.94x
//	1 MiB    1.07x   1.37x
//	2 MiB    1.12x
//	4 MiB    1.39x   1.69x
//	8 MiB    1.07x
//	16 MiB   1.10x   0.92x
//
// WithSmallThreshold sets both.
const DefaultPairThreshold = 8 << 20

// defaultSegment is the largest message the pipelined algorithms (ring,
// chain) send: big chunks are cut into segments so that reduction overlaps
// with transfer and no message approaches a transport's frame limit. Every
// segment costs a wake-up of the sending and the receiving goroutine, which
// on a busy machine (backprop holding every core) waits for a CPU; 4 MiB
// rather than 1 MiB took the exposed communication of bench/ddp's overlap
// run from 0.50-0.57 to 0.19-0.24 of the non-overlapped one, and left the
// 4-64 MiB collectives of bench/collectives as fast or faster (2 and 4
// ranks over TCP, paired runs).
const defaultSegment = 4 << 20

// defaultPairSegment is the segment of the all-reduce between 2 members on
// one host (coll.Net.PairSegment), from DefaultSmallThreshold up. It
// replaces recursive doubling (and the ring from DefaultPairThreshold):
// with 256 KiB segments, against recursive doubling, bench/peers measured
// 1.00x at 1 MiB, 1.22x at 4 MiB and 1.17x at 16 MiB (medians of 6
// alternated runs); 64 KiB segments were slower, 128 KiB the same.
const defaultPairSegment = 256 << 10

// Option configures New (and gdist.InitFromEnv, through
// gdist.WithGroupOptions). Each option checks its value when
// the constructor applies it, and the constructor fails with the first
// refusal: an error wrapping ErrInvalidArgument that names the option. A
// nil Option is refused the same way. Options not given keep their
// documented defaults.
type Option func(*config) error

type config struct {
	timeout     time.Duration
	small       int
	smallPair   int
	segment     int
	pairSegment int // 0: the 2-member all-reduce runs as between hosts
	logger      *slog.Logger
	loggerSet   bool

	timeline    string // WithTimeline
	metricsAddr string // WithMetricsAddr
	restarts    int    // WithRestartCount
	localRank   int    // WithLocalRank; -1: the rank

	// Failure reporting and debugging (failure.go, progress.go, debug.go).
	debug         DebugLevel    // WithDebug, GDIST_DEBUG
	stall         time.Duration // WithStallThreshold, GDIST_STALL_THRESHOLD; 0: off
	stallLog      *slog.Logger  // where stall reports go (finishLogging)
	progressEvery time.Duration // withProgressInterval

	hier bool // WithHierarchical, GDIST_HIERARCHICAL
}

func defaultConfig() config {
	return config{
		timeout:     DefaultTimeout,
		small:       DefaultSmallThreshold,
		smallPair:   DefaultPairThreshold,
		segment:     defaultSegment,
		pairSegment: defaultPairSegment,
		logger:      slog.New(slog.DiscardHandler),

		localRank: -1,

		stall:         DefaultStallThreshold,
		progressEvery: defaultProgressInterval,
		hier:          true,
	}
}

// CheckOptions returns the error New would return for opts, without a
// transport: the first option that refuses its value, or a malformed
// GDIST_DEBUG, GDIST_STALL_THRESHOLD or GDIST_HIERARCHICAL. Constructors
// that connect a transport before they call New (gdist.InitFromEnv) call it
// first, so that a bad option fails before the rendezvous.
func CheckOptions(opts ...Option) error {
	_, err := newConfig(opts)
	return err
}

// newConfig applies opts, in order, to the defaults.
func newConfig(opts []Option) (config, error) {
	cfg := defaultConfig()
	if err := envConfig(&cfg); err != nil {
		return config{}, err
	}
	if err := hierEnv(&cfg); err != nil {
		return config{}, err
	}
	if err := options.Apply(&cfg, opts, "dist", ErrInvalidArgument); err != nil {
		return config{}, err
	}
	finishLogging(&cfg)
	return cfg, nil
}

// invalidOption is the error of an option that refuses its value.
func invalidOption(format string, args ...any) error {
	return fmt.Errorf("dist: %w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}

// WithTimeout sets the timeout of a collective whose context has no
// deadline, sync or async. d must be positive; the default is
// DefaultTimeout. A collective that times out aborts the group.
func WithTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return invalidOption("WithTimeout(%v): must be positive", d)
		}
		c.timeout = d
		return nil
	}
}

// WithSmallThreshold sets the message size in bytes below which the
// latency-optimal algorithms are used (see DefaultSmallThreshold and
// DefaultPairThreshold; it sets both). 0 makes every message use the
// bandwidth-optimal ones. bytes must not be negative.
func WithSmallThreshold(bytes int) Option {
	return func(c *config) error {
		if bytes < 0 {
			return invalidOption("WithSmallThreshold(%d): must not be negative", bytes)
		}
		c.small, c.smallPair = bytes, bytes
		return nil
	}
}

// withSegment sets the pipelining segment size (tests and benchmarks).
func withSegment(bytes int) Option {
	return func(c *config) error {
		if bytes < 8 || bytes%8 != 0 {
			return invalidOption("withSegment(%d): must be a positive multiple of 8", bytes)
		}
		c.segment = bytes
		return nil
	}
}

// withPairSegment sets the segment of the all-reduce between 2 members on
// one host; 0 turns it off (tests and benchmarks).
func withPairSegment(bytes int) Option {
	return func(c *config) error {
		if bytes < 0 || bytes%8 != 0 {
			return invalidOption("withPairSegment(%d): must be 0 or a positive multiple of 8", bytes)
		}
		c.pairSegment = bytes
		return nil
	}
}

// WithLogger sets where the group logs aborts (desyncs, lost peers,
// timeouts). The default discards the group's messages. (gdist.WithLogger
// hands a logger to the group and to the transports gdist.InitFromEnv
// makes.) l must not be nil.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return invalidOption("WithLogger(nil)")
		}
		c.logger, c.loggerSet = l, true
		return nil
	}
}

// WithLocalRank sets what LocalRank reports: this process's rank among the
// ranks on its host, as the launcher numbered them (gdist.InitFromEnv sets
// it from LOCAL_RANK or its equivalents). n must not be negative; without
// it LocalRank is Rank.
func WithLocalRank(n int) Option {
	return func(c *config) error {
		if n < 0 {
			return invalidOption("WithLocalRank(%d): must not be negative", n)
		}
		c.localRank = n
		return nil
	}
}

// WithRestartCount tells the group how many times the launcher has
// restarted the job (gdist.InitFromEnv sets it from GDIST_RESTART_COUNT,
// which gdistrun -max-restarts sets). The metrics (WithMetricsAddr) export
// it as gdist_restarts. n must not be negative; the default is 0.
func WithRestartCount(n int) Option {
	return func(c *config) error {
		if n < 0 {
			return invalidOption("WithRestartCount(%d): must not be negative", n)
		}
		c.restarts = n
		return nil
	}
}

// Failure reporting and debugging options.

// WithStallThreshold sets how long a collective may wait before the group
// logs a stall report naming the ranks it waits for and where each of
// them is, and logs it again after each further d (default
// DefaultStallThreshold; also GDIST_STALL_THRESHOLD, a Go duration). 0
// turns the reports off; d must not be negative. Reports go to the
// group's logger (WithLogger, WithDebug) or, if neither is set, to stderr
// at WARN.
func WithStallThreshold(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return invalidOption("WithStallThreshold(%v): must not be negative", d)
		}
		c.stall = d
		return nil
	}
}

// WithDebug sets the group's debug level (default DebugOff, or
// GDIST_DEBUG). DebugInfo and DebugDebug log to stderr unless WithLogger
// is given; DebugDetail also adds each collective's call site to its
// fingerprint (see DebugDetail), which costs a runtime.Caller walk per
// collective. Every rank must use the same level.
func WithDebug(l DebugLevel) Option {
	return func(c *config) error {
		if l > DebugDetail {
			return invalidOption("WithDebug(%v): unknown level", l)
		}
		c.debug = l
		return nil
	}
}

// withProgressInterval sets how often a rank tells its peers where it is
// (tests).
func withProgressInterval(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return invalidOption("withProgressInterval(%v): must be positive", d)
		}
		c.progressEvery = d
		return nil
	}
}

// Hierarchical collectives.

// EnvHierarchical is the environment variable that turns the hierarchical
// collectives off ("0") or on ("1", the default) for New; WithHierarchical
// overrides it.
const EnvHierarchical = "GDIST_HIERARCHICAL"

// hierEnv applies GDIST_HIERARCHICAL to c.
func hierEnv(c *config) error {
	switch v := os.Getenv(EnvHierarchical); v {
	case "":
	case "1":
		c.hier = true
	case "0":
		c.hier = false
	default:
		return fmt.Errorf("%w: %s=%q: want 0 or 1", ErrEnv, EnvHierarchical, v)
	}
	return nil
}

// WithHierarchical turns the topology-aware collectives on or off (default
// on, or GDIST_HIERARCHICAL). When on and the transport reports which ranks
// share a host (transport.Topology) and the job spans several hosts, one of
// them at least with several ranks, AllReduce and Broadcast reduce or copy
// within each host first and cross hosts once per host: each host reduces
// to its lowest rank, those leaders all-reduce among themselves, and each
// copies the result to its host; a broadcast goes from the root to the
// other hosts' leaders and then within each host. Large vectors go through
// these phases block by block, so they overlap. Results stay bitwise
// identical on every rank (though not necessarily equal to the flat
// algorithms' in the last bit, the order of the additions being another),
// and desyncs and lost peers are reported as for the flat algorithms.
// Every rank must use the same setting: ranks that disagree fail their
// first all-reduce or broadcast with a *PeerError wrapping ErrProtocol.
func WithHierarchical(on bool) Option {
	return func(c *config) error {
		c.hier = on
		return nil
	}
}
