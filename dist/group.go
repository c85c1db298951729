package dist

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
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
	tagColl    = TagReservedBase + iota // collective payloads
	tagAbort                            // "the group is aborted, here is why"
	tagFedUp                            // FederatedAverage: vector to the leader
	tagFedDown                          // FederatedAverage: average from the leader
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

	done    chan struct{} // closed by Close
	abortCh chan struct{} // closed when the group is aborted (cause set)
	wake    chan struct{} // capacity 1: "async work was queued"
	gctx    context.Context
	gcancel context.CancelFunc
	wg      sync.WaitGroup // worker, abort watchers, abort senders
	sending sync.WaitGroup // abort senders (Close lets them finish first)
	// watchDone[p] is closed when the abort watcher of peer p returns: an
	// abort message p sent before leaving has been handled by then.
	watchDone []chan struct{}

	mu        sync.Mutex
	closed    bool
	cause     error  // first failure; later collectives fail with it
	causeSeq  uint64 // collective running when cause was set (0: none)
	next      uint64 // next collective sequence number to hand out
	serving   uint64 // sequence number allowed to run
	waiters   []turnWaiter
	abandoned map[uint64]struct{}
	queue     []*Work
	running   bool
	cur       opState
	runCtx    context.Context
	watched   context.Context // the context onCancel is registered on
	unwatch   func() bool     // unregisters it

	// Owned by the running collective.
	octx       opCtx
	timer      *time.Timer
	onCancelFn func()
	fed        fedState
}

type turnWaiter struct {
	seq uint64
	ch  chan struct{}
}

// opState describes the running collective.
type opState struct {
	seq  uint64
	fp   uint64
	kind opKind
}

// opCtx is the context the running collective hands to the transport: it is
// done when the group is aborted (which is also what the collective's
// timeout, the caller's cancellation and Close do), and otherwise carries the
// caller's values and the collective's deadline. One is reused for every
// collective, so running one allocates nothing.
type opCtx struct {
	g        *ProcessGroup
	parent   context.Context
	deadline time.Time
}

func (c *opCtx) Deadline() (time.Time, bool) { return c.deadline, true }
func (c *opCtx) Done() <-chan struct{}       { return c.g.abortCh }
func (c *opCtx) Err() error {
	select {
	case <-c.g.abortCh:
		return context.Canceled
	default:
		return nil
	}
}
func (c *opCtx) Value(key any) any {
	// Contexts derived from this one may ask after the collective ended, from
	// the context package's goroutine, while exec resets parent: read it under
	// the group's lock.
	c.g.mu.Lock()
	parent := c.parent
	c.g.mu.Unlock()
	if parent == nil {
		return nil
	}
	return parent.Value(key)
}

// New returns the ProcessGroup of t's rank. On success the group owns t and
// closes it in Close; on error the caller keeps it. Every rank of the job
// calls New with its own transport.
func New(t transport.Transport, opts ...Option) (*ProcessGroup, error) {
	if !littleEndian {
		return nil, ErrBigEndian
	}
	if t == nil {
		return nil, fmt.Errorf("%w: nil transport", ErrInvalidArgument)
	}
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.err != nil {
		return nil, cfg.err
	}
	world, rank := t.WorldSize(), t.Rank()
	if world < 1 || world > MaxWorldSize {
		return nil, fmt.Errorf("%w: world size %d not in [1, %d]", ErrInvalidArgument, world, MaxWorldSize)
	}
	if err := transport.CheckRank(rank, world); err != nil {
		return nil, err
	}
	g := &ProcessGroup{
		t:         t,
		rank:      rank,
		world:     world,
		localRank: rank,
		cfg:       cfg,
		log:       cfg.logger.With("rank", rank),
		done:      make(chan struct{}),
		abortCh:   make(chan struct{}),
		wake:      make(chan struct{}, 1),
		next:      1,
		serving:   1,
	}
	g.gctx, g.gcancel = context.WithCancel(context.Background())
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
	return g, nil
}

// Rank returns this process's rank in [0, WorldSize).
func (g *ProcessGroup) Rank() int { return g.rank }

// WorldSize returns the number of ranks in the job.
func (g *ProcessGroup) WorldSize() int { return g.world }

