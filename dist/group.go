package dist

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gdist/gdist/dist/internal/coll"
	"github.com/gdist/gdist/dist/transport"
)

// Reserved tags. Group g's messages use the block of tagsPerGroup tags
// from TagReservedBase + tagsPerGroup*g.id: every collective's messages on
// its first tag (a peer's messages arrive in order, collectives of one
// group run in order, and each message carries its collective's sequence
// number and fingerprint, so one tag per group is enough), federated
// averaging on two more. The whole job's group (id 0) also carries the
// failure domain's abort notices and progress reports.
const (
	tagColl     = iota // collective payloads
	tagAbort           // "the job is aborted, here is why" (group 0)
	tagFedUp           // FederatedAverage: vector to the leader
	tagFedDown         // FederatedAverage: average from the leader
	tagProgress        // "this is where I am" (group 0; progress.go)

	tagsPerGroup = 8
	// maxGroups bounds the groups a job creates over its life: the
	// reserved tag range holds tagsPerGroup tags for each.
	maxGroups = (1<<32 - int(TagReservedBase)) / tagsPerGroup
)

// abortSendTimeout bounds how long a rank tries to tell a peer about an abort.
const abortSendTimeout = 5 * time.Second

// ProcessGroup is one rank's view of a group of ranks: the whole job (New,
// gdist.InitFromEnv) or a subgroup of it (NewGroup, Split, NewMesh). It
// gives the rank's number in the group, the group's size, the collectives
// over the group's members and point-to-point messages between them.
//
// A subgroup is a view of its parent: it uses the job's connections (it
// opens none), and has its own sequence numbers, fingerprints and tags, so
// collectives on disjoint subgroups run at the same time and a desync
// within one is caught as in the job's group. Every group of a job shares
// one failure domain: a failure anywhere (a lost rank, a desync, a
// timeout, an Abort) fails every group, and the errors name the culprit by
// its rank in the job.
//
// A ProcessGroup is safe for concurrent use. Collectives of one group (sync
// and async) run one at a time in the order they were called; collectives
// of different groups and point-to-point calls are independent.
type ProcessGroup struct {
	d     *domain
	id    uint32 // 0: the job's group
	name  string
	ranks []int // ranks[i] is member i's rank in the job; nil: the job's group
	rank  int   // this rank's member index
	size  int
	tag   uint32               // first tag of the group's block
	ops   [len(opNames)]string // opName of every kind, made once
	lane  string               // the timeline lane of its collectives
	net   coll.Net
	ex    exchange

	done chan struct{} // closed when the group is closed (or the job's group is)
	shut atomic.Bool   // set before done is closed
	// stop is closed when the domain fails or the group closes: the
	// running collective's context (opCtx) ends with it.
	stop chan struct{}
	wake chan struct{} // capacity 1: "async work was queued"
	wg   sync.WaitGroup

	// Guarded by d.mu.
	closed     bool
	stopped    bool
	workerOn   bool
	causeSeq   uint64 // collective running when the domain's cause was set (0: none)
	next       uint64 // next collective sequence number to hand out
	serving    uint64 // sequence number allowed to run
	waiters    []turnWaiter
	abandoned  map[uint64]struct{}
	queue      []*Work
	running    bool
	cur        opState
	runCtx     context.Context
	watched    context.Context // the context onCancel is registered on
	unwatch    func() bool     // unregisters it
	stallCount int64           // stall reports logged for the running collective
	prog       progress        // where this rank and the members are (progress.go)

	// Owned by the running collective.
	octx       opCtx
	timer      *time.Timer
	onCancelFn func()
	fed        fedState
}

