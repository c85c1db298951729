package dist

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/gdist/gdist/dist/internal/coll"
	"github.com/gdist/gdist/dist/transport"
)

// collHeader is the transport header of a collective message: the
// collective's sequence number and fingerprint, little-endian. The
// transport carries it without looking at it.
func collHeader(seq, fp uint64) transport.Header {
	var h transport.Header
	binary.LittleEndian.PutUint64(h[:8], seq)
	binary.LittleEndian.PutUint64(h[8:], fp)
	return h
}

// parseHeader returns the sequence number and fingerprint of h.
func parseHeader(h transport.Header) (seq, fp uint64) {
	return binary.LittleEndian.Uint64(h[:8]), binary.LittleEndian.Uint64(h[8:])
}

// exchange is a group's coll.Exchange: it carries the algorithms' messages
// on the group's collective tag, addressed to the members' ranks in the
// job, each with the running collective's sequence number and fingerprint
// in its header (the group runs one collective at a time and sets g.cur
// before the algorithm starts). A message whose header disagrees is a
// *DesyncError; one of another length a protocol error.
type exchange struct {
	g *ProcessGroup
}

var (
	_ coll.Exchange       = (*exchange)(nil)
	_ coll.StreamExchange = (*exchange)(nil)
)

// Send implements coll.Exchange.
func (x *exchange) Send(ctx context.Context, to int, p []byte) error {
	return x.send(ctx, to, p, false)
}

// SendStream implements coll.StreamExchange: Send, through the
// transport's SendStream where it has one (transport.StreamSender).
func (x *exchange) SendStream(ctx context.Context, to int, p []byte) error {
	return x.send(ctx, to, p, true)
}

func (x *exchange) send(ctx context.Context, to int, p []byte, stream bool) error {
	g := x.g
	r, tag, h := g.global(to), g.tag+tagColl, collHeader(g.cur.wire, g.cur.fp)
	var err error
	if s, ok := g.d.t.(transport.StreamSender); ok && stream {
		err = s.SendStream(ctx, r, tag, h, p)
	} else {
		err = g.d.t.Send(ctx, r, tag, h, p)
	}
	if err == nil {
		g.d.obs.met.Sent(r, len(p))
	}
	return err
}

// Recv implements coll.Exchange. A combining receive from a transport that
// combines where the message lies (shared memory) copies nothing; from
// another it combines from the transport's buffer, which is a copy of the
// message already (so no scratch buffer either).
func (x *exchange) Recv(ctx context.Context, from int, dst []byte, red coll.Reducer) error {
	g := x.g
	t, r, tag := g.d.t, g.global(from), g.tag+tagColl
	if red.Combine == nil {
		h, n, err := t.RecvInto(ctx, r, tag, dst)
		return x.checkReceived(r, h, n, len(dst), err)
	}
	if rr, ok := t.(transport.ReduceReceiver); ok {
		h, n, err := rr.RecvReduce(ctx, r, tag, dst, red.Size, red.Combine)
		return x.checkReceived(r, h, n, len(dst), err)
	}
	m, err := t.Recv(ctx, r, tag)
	if err != nil {
		return err
	}
	err = x.checkReceived(r, m.Header, len(m.Payload), len(dst), nil)
	if err == nil {
		red.Combine(dst, m.Payload)
	}
	t.Release(m.Payload)
	return err
}

// checkReceived checks what a receive from job rank r returned: n bytes
// with header h, where want were expected.
func (x *exchange) checkReceived(r int, h transport.Header, n, want int, err error) error {
	g := x.g
	if err == nil {
		g.d.obs.met.Received(r, n)
	}
	if err != nil && !errors.Is(err, transport.ErrMessageTooLong) {
		return err
	}
	if wire, fp := parseHeader(h); wire != g.cur.wire || fp != g.cur.fp {
		return g.desync(r, wire, fp)
	}
	if err != nil || n != want {
		return &PeerError{Rank: r, Op: g.opName(g.cur.kind),
			Err: fmt.Errorf("%w: message of %d bytes, want %d", ErrProtocol, n, want)}
	}
	return nil
}
