package dist

import (
	"context"
	"errors"
	"fmt"

	"github.com/gdist/gdist/dist/transport"
)

// Point-to-point messages are not sequenced with the collectives, but they
// belong to the job's one failure domain: once the job has failed (a
// collective failed, a peer was lost, a peer's notice arrived, a layer
// above called Abort), every point-to-point call, pending or new, fails
// with the job's error — a *PeerError naming the culprit — so a layer
// built on them (the pipeline) and the collectives always agree on who
// failed. A point-to-point call that finds its own peer closed or lost
// first lets that peer's notice, if it sent one, be handled, so it too
// reports the real cause. A peer that closed cleanly is not a failure of
// the job: calls involving it fail with a *PeerError wrapping
// ErrPeerClosed, and the rest go on. Messages from one rank under one tag
// arrive in the order they were sent. On a subgroup, peers are the
// group's members (translated to ranks of the job); tags are the job's,
// shared by all its groups.

func (g *ProcessGroup) checkP2P(op string, peer int, tag uint32) error {
	if tag < TagReservedBase && uint(peer) < uint(g.size) && !g.shut.Load() && !g.d.down.Load() {
		return nil // inlined: the path of every message
	}
	return g.p2pRefused(op, peer, tag)
}

// p2pRefused is checkP2P's error, or nil.
func (g *ProcessGroup) p2pRefused(op string, peer int, tag uint32) error {
	if tag >= TagReservedBase {
		return fmt.Errorf("dist: %s: %w: %#x", op, ErrReservedTag, tag)
	}
	if g.shut.Load() || g.d.down.Load() { // closed or failed: which, and why
		if g.isClosed() {
			return fmt.Errorf("dist: %s: %w", op, ErrClosed)
		}
		if g.d.failed() {
			return g.derive(0, op)
		}
	}
	return transport.CheckRank(peer, g.size)
}

// p2pCtx returns a context that ends with ctx or when the job fails, and
// the handle that releases it. A ctx that can never end (such as
// context.Background()) costs nothing: the job's own context serves.
// Joining another with the job's failure costs a few small allocations
// (context.WithCancel and context.AfterFunc), so the joins are kept in a
// small table keyed by the caller's context (p2pJoins) and reused by later
// calls under the same one: a loop of sends and receives under one
// cancellable context allocates nothing after its first call.
func (g *ProcessGroup) p2pCtx(ctx context.Context) (context.Context, p2pHold) {
	done := ctx.Done()
	if done == nil {
		return g.d.failCtx, p2pHold{}
	}
	return g.d.joins.hold(ctx, done, g.d.failCtx)
}

// p2pErr turns a point-to-point error into the one the caller sees: after
// Close one matching ErrClosed, after the job failed the job's error.
// ctx is the caller's.
func (g *ProcessGroup) p2pErr(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if g.isClosed() {
		return fmt.Errorf("dist: %s: %w", op, ErrClosed)
	}
	var pe *PeerError
	if ctx.Err() == nil && errors.As(err, &pe) && (errors.Is(pe.Err, ErrPeerClosed) || errors.Is(pe.Err, ErrPeerLost)) {
		g.d.awaitWatcher(pe.Rank)
	}
	if ctx.Err() == nil && g.d.failed() {
		return g.derive(0, op)
	}
	return err
}

// Send sends p to member to under tag, which must be below TagReservedBase
// (else ErrReservedTag). It returns once p may be reused; p is not
// retained. Buffer.Bytes gives the bytes of a typed slice.
func (g *ProcessGroup) Send(ctx context.Context, to int, tag uint32, p []byte) error {
	if err := g.checkP2P("send", to, tag); err != nil {
		return err
	}
	c, hold := g.p2pCtx(ctx)
	r := g.global(to)
	err := g.d.t.Send(c, r, tag, transport.Header{}, p)
	hold.release()
	if err == nil {
		g.d.obs.met.Sent(r, len(p))
		return nil
	}
	return g.p2pErr(ctx, "send", err)
}

// Recv returns the next message from member from under tag. The caller
// owns the returned slice.
func (g *ProcessGroup) Recv(ctx context.Context, from int, tag uint32) ([]byte, error) {
	if err := g.checkP2P("recv", from, tag); err != nil {
		return nil, err
	}
	c, hold := g.p2pCtx(ctx)
	r := g.global(from)
	m, err := g.d.t.Recv(c, r, tag)
	hold.release()
	if err != nil {
		return nil, g.p2pErr(ctx, "recv", err)
	}
	g.d.obs.met.Received(r, len(m.Payload))
	return m.Payload, nil
}

// RecvInto receives the next message from member from under tag into dst
// and returns its length n: the message is dst[:n]. The transport writes
// it straight into dst where it can. A message longer than dst is consumed
// and reported with an error matching ErrMessageTooLong, n its length and
// dst unchanged. dst stays the caller's; Buffer.Bytes gives the bytes of a
// typed slice (check n against the length expected).
func (g *ProcessGroup) RecvInto(ctx context.Context, from int, tag uint32, dst []byte) (int, error) {
	if err := g.checkP2P("recv", from, tag); err != nil {
		return 0, err
	}
	c, hold := g.p2pCtx(ctx)
	r := g.global(from)
	_, n, err := g.d.t.RecvInto(c, r, tag, dst)
	hold.release()
	if err == nil {
		g.d.obs.met.Received(r, n)
		return n, nil
	}
	if errors.Is(err, transport.ErrMessageTooLong) {
		return n, err
	}
	return n, g.p2pErr(ctx, "recv", err)
}