// domain is what every group of a job shares: the transport, the one
// failure domain (its cause, the abort notices), observability and the
// registry of groups. One mutex guards it and the mutable state of every
// group: collectives take it a few times each, so groups running at once
// barely contend.
type domain struct {
	t         transport.Transport
	rank      int
	world     int
	localRank int
	cfg       config
	log       *slog.Logger
	obs       observability
	hosts     []int // host of every rank (transport.Topology); nil: unknown

	done    chan struct{} // closed by Close of the job's group
	abortCh chan struct{} // closed when the job is aborted (cause set)
	down    atomic.Bool   // set before done or abortCh is closed: one load for the calls that ask at every call
	gctx    context.Context
	gcancel context.CancelFunc
	// failCtx ends when the job fails or closes (with abortCh):
	// point-to-point calls are woken by it.
	failCtx    context.Context
	failCancel context.CancelFunc
	joins      p2pJoins       // point-to-point calls' contexts joined with failCtx (p2pctx.go)
	wg         sync.WaitGroup // abort watchers, abort senders, progress
	sending    sync.WaitGroup // abort senders (Close lets them finish first)
	// watchDone[p] is closed when the abort watcher of peer p returns: an
	// abort message p sent before leaving has been handled by then.
	watchDone []chan struct{}

	mu     sync.Mutex
	closed bool
	cause  error       // first failure, as the operation that found it reports it
	abort  *AbortError // the same failure as the peers are told about it
	// transportClosing: Close is closing the transport; no more notices.
	transportClosing bool
	groups           map[uint32]*ProcessGroup // open groups, by id
	nextID           uint32                   // lowest group id this rank has not seen used
}

// New returns the group of the whole job for t's rank. On success the
// group owns t and closes it in Close; on error the caller keeps it. Every
// rank of the job calls New with its own transport.
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
	d := &domain{
		t:         t,
		rank:      rank,
		world:     world,
		localRank: rank,
		cfg:       cfg,
		log:       cfg.logger.With("rank", rank),
		done:      make(chan struct{}),
		abortCh:   make(chan struct{}),
		groups:    make(map[uint32]*ProcessGroup),
		nextID:    1,
	}
	if cfg.localRank >= 0 {
		d.localRank = cfg.localRank
	}
	hosts, err := topology(t, &cfg, world)
	if err != nil {
		return nil, err
	}
	d.hosts = hosts
	if err := d.startObservability(&cfg); err != nil {
		return nil, err
	}
	d.gctx, d.gcancel = context.WithCancel(context.Background())
	d.failCtx, d.failCancel = context.WithCancel(context.Background())
	g := d.newGroup(0, "world", nil, rank, world)
	d.watchDone = make([]chan struct{}, world)
	for p := range world {
		if p != rank {
			d.watchDone[p] = make(chan struct{})
			d.wg.Add(1)
			go d.watch(p, d.watchDone[p])
		}
	}
	d.startProgress()
	return g, nil
}

// newGroup makes and registers the group id of the members ranks (nil:
// the whole job) in which this rank is member me of n.
func (d *domain) newGroup(id uint32, name string, ranks []int, me, n int) *ProcessGroup {
	g := &ProcessGroup{
		d:       d,
		id:      id,
		name:    name,
		ranks:   ranks,
		rank:    me,
		size:    n,
		tag:     TagReservedBase + uint32(id)*tagsPerGroup,
		done:    make(chan struct{}),
		stop:    make(chan struct{}),
		wake:    make(chan struct{}, 1),
		next:    1,
		serving: 1,
	}
	g.ex.g = g
	g.lane = "collectives"
	if id != 0 {
		g.lane += " on " + name
	}
	for k := range g.ops {
		g.ops[k] = opKind(k).String()
		if id != 0 {
			g.ops[k] += " on " + name
		}
	}
	g.net = coll.Net{Ex: &g.ex, Segment: d.cfg.segment, Small: d.cfg.small, SmallPair: d.cfg.smallPair,
		PairSegment: d.pairSegment(ranks, n), Hier: d.plan(ranks, me, n)}
	g.octx.g = g
	g.onCancelFn = g.onCancel
	g.timer = time.AfterFunc(time.Hour, g.onTimer)
	g.timer.Stop()
	g.prog.peers = make([]peerMarks, n)
	d.mu.Lock()
	d.groups[id] = g
	if d.cause != nil {
		g.stopLocked()
	}
	d.mu.Unlock()
	return g
}

// Rank returns this process's rank in the group, in [0, WorldSize).
func (g *ProcessGroup) Rank() int { return g.rank }

// WorldSize returns the number of ranks in the group.
func (g *ProcessGroup) WorldSize() int { return g.size }

// LocalRank returns this process's rank among the ranks on its host, as
// WithLocalRank set it (gdist.InitFromEnv passes the launcher's LOCAL_RANK
// or its Open MPI and Slurm equivalents), and its rank in the job
// otherwise.
func (g *ProcessGroup) LocalRank() int { return g.d.localRank }

// Name returns the group's name: "world" for the whole job, the dimension
// for a mesh's groups ("dp"), "group N" for the others.
func (g *ProcessGroup) Name() string { return g.name }

