package dist

import (
	"context"
	"errors"
	"fmt"

	"github.com/gdist/gdist/dist/transport"
)

// Point-to-point messages are not sequenced with the collectives, but they
// belong to the group's one failure domain: once the group has failed
// (a collective failed, a peer was lost, a peer's notice arrived, a layer
// above called Abort), every point-to-point call, pending or new, fails
// with the group's error — a *PeerError naming the culprit — so a layer
// built on them (the pipeline) and the collectives always agree on who
// failed. A point-to-point call that finds its own peer closed or lost
// first lets that peer's notice, if it sent one, be handled, so it too
// reports the real cause. A peer that closed cleanly is not a failure of
// the group: calls involving it fail with a *PeerError wrapping
// ErrPeerClosed, and the rest go on. Messages from one rank under one tag
// arrive in the order they were sent.

func (g *ProcessGroup) checkP2P(op string, peer int, tag uint32) error {
	if tag >= TagReservedBase {
		return fmt.Errorf("dist: %s: %w: %#x", op, ErrReservedTag, tag)
	}
	if g.isClosed() {
		return fmt.Errorf("dist: %s: %w", op, ErrClosed)
	}
	if err := transport.CheckRank(peer, g.world); err != nil {
		return err
	}
	if g.failed() {
		return g.derive(0, op)
	}
	return nil
}

// p2pCtx returns a context that ends with ctx or when the group fails,
// and the function that releases it. A ctx that can never end (such as
// context.Background()) costs nothing: the group's own context serves.
// Another costs the few small allocations of joining the two.
func (g *ProcessGroup) p2pCtx(ctx context.Context) (context.Context, func()) {
	if ctx.Done() == nil {
		return g.failCtx, noop
	}
	c, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(g.failCtx, cancel)
	return c, func() {
		stop()
		cancel()
	}
}

func noop() {}

// p2pErr turns a point-to-point error into the one the caller sees: after
// Close one matching ErrClosed, after the group failed the group's error.
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
		g.awaitWatcher(pe.Rank)
	}
	if ctx.Err() == nil && g.failed() {
		return g.derive(0, op)
	}
	return err
}

// Send sends p to rank `to` under tag, which must be below TagReservedBase
// (else ErrReservedTag). It returns once p may be reused; p is not retained.
func (g *ProcessGroup) Send(ctx context.Context, to int, tag uint32, p []byte) error {
	if err := g.checkP2P("send", to, tag); err != nil {
		return err
	}
	c, done := g.p2pCtx(ctx)
	defer done()
	err := g.t.Send(c, to, tag, transport.Header{}, p)
	if err == nil {
		g.obs.met.Sent(to, len(p))
	}
	return g.p2pErr(ctx, "send", err)
}

// Recv returns the next message from rank `from` under tag. The caller owns
// the returned slice.
func (g *ProcessGroup) Recv(ctx context.Context, from int, tag uint32) ([]byte, error) {
	if err := g.checkP2P("recv", from, tag); err != nil {
		return nil, err
	}
	c, done := g.p2pCtx(ctx)
	defer done()
	m, err := g.t.Recv(c, from, tag)
	if err != nil {
		return nil, g.p2pErr(ctx, "recv", err)
	}
	g.obs.met.Received(from, len(m.Payload))
	return m.Payload, nil
}

// RecvInto receives the next message from rank `from` under tag into dst
// and returns its length n: the message is dst[:n]. The transport writes
// it straight into dst where it can. A message longer than dst is consumed
// and reported with an error matching ErrMessageTooLong, n its length and
// dst unchanged. dst stays the caller's.
func (g *ProcessGroup) RecvInto(ctx context.Context, from int, tag uint32, dst []byte) (int, error) {
	if err := g.checkP2P("recv", from, tag); err != nil {
		return 0, err
	}
	c, done := g.p2pCtx(ctx)
	defer done()
	_, n, err := g.t.RecvInto(c, from, tag, dst)
	if err == nil {
		g.obs.met.Received(from, n)
	}
	if errors.Is(err, transport.ErrMessageTooLong) {
		return n, err
	}
	return n, g.p2pErr(ctx, "recv", err)
}