// LocalRank returns this process's rank among the ranks on its host, as the
// launcher set it (LOCAL_RANK and its Open MPI and Slurm equivalents) for a
// group made by InitFromEnv, and Rank otherwise.
func (g *ProcessGroup) LocalRank() int { return g.localRank }

// IsLeader reports whether this is rank 0, the lowest rank.
func (g *ProcessGroup) IsLeader() bool { return g.rank == 0 }

// Transport returns the transport the group runs on. Messages sent on it
// directly must use tags below TagReservedBase.
func (g *ProcessGroup) Transport() transport.Transport { return g.t }

// Close shuts the group down: collectives that are running or queued fail
// with an error matching ErrClosed, the transport is closed, and Close waits
// for the goroutines the group owns. It is idempotent (later calls return
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
		g.setCauseLocked(fmt.Errorf("dist: group closed: %w", ErrClosed))
	}
	if g.unwatch != nil {
		g.unwatch()
		g.watched, g.unwatch = nil, nil
	}
	g.mu.Unlock()
	// An abort message still being sent tells the peers why this rank
	// failed; closing first would leave them only "peer closed".
	g.awaitSenders(closeAbortWait)
	g.gcancel()
	err := g.t.Close()
	g.wg.Wait()
	g.timer.Stop()
	return err
}

// closeAbortWait bounds how long Close waits for abort messages in flight.
const closeAbortWait = 500 * time.Millisecond

// awaitSenders waits, at most d, for the abort senders.
func (g *ProcessGroup) awaitSenders(d time.Duration) {
	done := make(chan struct{})
	go func() {
		g.sending.Wait()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

func (g *ProcessGroup) isClosed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
}

// runSync runs c on the caller's goroutine once its turn comes.
func (g *ProcessGroup) runSync(ctx context.Context, c *call) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("dist: %s: %w", c.kind, err)
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return fmt.Errorf("dist: %s: %w", c.kind, ErrClosed)
	}
	seq := g.next
	g.next++
	g.mu.Unlock()
	return g.exec(ctx, seq, c, nil)
}

// exec waits for turn seq, runs c and passes the turn on. An async call's
// Work w (nil for a sync call) is finished before the turn passes, so that
// a collective that completes after it sees it done.
func (g *ProcessGroup) exec(ctx context.Context, seq uint64, c *call, w *Work) error {
	if err := g.waitTurn(ctx, seq, c.kind); err != nil {
		if w != nil {
			w.finish(err)
		}
		return err
	}
	g.mu.Lock()
	if g.cause != nil {
		g.mu.Unlock()
		err := g.derive(seq, c.kind)
		if w != nil {
			w.finish(err)
		}
		g.mu.Lock()
		g.endTurnLocked(seq)
		g.mu.Unlock()
		return err
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(g.cfg.timeout)
	}
	g.cur = opState{seq: seq, fp: c.fingerprint(), kind: c.kind}
	g.octx.parent, g.octx.deadline = ctx, deadline
	g.running, g.runCtx = true, ctx
	g.mu.Unlock()

	g.timer.Reset(time.Until(deadline))
	if ctx.Done() != nil {
		g.watchCtx(ctx)
		if ctx.Err() != nil { // ended before the watch could see it running
			g.onCancel()
		}
	}
	err := g.dispatch(&g.octx, c)
	g.timer.Stop()
	if err != nil {
		err = g.opFailed(seq, c.kind, err)
	}

	if w != nil {
		w.finish(err)
	}
	g.mu.Lock()
	g.running, g.runCtx = false, nil
	g.octx.parent = nil
	g.endTurnLocked(seq)
	g.mu.Unlock()
	return err
}

// waitTurn waits until collective seq may run. If ctx ends or the group is
// closed first, the turn is given up; since the peers will run that
// collective, giving it up aborts the group.
func (g *ProcessGroup) waitTurn(ctx context.Context, seq uint64, kind opKind) error {
	g.mu.Lock()
	if g.serving == seq {
		g.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	g.waiters = append(g.waiters, turnWaiter{seq, ch})
	g.mu.Unlock()
	var err error
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-g.done:
		err = ErrClosed
	}
	g.mu.Lock()
	i := slices.IndexFunc(g.waiters, func(w turnWaiter) bool { return w.seq == seq })
	if i < 0 {
		g.endTurnLocked(seq) // the turn came as we gave up: pass it on
	} else {
		g.waiters = slices.Delete(g.waiters, i, i+1)
		if g.abandoned == nil {
			g.abandoned = make(map[uint64]struct{})
		}
		g.abandoned[seq] = struct{}{}
	}
	g.mu.Unlock()
	if errors.Is(err, ErrClosed) {
		return fmt.Errorf("dist: %s: %w", kind, ErrClosed)
	}
	cause := fmt.Errorf("dist: %s #%d: gave up waiting for earlier collectives: %w", kind, seq, err)
	g.poison(cause, g.otherAbort(cause))
	return cause
}