// Ranks returns the job ranks of the group's members in member order:
// member i is rank Ranks()[i] of the job (Rank and WorldSize of the group
// made by New or gdist.InitFromEnv). The caller owns the slice.
func (g *ProcessGroup) Ranks() []int {
	out := make([]int, g.size)
	for i := range out {
		out[i] = g.global(i)
	}
	return out
}

// global returns the job rank of member i.
func (g *ProcessGroup) global(i int) int {
	if g.ranks == nil {
		return i
	}
	return g.ranks[i]
}

// member returns the member index of job rank r, or -1.
func (g *ProcessGroup) member(r int) int {
	if g.ranks == nil {
		if r >= 0 && r < g.size {
			return r
		}
		return -1
	}
	for i, x := range g.ranks {
		if x == r {
			return i
		}
	}
	return -1
}

// Transport returns the transport the job runs on. Messages sent on it
// directly must use tags below TagReservedBase, and address ranks of the
// job (Ranks maps a group's members to them).
func (g *ProcessGroup) Transport() transport.Transport { return g.d.t }

// Close shuts the group down: its collectives that are running or queued
// fail with an error matching ErrClosed, and Close waits for the
// goroutines the group owns. Closing a subgroup leaves its parent and the
// job's other groups open (members still in a collective on it then wait
// for this rank until their timeout). Closing the job's group (the one New
// or gdist.InitFromEnv returned) closes every group of the job and the
// transport; if the job had failed, the abort notice goes out on every
// link before the transport's goodbye (each send bounded by 5 s), so peers
// learn why this rank left rather than only that it did. Close is
// idempotent (later calls return nil); every other method except Rank,
// WorldSize, LocalRank, Name, Ranks and Transport returns an error
// matching ErrClosed afterwards.
func (g *ProcessGroup) Close() error {
	if g.id != 0 {
		g.d.mu.Lock()
		if g.closed {
			g.d.mu.Unlock()
			return nil
		}
		g.closeLocked()
		g.d.mu.Unlock()
		g.wg.Wait()
		g.timer.Stop()
		return nil
	}
	d := g.d
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.down.Store(true)
	close(d.done)
	if d.cause == nil {
		d.setCauseLocked(nil, fmt.Errorf("dist: group closed: %w", ErrClosed))
	}
	groups := make([]*ProcessGroup, 0, len(d.groups))
	for _, x := range d.groups {
		x.closeLocked()
		groups = append(groups, x)
	}
	d.mu.Unlock()
	// The abort notice still being sent tells the peers why this rank
	// failed: it goes out on every link before the transport's goodbye
	// does, so that no peer sees this rank leave without the reason. Each
	// send is bounded by abortSendTimeout.
	d.sending.Wait()
	d.mu.Lock()
	d.transportClosing = true
	d.mu.Unlock()
	d.sending.Wait() // one that started while the lock was free
	d.gcancel()
	err := d.t.Close()
	d.wg.Wait()
	for _, x := range groups {
		x.wg.Wait()
		x.timer.Stop()
	}
	d.failCancel()
	d.joins.close()
	return errors.Join(err, d.stopObservability())
}

// closeLocked marks g closed, wakes whatever waits in it and unregisters
// it. d.mu is held.
func (g *ProcessGroup) closeLocked() {
	if g.closed {
		return
	}
	g.closed = true
	g.shut.Store(true)
	close(g.done)
	g.stopLocked()
	if g.unwatch != nil {
		g.unwatch()
		g.watched, g.unwatch = nil, nil
	}
	delete(g.d.groups, g.id)
}

// stopLocked ends the running collective's context. d.mu is held.
func (g *ProcessGroup) stopLocked() {
	if !g.stopped {
		g.stopped = true
		close(g.stop)
	}
}

func (g *ProcessGroup) isClosed() bool {
	// done channels are closed when closed is set. A receive with a
	// default case on one channel looks at it without locking it (a select
	// over two would lock both): point-to-point calls ask at every call.
	select {
	case <-g.done:
		return true
	default:
	}
	select {
	case <-g.d.done:
		return true
	default:
		return false
	}
}

// opName names operation kind on g: the bare name on the job's group,
// "all_reduce on dp" on a subgroup.
func (g *ProcessGroup) opName(k opKind) string {
	if int(k) < len(g.ops) {
		return g.ops[k]
	}
	return k.String()
}

// comm is the group as the algorithms see it.
func (g *ProcessGroup) comm() coll.Comm { return coll.World(g.size, g.rank) }
