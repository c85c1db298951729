package dist

// The group's one failure domain. The first failure is recorded as the
// cause (an *AbortError: culprit, kind, op, sequence number, message); it
// wakes every blocked collective and point-to-point call, and is sent,
// encoded, to every peer. Every rank that records a cause sends it on, so
// a rank that learned it from a peer tells the others too before it goes
// away: whatever the order in which links close, a peer always finds a
// notice explaining a departure ahead of the departure itself.
//
// Why the first cause wins. A rank sends its notice on each link before
// anything else it does because of the failure, and Close waits for those
// sends before it says goodbye on the links (so per-link order puts the
// notice first). Each rank receives notices with a receive posted for the
// life of the group, so a notice that has arrived is handed over even if
// the link breaks right after. And a rank that finds a peer closed or lost
// in the middle of an operation waits, before it records anything, until
// its watcher of that peer has handled what that peer sent: the transport
// has closed or failed that peer's messages by then, so the wait ends as
// soon as the watcher has run, and no grace period is involved. A healthy
// rank that closed after failing is therefore never reported: its notice
// (naming the real culprit) is always read first.

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/gdist/gdist/dist/transport"
)

// setCauseLocked records the job's first failure, wakes every
// collective blocked in the transport, in every group, and, for a failure
// to tell the peers about (a != nil), starts sending the notice. The
// sender is registered with Close under the lock that records the cause:
// a rank whose call fails with this cause and which closes at once still
// tells its peers why before it says goodbye. d.mu is held.
func (d *domain) setCauseLocked(a *AbortError, cause error) {
	d.cause, d.abort = cause, a
	for _, g := range d.groups {
		if g.running {
			g.causeSeq = g.cur.seq
		}
		g.stopLocked()
	}
	d.down.Store(true)
	close(d.abortCh)
	d.failCancel()
	if a != nil && !d.transportClosing {
		d.wg.Add(1)
		d.sending.Add(1)
		go d.sendAbort(encodeNotice(a))
	}
}

// fail records a (and cause, the error of the operation that found it)
// unless the job has failed already, and tells the peers. It reports
// whether a became the cause.
func (d *domain) fail(a *AbortError, cause error) bool {
	d.mu.Lock()
	if d.cause != nil {
		d.mu.Unlock()
		return false
	}
	d.setCauseLocked(a, cause)
	d.mu.Unlock()
	d.aborted(a)
	return true
}

// aborted logs a new abort (setCauseLocked has started telling the
// peers).
func (d *domain) aborted(a *AbortError) {
	d.log.Warn("dist: process group aborted", "culprit", a.Rank, "kind", a.Kind.String(),
		"op", a.Op, "seq", a.Seq, "err", a.Error())
}

