package dist

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/gdist/gdist/dist/transport"
)

// Reserved tags. Every collective's messages travel on tagColl: a peer's
// messages arrive in order, collectives run in order, and each message
// carries its collective's sequence number and fingerprint, so one tag is
// enough and a rank that called something else is detected at the first
// message it sends to a rank that disagrees.
const (
	tagColl     = TagReservedBase + iota // collective payloads
	tagAbort                             // "the group is aborted, here is why"
	tagFedUp                             // FederatedAverage: vector to the leader
	tagFedDown                           // FederatedAverage: average from the leader
	tagProgress                          // "this is where I am" (progress.go)
)

// abortSendTimeout bounds how long a rank tries to tell a peer about an abort.
const abortSendTimeout = 5 * time.Second

// ProcessGroup is one rank's view of a job: its rank, the world size, and the
// collectives and point-to-point messages it exchanges with the other ranks
// over a Transport.
//
// A ProcessGroup is safe for concurrent use. Collectives (sync and async) run
// one at a time in the order they were called; point-to-point calls are
// independent of them.
type ProcessGroup struct {
	t         transport.Transport
	rank      int
	world     int
	localRank int
	cfg       config
	log       *slog.Logger
	obs       observability // timeline and metrics; off by default

	done    chan struct{} // closed by Close
	abortCh chan struct{} // closed when the group is aborted (cause set)
	wake    chan struct{} // capacity 1: "async work was queued"
	gctx    context.Context
	gcancel context.CancelFunc
	// failCtx ends when the group fails or closes (with abortCh):
	// point-to-point calls are woken by it.
	failCtx    context.Context
	failCancel context.CancelFunc
	wg         sync.WaitGroup // worker, abort watchers, abort senders
	sending    sync.WaitGroup // abort senders (Close lets them finish first)
	// watchDone[p] is closed when the abort watcher of peer p returns: an
	// abort message p sent before leaving has been handled by then.
	watchDone []chan struct{}
	prog      progress // where this rank and its peers are (progress.go)

	mu     sync.Mutex
	closed bool
	cause  error       // first failure, as the operation that found it reports it
	abort  *AbortError // the same failure as the peers are told about it
	// transportClosing: Close is closing the transport; no more notices.
	transportClosing bool
	causeSeq         uint64 // collective running when cause was set (0: none)
	next             uint64 // next collective sequence number to hand out
	serving          uint64 // sequence number allowed to run
	waiters          []turnWaiter
	abandoned        map[uint64]struct{}
	queue            []*Work
	running          bool
	cur              opState
	runCtx           context.Context
	watched          context.Context // the context onCancel is registered on
	unwatch          func() bool     // unregisters it

	// Owned by the running collective.
	octx       opCtx
	timer      *time.Timer
	onCancelFn func()
	fed        fedState
	partial    []byte // partial results of reduce_scatter and reduce (algorithms.go)

	// hier is the plan of the hierarchical collectives (hier.go); nil
	// when they run flat. Set in New, read-only afterwards.
	hier *hierPlan
}

// New returns the ProcessGroup of t's rank. On success the group owns t and
// closes it in Close; on error the caller keeps it. Every rank of the job
// calls New with its own transport.
func New(t transport.Transport, opts ...Option) (*ProcessGroup, error) {
	if !littleEndian {
		return nil, ErrBigEndian
	}
	if t == nil {
		return nil, fmt.Errorf("dist: %w: nil transport", ErrInvalidArgument)
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	world, rank := t.WorldSize(), t.Rank()
	if world < 1 || world > MaxWorldSize {
		return nil, fmt.Errorf("dist: %w: world size %d not in [1, %d]", ErrInvalidArgument, world, MaxWorldSize)
	}
	if err := transport.CheckRank(rank, world); err != nil {
		return nil, err
	}
	hier, err := topologyPlan(t, &cfg, world, rank)
	if err != nil {
		return nil, err
	}
	localRank := rank
	if cfg.localRank >= 0 {
		localRank = cfg.localRank
	}
	g := &ProcessGroup{
		t:         t,
		rank:      rank,
		world:     world,
		localRank: localRank,
		cfg:       cfg,
		log:       cfg.logger.With("rank", rank),
		done:      make(chan struct{}),
		abortCh:   make(chan struct{}),
		wake:      make(chan struct{}, 1),
		next:      1,
		serving:   1,
		hier:      hier,
	}
	if err := g.startObservability(&cfg); err != nil {
		return nil, err
	}
	g.gctx, g.gcancel = context.WithCancel(context.Background())
	g.failCtx, g.failCancel = context.WithCancel(context.Background())
	g.octx.g = g
	g.onCancelFn = g.onCancel
	g.timer = time.AfterFunc(time.Hour, g.onTimer)
	g.timer.Stop()
	g.wg.Add(1)
	go g.worker()
	g.watchDone = make([]chan struct{}, world)
	for p := range world {
		if p != rank {
			g.watchDone[p] = make(chan struct{})
			g.wg.Add(1)
			go g.watch(p, g.watchDone[p])
		}
	}
	g.startProgress()
	return g, nil
}

// Rank returns this process's rank in [0, WorldSize).
func (g *ProcessGroup) Rank() int { return g.rank }

// WorldSize returns the number of ranks in the job.
func (g *ProcessGroup) WorldSize() int { return g.world }

// LocalRank returns this process's rank among the ranks on its host, as
// WithLocalRank set it (gdist.InitFromEnv passes the launcher's LOCAL_RANK
// or its Open MPI and Slurm equivalents), and Rank otherwise.
func (g *ProcessGroup) LocalRank() int { return g.localRank }

// IsLeader reports whether this is rank 0, the lowest rank.
func (g *ProcessGroup) IsLeader() bool { return g.rank == 0 }

// Transport returns the transport the group runs on. Messages sent on it
// directly must use tags below TagReservedBase.
func (g *ProcessGroup) Transport() transport.Transport { return g.t }

// Close shuts the group down: collectives that are running or queued fail
// with an error matching ErrClosed, the transport is closed, and Close waits
// for the goroutines the group owns. Close of a failed group carries the
// cause: the abort notice goes out on every link before the transport's
// goodbye (each send bounded by 5 s), so peers learn why this rank left
// rather than only that it did. It is idempotent (later calls return
// nil); every other method except Rank, WorldSize, LocalRank, IsLeader and
// Transport returns an error matching ErrClosed afterwards.
func (g *ProcessGroup) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	close(g.done)
	if g.cause == nil {
		g.setCauseLocked(nil, fmt.Errorf("dist: group closed: %w", ErrClosed))
	}
	if g.unwatch != nil {
		g.unwatch()
		g.watched, g.unwatch = nil, nil
	}
	g.mu.Unlock()
	// The abort notice still being sent tells the peers why this rank
	// failed: it goes out on every link before the transport's goodbye
	// does, so that no peer sees this rank leave without the reason. Each
	// send is bounded by abortSendTimeout.
	g.sending.Wait()
	g.mu.Lock()
	g.transportClosing = true
	g.mu.Unlock()
	g.sending.Wait() // one that started while the lock was free
	g.gcancel()
	err := g.t.Close()
	g.wg.Wait()
	g.timer.Stop()
	g.failCancel()
	return errors.Join(err, g.stopObservability())
}

func (g *ProcessGroup) isClosed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
}