// endTurnLocked passes the turn from seq to the next collective that has not
// been given up, and wakes it.
func (g *ProcessGroup) endTurnLocked(seq uint64) {
	g.serving = seq + 1
	for {
		if _, ok := g.abandoned[g.serving]; !ok {
			break
		}
		delete(g.abandoned, g.serving)
		g.serving++
	}
	for i, w := range g.waiters {
		if w.seq == g.serving {
			close(w.ch)
			g.waiters = slices.Delete(g.waiters, i, i+1)
			break
		}
	}
}

// onTimer fires at the running collective's deadline.
func (g *ProcessGroup) onTimer() {
	g.mu.Lock()
	if !g.running || time.Now().Before(g.octx.deadline) || g.cause != nil {
		g.mu.Unlock()
		return
	}
	cause := fmt.Errorf("dist: %s #%d: timed out: %w", g.cur.kind, g.cur.seq, context.DeadlineExceeded)
	g.setCauseLocked(cause)
	g.mu.Unlock()
	g.aborted(cause, g.otherAbort(cause))
}

// watchCtx arranges for onCancel to run when ctx ends. The registration
// (context.AfterFunc, which allocates) is kept for the next collective, so a
// loop of collectives under one context allocates nothing after the first.
func (g *ProcessGroup) watchCtx(ctx context.Context) {
	g.mu.Lock()
	defer g.mu.Unlock()
	// Only pointers are compared: comparing other dynamic types could panic,
	// and every cancellable context of package context is a pointer.
	if g.watched != nil && reflect.TypeOf(ctx).Kind() == reflect.Pointer && ctx == g.watched {
		return
	}
	if g.unwatch != nil {
		g.unwatch()
	}
	g.watched, g.unwatch = ctx, context.AfterFunc(ctx, g.onCancelFn)
}

// onCancel runs when the running collective's context ends.
func (g *ProcessGroup) onCancel() {
	g.mu.Lock()
	if !g.running || g.runCtx == nil || g.runCtx.Err() == nil || g.cause != nil {
		g.mu.Unlock()
		return
	}
	cause := fmt.Errorf("dist: %s #%d: %w", g.cur.kind, g.cur.seq, g.runCtx.Err())
	g.setCauseLocked(cause)
	g.mu.Unlock()
	g.aborted(cause, g.otherAbort(cause))
}

// setCauseLocked records the group's first failure and wakes every
// collective blocked in the transport.
func (g *ProcessGroup) setCauseLocked(cause error) {
	g.cause = cause
	if g.running {
		g.causeSeq = g.cur.seq
	}
	close(g.abortCh)
}

// poison aborts the group with cause unless it is already aborted, and
// sends notify (if not nil) to every peer.
func (g *ProcessGroup) poison(cause error, notify []byte) {
	g.mu.Lock()
	if g.cause != nil {
		g.mu.Unlock()
		return
	}
	g.setCauseLocked(cause)
	g.mu.Unlock()
	g.aborted(cause, notify)
}

// aborted logs a new abort and tells the peers.
func (g *ProcessGroup) aborted(cause error, notify []byte) {
	g.log.Warn("dist: process group aborted", "err", cause)
	if notify == nil {
		return
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return
	}
	g.wg.Add(1)
	g.sending.Add(1)
	g.mu.Unlock()
	go g.sendAbort(notify)
}