// sendAbort tells every peer (in parallel, each bounded by
// abortSendTimeout) why the job failed. Close waits for it before the
// transport says goodbye.
func (d *domain) sendAbort(msg []byte) {
	defer d.wg.Done()
	defer d.sending.Done()
	ctx, cancel := context.WithTimeout(context.Background(), abortSendTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for p := range d.world {
		if p == d.rank {
			continue
		}
		wg.Go(func() {
			if err := d.t.Send(ctx, p, TagReservedBase+tagAbort, transport.Header{}, msg); err != nil {
				d.log.Debug("dist: could not send abort notice", "peer", p, "err", err)
			}
		})
	}
	wg.Wait()
}

// opFailed turns the error a collective's algorithm returned into the error
// the caller sees, failing the job (and telling the peers) if this is the
// job's first failure.
func (g *ProcessGroup) opFailed(seq uint64, kind opKind, err error) error {
	name := g.opName(kind)
	if g.isClosed() && !g.d.failed() {
		// The group was closed under the collective: nothing to tell.
		return fmt.Errorf("dist: %s: %w", name, ErrClosed)
	}
	_ = g.classify(name, seq, err, g.runCtxErr())
	return g.derive(seq, name)
}

// runCtxErr returns the error of the running collective's context.
func (g *ProcessGroup) runCtxErr() error {
	g.d.mu.Lock()
	defer g.d.mu.Unlock()
	if g.runCtx == nil {
		return nil
	}
	return g.runCtx.Err()
}

// classify records err, met by operation op of g (collective seq, or 0),
// as the job's failure unless the job has failed already. ctxErr is the
// error of the caller's context, if it has ended: then the failure is this
// rank's own cancellation or timeout, whatever the transport said. It
// reports whether err became the job's cause.
func (g *ProcessGroup) classify(op string, seq uint64, err, ctxErr error) bool {
	d := g.d
	var pe *PeerError
	if ctxErr == nil && errors.As(err, &pe) && (errors.Is(pe.Err, ErrPeerClosed) || errors.Is(pe.Err, ErrPeerLost)) {
		// The peer left: first let its notice, if it sent one, be handled.
		d.awaitWatcher(pe.Rank)
	}
	if d.failed() {
		return false
	}
	a := &AbortError{Rank: d.rank, Reporter: d.rank, Op: op, Seq: seq, Err: err}
	var (
		cause = err
		de    *DesyncError
	)
	switch {
	case ctxErr != nil && errors.Is(ctxErr, context.DeadlineExceeded) && seq != 0:
		d.mu.Lock()
		cur, started := g.cur, g.prog.self.started.at
		d.mu.Unlock()
		if cur.seq == seq {
			return g.timedOut(cur, started)
		}
		fallthrough
	case ctxErr != nil:
		a.Kind, a.Err = KindCancelled, ctxErr
		if errors.Is(ctxErr, context.DeadlineExceeded) {
			a.Kind = KindTimeout
		}
		a.Msg = ctxErr.Error()
		cause = &ownError{a: a, err: fmt.Errorf("dist: %s: %w", opLabel(op, seq), ctxErr)}
	case errors.As(err, &de):
		a.Kind, a.Rank, a.Err, a.Msg = KindDesync, de.Peer, de, de.Error()
		cause = &ownError{a: a, err: de}
	case errors.As(err, &pe):
		a.Rank, a.Err = pe.Rank, pe.Err
		a.Kind = peerKind(pe.Err)
		a.Msg = pe.Err.Error()
		cause = &PeerError{Rank: pe.Rank, Op: op, Err: a}
	case errors.Is(err, ErrClosed):
		// The transport was closed under the job: nothing to tell.
		d.mu.Lock()
		first := d.cause == nil
		if first {
			d.setCauseLocked(nil, err)
		}
		d.mu.Unlock()
		return first
	default:
		a.Kind, a.Msg = KindUser, err.Error()
		cause = &ownError{a: a, err: fmt.Errorf("dist: %s: %w", opLabel(op, seq), err)}
	}
	return d.fail(a, cause)
}

// opLabel names operation op and its sequence number, if any.
func opLabel(op string, seq uint64) string {
	if seq == 0 {
		return op
	}
	return fmt.Sprintf("%s #%d", op, seq)
}

// peerKind classifies the error of a peer that failed.
func peerKind(err error) FailureKind {
	switch {
	case errors.Is(err, ErrPeerUnresponsive): // the transports' heartbeat timeouts match it
		return KindFrozen
	case errors.Is(err, ErrPeerLost):
		return KindLost
	case errors.Is(err, ErrPeerClosed):
		return KindClosed
	}
	return KindProtocol
}

// ownError is the error of a failure that is not a peer's (this rank's
// context, a layer above, a desync): it reads like the underlying error
// and unwraps to it and to the record.
type ownError struct {
	a   *AbortError
	err error
}

func (e *ownError) Error() string   { return e.err.Error() }
func (e *ownError) Unwrap() []error { return []error{e.err, e.a} }

// ownCtxEnded makes err, the error of a collective whose own context ctx
// has ended, match ctx.Err(): the group may have failed first because of a
// peer's notice (typically the peer's own cancellation, which arrived
// before this rank's), but a caller that cancelled must find its
// cancellation (errors.Is(err, context.Canceled)), and the peer's cause
// stays in the chain. err is returned as it is when it matches already or
// ctx has not ended.
func ownCtxEnded(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	return withCtxErr(ctx.Err(), err)
}

// withCtxErr is ownCtxEnded for a context that ended with ctxErr (nil: it
// has not).
func withCtxErr(ctxErr, err error) error {
	if ctxErr == nil || errors.Is(err, ctxErr) {
		return err
	}
	return &ctxEndedError{ctx: ctxErr, err: err}
}

// ctxEndedError is the error of a collective whose context ended while
// (or after) its group failed for another reason.
type ctxEndedError struct {
	ctx error // the context's error
	err error // the group's
}

func (e *ctxEndedError) Error() string {
	return fmt.Sprintf("%v (this rank's context ended too: %v)", e.err, e.ctx)
}
func (e *ctxEndedError) Unwrap() []error { return []error{e.ctx, e.err} }

// failedHere reports whether this rank failed the job, for a reason of its
// own, while collective seq of g ran.
func (g *ProcessGroup) failedHere(seq uint64) bool {
	d := g.d
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.abort != nil && g.causeSeq == seq && d.abort.Reporter == d.rank &&
		(d.abort.Kind == KindCancelled || d.abort.Kind == KindTimeout)
}

func (d *domain) failed() bool {
	// abortCh is closed when the cause is set: no lock on the paths that
	// ask at every call (point-to-point messages).
	select {
	case <-d.abortCh:
		return true
	default:
		return false
	}
}

// awaitWatcher waits until the abort watcher of peer r has returned: it
// has handled the notice r sent, if any. It is called once the transport
// reported r closed or lost, so r's notice, if it sent one, was delivered
// (or r's messages were failed) already: the watcher returns promptly and
// no time bound is needed. Close ends the wait too.
func (d *domain) awaitWatcher(r int) {
	if r < 0 || r >= len(d.watchDone) || d.watchDone[r] == nil {
		return
	}
	select {
	case <-d.watchDone[r]:
	case <-d.done:
	}
}

// derive returns the error operation op of g (collective seq, or 0)
// reports because the job failed or g was closed: the cause itself for the
// collective that was running when it happened, a *PeerError naming the
// culprit and this operation when a peer failed or a peer's notice
// explained the failure, and otherwise an error wrapping both ErrAborted
// and the cause. On a subgroup, an error naming a member also says which
// member it is.
func (g *ProcessGroup) derive(seq uint64, name string) error {
	d := g.d
	d.mu.Lock()
	cause, cseq, closed := d.cause, g.causeSeq, d.closed
	gclosed := g.closed && !d.closed
	d.mu.Unlock()
	if gclosed || closed && cseq != seq || errors.Is(cause, ErrClosed) {
		return fmt.Errorf("dist: %s: %w", name, ErrClosed)
	}
	var err error
	if pe, ok := cause.(*PeerError); ok {
		if pe.Op == name && (seq == 0 || cseq == seq) {
			err = pe
		} else {
			err = &PeerError{Rank: pe.Rank, Op: name, Err: pe.Err}
		}
	} else if seq != 0 && cseq == seq {
		err = cause
	} else {
		err = fmt.Errorf("dist: %s: %w: %w", name, ErrAborted, cause)
	}
	return g.inGroup(err)
}

// inGroup adds to err, on a subgroup, which member the culprit is. The
// culprit is the one the error blames: the other side of a desync this
// rank took part in, else the cause's culprit, or its reporter when that
// is this rank (a peer gave up waiting for it).
func (g *ProcessGroup) inGroup(err error) error {
	if g.id == 0 {
		return err
	}
	var a *AbortError
	if !errors.As(err, &a) {
		return err
	}
	culprit := a.Rank
	if culprit == g.d.rank {
		culprit = a.Reporter
	}
	if de := (*DesyncError)(nil); errors.As(err, &de) && de.Rank == g.d.rank {
		culprit = de.Peer
	}
	if m := g.member(culprit); m >= 0 {
		return &MemberError{Group: g.name, Member: m, Rank: culprit, Err: err}
	}
	return err
}

// watch receives the abort notice of peer p, if it sends one, for the
// life of the job. A peer that is lost (not one that closed cleanly)
// fails the job too: its collectives could never complete. The receive
// is posted into a buffer of its own, so a notice that has arrived is
// handed over even if the link breaks right after it.
func (d *domain) watch(p int, done chan<- struct{}) {
	defer d.wg.Done()
	defer close(done)
	buf := make([]byte, maxNotice)
	_, n, err := d.t.RecvInto(d.gctx, p, TagReservedBase+tagAbort, buf)
	if err != nil {
		var pe *PeerError
		switch {
		case errors.As(err, &pe) && errors.Is(pe.Err, ErrPeerLost):
			op, seq := d.runningOp()
			a := &AbortError{Kind: peerKind(pe.Err), Rank: pe.Rank, Reporter: d.rank, Op: op, Seq: seq, Err: pe.Err, Msg: pe.Err.Error()}
			d.fail(a, &PeerError{Rank: pe.Rank, Op: op, Err: a})
		case errors.Is(err, ErrMessageTooLong):
			a := &AbortError{Kind: KindProtocol, Rank: p, Reporter: d.rank, Op: "abort notice", Err: ErrProtocol, Msg: "abort notice too long"}
			d.fail(a, &PeerError{Rank: p, Op: "abort notice", Err: a})
		}
		return
	}
	a, derr := decodeNotice(d.rank, d.world, p, buf[:n])
	if derr != nil {
		var pe *PeerError
		errors.As(derr, &pe)
		a = &AbortError{Kind: KindProtocol, Rank: p, Reporter: d.rank, Op: "abort notice", Err: pe.Err, Msg: pe.Err.Error()}
		d.fail(a, &PeerError{Rank: p, Op: "abort notice", Err: a})
		return
	}
	// The peer to blame from here: the culprit, unless that is this rank
	// (a peer timed out waiting for it), then the rank that gave up.
	blame := a.Rank
	if blame == d.rank {
		blame = a.Reporter
	}
	var cause error = &PeerError{Rank: blame, Op: a.Op, Err: a}
	if de, ok := a.Err.(*DesyncError); ok {
		cause = &ownError{a: a, err: de}
	}
	d.fail(a, cause)
}

// runningOp names a running collective (the job's group's if it runs
// one, else any group's), or "group" if none runs.
func (d *domain) runningOp() (string, uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if g := d.groups[0]; g != nil && g.running {
		return g.opName(g.cur.kind), g.cur.seq
	}
	for _, g := range d.groups {
		if g.running {
			return g.opName(g.cur.kind), g.cur.seq
		}
	}
	return "group", 0
}

// Abort fails the job on behalf of a layer above it (a pipeline, a
// training loop) because operation op failed with err, and returns the
// error that operation should report. If the job has failed already the
// first failure wins: Abort returns the error derived from it (a
// *PeerError naming the culprit, wrapping ErrAborted and the cause).
// Otherwise err becomes the job's cause and every peer is told, encoded:
// their collectives, point-to-point calls and pipelines, in every group,
// fail with a *PeerError naming this rank and carrying an *AbortError.
// err is classified like a collective's error: a *PeerError reporting a
// peer closed or lost names that peer (after that peer's own notice, if
// any, has been handled), a *DesyncError stays one, a context's error is a
// cancellation or timeout, anything else a KindUser failure of this rank.
// Abort returns err itself (wrapped, so that errors.As finds the
// *AbortError too) when err became the cause. Abort(op, nil) is a no-op
// that returns the job's error, if any.
func (g *ProcessGroup) Abort(op string, err error) error {
	if err == nil {
		return g.Err()
	}
	var ctxErr error
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		var pe *PeerError
		if !errors.As(err, &pe) && !errors.Is(err, ErrAborted) {
			ctxErr = err
		}
	}
	if errors.Is(err, ErrAborted) || errors.Is(err, ErrClosed) {
		// An echo of the job's failure (or of Close), not a new one.
		if e := g.Err(); e != nil {
			return g.deriveOp(op)
		}
	}
	if g.classify(op, 0, err, ctxErr) {
		g.d.mu.Lock()
		defer g.d.mu.Unlock()
		return g.d.cause
	}
	return g.deriveOp(op)
}

// deriveOp is derive for an operation that is not a collective.
func (g *ProcessGroup) deriveOp(op string) error {
	if !g.d.failed() && !g.isClosed() {
		return nil
	}
	return g.derive(0, op)
}

// Err returns nil while the job is healthy and the group open and, once
// the job has failed (or the group was closed), the error a new operation
// on the group reports: a *PeerError naming the culprit, a *DesyncError,
// or an error wrapping ErrAborted or ErrClosed. Use errors.As with
// *AbortError to read the cause.
func (g *ProcessGroup) Err() error { return g.deriveOp("group") }

// Failed returns a channel that is closed when the job fails or the group
// is closed: layers above select on it to stop waiting for peers that will
// not come.
func (g *ProcessGroup) Failed() <-chan struct{} { return g.stop }
