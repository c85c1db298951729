package dist

// The group's one failure domain: the first failure is recorded as the
// cause, wakes every blocked collective, and is sent to the peers; later
// collectives derive their errors from it.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gdist/gdist/dist/transport"
)

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
			if err := g.t.Send(ctx, p, tagAbort, transport.Header{}, msg); err != nil {
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