// SendF32 sends data (little-endian float32s) to rank `to` under tag. data is
// not retained.
func (g *ProcessGroup) SendF32(ctx context.Context, to int, tag uint32, data []float32) error {
	return g.Send(ctx, to, tag, f32Bytes(data))
}

// SendF64 sends data (little-endian float64s) to rank `to` under tag. data is
// not retained.
func (g *ProcessGroup) SendF64(ctx context.Context, to int, tag uint32, data []float64) error {
	return g.Send(ctx, to, tag, f64Bytes(data))
}

// recvSized receives a message and checks that it holds whole elements of es
// bytes; the caller must Release the payload.
func (g *ProcessGroup) recvSized(ctx context.Context, from int, tag uint32, es int) ([]byte, error) {
	if err := g.checkP2P("recv", from, tag); err != nil {
		return nil, err
	}
	c, done := g.p2pCtx(ctx)
	defer done()
	m, err := g.t.Recv(c, from, tag)
	if err != nil {
		return nil, g.p2pErr(ctx, "recv", err)
	}
	g.obs.met.Received(from, len(m.Payload))
	if len(m.Payload)%es != 0 {
		n := len(m.Payload)
		g.t.Release(m.Payload)
		return nil, &PeerError{Rank: from, Op: "recv",
			Err: fmt.Errorf("%w: message of %d bytes is not a whole number of %d-byte values", ErrProtocol, n, es)}
	}
	return m.Payload, nil
}

// RecvF32 receives a message of float32s from rank `from` under tag; its
// length comes from the message. The caller owns the new slice.
func (g *ProcessGroup) RecvF32(ctx context.Context, from int, tag uint32) ([]float32, error) {
	p, err := g.recvSized(ctx, from, tag, 4)
	if err != nil {
		return nil, err
	}
	out := make([]float32, len(p)/4)
	copy(f32Bytes(out), p)
	g.t.Release(p)
	return out, nil
}

// RecvF64 receives a message of float64s from rank `from` under tag. The
// caller owns the new slice.
func (g *ProcessGroup) RecvF64(ctx context.Context, from int, tag uint32) ([]float64, error) {
	p, err := g.recvSized(ctx, from, tag, 8)
	if err != nil {
		return nil, err
	}
	out := make([]float64, len(p)/8)
	copy(f64Bytes(out), p)
	g.t.Release(p)
	return out, nil
}

// RecvF32Into receives a message of float32s into dst: the transport
// writes the payload straight into dst. A message of another length is
// consumed and reported as a *LengthMismatchError; a longer one leaves dst
// unchanged, a shorter one may have overwritten its start. dst stays the
// caller's.
func (g *ProcessGroup) RecvF32Into(ctx context.Context, from int, tag uint32, dst []float32) error {
	return g.recvP2PInto(ctx, from, tag, f32Bytes(dst), 4)
}

// RecvF64Into receives a message of float64s into dst, like RecvF32Into.
func (g *ProcessGroup) RecvF64Into(ctx context.Context, from int, tag uint32, dst []float64) error {
	return g.recvP2PInto(ctx, from, tag, f64Bytes(dst), 8)
}

// recvP2PInto receives a message of exactly len(dst) bytes into dst, like
// RecvF32Into for es-byte values.
func (g *ProcessGroup) recvP2PInto(ctx context.Context, from int, tag uint32, dst []byte, es int) error {
	if err := g.checkP2P("recv", from, tag); err != nil {
		return err
	}
	c, done := g.p2pCtx(ctx)
	defer done()
	_, n, err := g.t.RecvInto(c, from, tag, dst)
	if err != nil && !errors.Is(err, transport.ErrMessageTooLong) {
		return g.p2pErr(ctx, "recv", err)
	}
	if err == nil {
		g.obs.met.Received(from, n)
	}
	if n%es != 0 {
		return &PeerError{Rank: from, Op: "recv",
			Err: fmt.Errorf("%w: message of %d bytes is not a whole number of %d-byte values", ErrProtocol, n, es)}
	}
	if n != len(dst) {
		return &LengthMismatchError{Op: "recv", Want: len(dst) / es, Got: n / es}
	}
	return nil
}