// sendAbort tells every peer (in parallel, each bounded by
// abortSendTimeout) that the group is aborted.
func (g *ProcessGroup) sendAbort(msg []byte) {
	defer g.wg.Done()
	defer g.sending.Done()
	ctx, cancel := context.WithTimeout(g.gctx, abortSendTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for p := range g.world {
		if p == g.rank {
			continue
		}
		wg.Go(func() {
			if err := g.t.Send(ctx, p, tagAbort, transport.Meta{}, msg); err != nil {
				g.log.Debug("dist: could not send abort", "peer", p, "err", err)
			}
		})
	}
	wg.Wait()
}

// opFailed turns the error a collective's algorithm returned into the error
// the caller sees, aborting the group (and telling the peers) if this is the
// group's first failure.
func (g *ProcessGroup) opFailed(seq uint64, kind opKind, err error) error {
	var closed *PeerError
	if errors.As(err, &closed) && errors.Is(closed.Err, ErrPeerClosed) {
		g.awaitNotice(closed.Rank)
	}
	g.mu.Lock()
	already := g.cause != nil
	g.mu.Unlock()
	var (
		de *DesyncError
		pe *PeerError
	)
	switch {
	case already:
		// The transport error echoes the abort (the op context is done).
	case errors.As(err, &de):
		g.poison(de, g.desyncAbort(de))
	case errors.As(err, &pe):
		p := &PeerError{Rank: pe.Rank, Op: kind.String(), Err: pe.Err}
		g.poison(p, g.peerAbort(p))
	case errors.Is(err, ErrClosed):
		g.poison(err, nil)
	default:
		cause := fmt.Errorf("dist: %s #%d: %w", kind, seq, err)
		g.poison(cause, g.otherAbort(cause))
	}
	return g.derive(seq, kind)
}

// noticeGrace bounds how long a collective that met a closed peer waits for
// an abort message explaining it.
const noticeGrace = 200 * time.Millisecond

// awaitNotice is called when a collective finds peer r closed. A peer that
// closes in the middle of a collective stopped because something failed,
// and it sent its abort message (naming the cause) before its goodbye: wait
// until r's abort watcher has handled what r sent, or the group is aborted,
// so that the real cause is reported rather than the bare "peer closed".
func (g *ProcessGroup) awaitNotice(r int) {
	if r < 0 || r >= len(g.watchDone) || g.watchDone[r] == nil {
		return
	}
	t := time.NewTimer(noticeGrace)
	defer t.Stop()
	select {
	case <-g.abortCh:
	case <-g.watchDone[r]:
	case <-g.done:
	case <-t.C:
	}
}

// derive returns the error collective seq reports because the group is
// aborted: the cause itself for the collective that was running when it
// happened, a *PeerError naming this collective when a peer failed, and
// otherwise an error wrapping both ErrAborted and the cause.
func (g *ProcessGroup) derive(seq uint64, kind opKind) error {
	g.mu.Lock()
	cause, cseq, closed := g.cause, g.causeSeq, g.closed
	g.mu.Unlock()
	name := kind.String()
	if closed && cseq != seq || errors.Is(cause, ErrClosed) {
		return fmt.Errorf("dist: %s: %w", name, ErrClosed)
	}
	var pe *PeerError
	if errors.As(cause, &pe) {
		if pe.Op == name && cseq == seq {
			return pe
		}
		return &PeerError{Rank: pe.Rank, Op: name, Err: pe.Err}
	}
	if cseq == seq {
		return cause
	}
	return fmt.Errorf("dist: %s: %w: %w", name, ErrAborted, cause)
}

// worker runs async collectives in the order they were issued.
func (g *ProcessGroup) worker() {
	defer g.wg.Done()
	for {
		g.mu.Lock()
		for len(g.queue) == 0 {
			if g.closed {
				g.mu.Unlock()
				return
			}
			g.mu.Unlock()
			select {
			case <-g.wake:
			case <-g.done:
			}
			g.mu.Lock()
		}
		w := g.queue[0]
		g.queue[0] = nil
		g.queue = g.queue[1:]
		g.mu.Unlock()
		g.exec(context.Background(), w.seq, &w.c, w) // finishes w
	}
}

// enqueue hands c to the worker and returns its Work.
func (g *ProcessGroup) enqueue(c call) *Work {
	w := &Work{c: c, done: make(chan struct{})}
	if err := c.check(g); err != nil {
		w.finish(err)
		return w
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		w.finish(fmt.Errorf("dist: %s: %w", c.kind, ErrClosed))
		return w
	}
	w.seq = g.next
	g.next++
	g.queue = append(g.queue, w)
	g.mu.Unlock()
	select {
	case g.wake <- struct{}{}:
	default:
	}
	return w
}
