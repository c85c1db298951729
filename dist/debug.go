package dist

// Debug mode. WithDebug (or GDIST_DEBUG) turns on the group's log output
// to stderr and, at DebugDetail, adds each collective's call site to its
// fingerprint: ranks that reach the same collective (same op, dtype,
// count, root, position) from different lines of code then fail at that
// call with a *DesyncError naming both call sites, where without it they
// would silently combine unrelated data.

import (
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/gdist/gdist/internal/logx"
)

// DebugLevel selects the debug output of a group (WithDebug, GDIST_DEBUG).
type DebugLevel uint8

// Debug levels.
const (
	DebugOff    DebugLevel = iota // no log output unless WithLogger (the default)
	DebugInfo                     // log aborts and stall reports to stderr at INFO and above
	DebugDebug                    // log to stderr at DEBUG and above
	DebugDetail                   // DebugDebug, and every collective's call site is part of its fingerprint
)

var debugNames = [...]string{DebugOff: "off", DebugInfo: "info", DebugDebug: "debug", DebugDetail: "detail"}

// String returns "off", "info", "debug" or "detail".
func (l DebugLevel) String() string {
	if int(l) < len(debugNames) {
		return debugNames[l]
	}
	return fmt.Sprintf("debug_level(%d)", uint8(l))
}

// ParseDebugLevel parses a GDIST_DEBUG value: "", "off", "info", "debug"
// or "detail" (case-insensitive).
func ParseDebugLevel(s string) (DebugLevel, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "off", "0":
		return DebugOff, nil
	case "info":
		return DebugInfo, nil
	case "debug":
		return DebugDebug, nil
	case "detail":
		return DebugDetail, nil
	}
	return 0, fmt.Errorf("dist: %w: debug level %q (want off, info, debug or detail)", ErrInvalidArgument, s)
}

// Environment variables New reads (options override them).
const (
	EnvDebug          = "GDIST_DEBUG"
	EnvStallThreshold = "GDIST_STALL_THRESHOLD"
	// EnvLogFormat selects the format of everything gdist logs to stderr
	// (its default loggers, debug output, stall reports, the transports'
	// warnings): "text" (slog's text handler, the default) or "json"
	// (slog's JSON handler, one object per line). gdistrun -log-format
	// sets it for the ranks.
	EnvLogFormat = logx.EnvFormat
)

// envConfig applies GDIST_DEBUG and GDIST_STALL_THRESHOLD to c and checks
// GDIST_LOG_FORMAT.
func envConfig(c *config) error {
	if _, err := logx.EnvFormatValue(); err != nil {
		return fmt.Errorf("%w: %w", ErrEnv, err)
	}
	if v, ok := os.LookupEnv(EnvDebug); ok {
		l, err := ParseDebugLevel(v)
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrEnv, EnvDebug, err)
		}
		c.debug = l
	}
	if v, ok := os.LookupEnv(EnvStallThreshold); ok && v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return fmt.Errorf("%w: %s=%q: want a non-negative Go duration such as 60s", ErrEnv, EnvStallThreshold, v)
		}
		c.stall = d
	}
	return nil
}

// finishLogging picks the group's loggers once the options are applied:
// with a debug level and no WithLogger, the group logs to stderr. Stall
// reports always go somewhere: to the group's logger if one was set or a
// debug level is on, else to stderr at WARN.
func finishLogging(c *config) {
	if !c.loggerSet && c.debug != DebugOff {
		level := slog.LevelInfo
		if c.debug >= DebugDebug {
			level = slog.LevelDebug
		}
		c.logger = logx.FromEnv(os.Stderr, level)
	}
	c.stallLog = c.logger
	if !c.loggerSet && c.debug == DebugOff {
		c.stallLog = logx.FromEnv(os.Stderr, slog.LevelWarn)
	}
}

// distDir is the directory of this package's source files: frames there are
// not the user's call site.
var distDir = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(file)
}()

// sites caches, per program counter, whether it is in package dist and
// otherwise its call-site hash, and maps hashes to "file:line", so that a
// rank can name a peer's call site if it ran that line itself (the peers
// run the same program).
var sites struct {
	mu     sync.Mutex
	byPC   map[uintptr]uint32 // 0: a frame of package dist
	byHash map[uint32]string
}

// callSite returns the hash of the first caller outside package dist (0
// when the group is not in detail mode). After the first call from a
// line it costs one runtime.Callers and a few map lookups, and allocates
// nothing.
func (g *ProcessGroup) callSite() uint32 {
	if g.d.cfg.debug < DebugDetail {
		return 0
	}
	var pcs [12]uintptr
	n := runtime.Callers(2, pcs[:])
	sites.mu.Lock()
	defer sites.mu.Unlock()
	for _, pc := range pcs[:n] {
		h, ok := sites.byPC[pc]
		if !ok {
			h = resolveLocked(pc)
		}
		if h != 0 {
			return h
		}
	}
	return 0
}

// resolveLocked computes and caches the entry of pc.
func resolveLocked(pc uintptr) uint32 {
	if sites.byPC == nil {
		sites.byPC, sites.byHash = make(map[uintptr]uint32), make(map[uint32]string)
	}
	var h uint32
	if f := runtime.FuncForPC(pc - 1); f != nil {
		file, line := f.FileLine(pc - 1)
		if filepath.Dir(file) != distDir || strings.HasSuffix(file, "_test.go") {
			name := fmt.Sprintf("%s:%d", file, line)
			fh := fnv.New32a()
			fh.Write([]byte(name))
			h = fh.Sum32() | 1 // never 0, which means "package dist"
			sites.byHash[h] = name
		}
	}
	sites.byPC[pc] = h
	return h
}

// siteName returns the "file:line" of a site hash, or a placeholder if this
// process never ran it.
func siteName(h uint32) string {
	if h == 0 {
		return ""
	}
	sites.mu.Lock()
	defer sites.mu.Unlock()
	if s, ok := sites.byHash[h]; ok {
		return s
	}
	return fmt.Sprintf("call site %08x (not run on this rank)", h)
}

// wireSeq is the sequence field of a collective message's header: the
// sequence number, and in detail mode the call-site hash in the top 32
// bits (the sequence number's low 32 bits are compared then).
func wireSeq(seq uint64, site uint32) uint64 {
	if site == 0 {
		return seq
	}
	return seq&(1<<32-1) | uint64(site)<<32
}

// desync returns the *DesyncError for a message from job rank from whose
// header disagrees with g's running collective.
func (g *ProcessGroup) desync(from int, wire, fp uint64) *DesyncError {
	e := &DesyncError{Rank: g.d.rank, Peer: from, Seq: g.cur.seq, PeerSeq: wire,
		Local: describe(g.cur.fp), Remote: describe(fp)}
	if g.d.cfg.debug >= DebugDetail {
		// The peer's sequence number is known modulo 2^32: take the one
		// nearest ours.
		low := wire & (1<<32 - 1)
		e.PeerSeq = g.cur.seq&^(1<<32-1) | low
		e.LocalSite, e.RemoteSite = siteName(g.cur.site), siteName(uint32(wire>>32))
	}
	return e
}
