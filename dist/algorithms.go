package dist

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

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

// The algorithms run one collective at a time (the group serialises them), so
// they read the running collective's sequence number and fingerprint from
// g.cur. Messages longer than the segment size are cut into segments, sent
// and received alternately, which overlaps reduction with transfer, bounds
// what is queued on any link, and keeps every message far below a
// transport's frame limit. An empty buffer still travels as one empty
// message, so the message pattern never depends on the data.
//
// Desync detection. Every message carries the collective's sequence number
// and fingerprint, and every algorithm obeys two rules: (1) before its first
// receive, a rank sends a message to rank r+1 (mod n), and nothing it does
// before that can block; (2) its first receive is from rank r-1. The ring
// algorithms and the dissemination barrier start that way by themselves; the
// others (recursive doubling for n > 2, trees, chains) start by sending an
// empty "announce" message to r+1 and receive the one from r-1 just before
// their first real receive (or at the end, if they have none), so it travels
// concurrently with their first step. Whatever two disagreeing ranks called,
// two neighbours disagree, and the right one's first receive returns the left
// one's first message, fingerprint and all: the disagreement is found before
// any rank can wait for a message that will never come. The detecting rank
// aborts the group and tells everyone. The hierarchical collectives (hier.go)
// run these algorithms over sub-groups of ranks (comm) without announce
// messages, after announcing themselves on the whole group in the same way.

// send sends one collective message to rank `to`.
func (g *ProcessGroup) send(ctx context.Context, to int, p []byte) error {
	err := g.t.Send(ctx, to, tagColl, collHeader(g.cur.wire, g.cur.fp), p)
	if err == nil {
		g.obs.met.Sent(to, len(p))
	}
	return err
}

// recvInto receives one collective message of exactly len(dst) bytes from
// rank `from` into dst. A message from another collective is a
// *DesyncError; one of another length a protocol error.
func (g *ProcessGroup) recvInto(ctx context.Context, from int, dst []byte) error {
	h, n, err := g.t.RecvInto(ctx, from, tagColl, dst)
	return g.checkReceived(from, h, n, len(dst), err)
}

// recvMsg receives one collective message of exactly n bytes from rank
// `from` and returns its payload, which the caller owns and hands back with
// g.t.Release. Unlike recvInto it takes the transport's buffer as it is: a
// message that is already queued (the usual case in a ring, where the
// sender runs ahead) is reduced from where it lies instead of being copied
// into a scratch buffer first.
func (g *ProcessGroup) recvMsg(ctx context.Context, from, n int) ([]byte, error) {
	m, err := g.t.Recv(ctx, from, tagColl)
	if err != nil {
		return nil, err
	}
	g.obs.met.Received(from, len(m.Payload))
	if wire, fp := parseHeader(m.Header); wire != g.cur.wire || fp != g.cur.fp {
		g.t.Release(m.Payload)
		return nil, g.desync(from, wire, fp)
	}
	if len(m.Payload) != n {
		got := len(m.Payload)
		g.t.Release(m.Payload)
		return nil, &PeerError{Rank: from, Op: g.cur.kind.String(),
			Err: fmt.Errorf("%w: message of %d bytes, want %d", ErrProtocol, got, n)}
	}
	return m.Payload, nil
}

// nseg is the number of segments of an n-byte buffer (1 for an empty one).
func (g *ProcessGroup) nseg(n int) int { return max(1, (n+g.cfg.segment-1)/g.cfg.segment) }

// seg returns segment k of b.
func (g *ProcessGroup) seg(b []byte, k int) []byte {
	lo := k * g.cfg.segment
	return b[lo:min(lo+g.cfg.segment, len(b))]
}

// comm is the set of ranks an algorithm runs over: n members, this rank
// being member me, member i being global rank ranks[i] (nil: member i is
// rank i, the whole group). The algorithms number ranks by member index and
// send and receive through at, so the same code runs over the group and over
// the sub-groups of the hierarchical collectives (hier.go). A sub-group's
// algorithms send no announce messages: the hierarchical collective
// announces itself on the whole group before any of its phases receives.
type comm struct {
	n, me int
	ranks []int
	sub   bool // a sub-group: no announce messages
}

// at returns the global rank of member i.
func (c comm) at(i int) int {
	if c.ranks == nil {
		return i
	}
	return c.ranks[i]
}

// flat returns the comm of the whole group.
func (g *ProcessGroup) flat() comm { return comm{n: g.world, me: g.rank} }

// annSend sends the empty announce message to rank r+1 (see "Desync
// detection" above). In a sub-group it does nothing.
func (g *ProcessGroup) annSend(ctx context.Context, c comm) error {
	if c.sub {
		return nil
	}
	return g.send(ctx, c.at((c.me+1)%c.n), nil)
}

// annRecv receives and checks the announce message from rank r-1. In a
// sub-group it does nothing.
func (g *ProcessGroup) annRecv(ctx context.Context, c comm) error {
	if c.sub {
		return nil
	}
	return g.recvInto(ctx, c.at((c.me+c.n-1)%c.n), nil)
}

// Receive modes.
const (
	modeCopy   = iota // copy the message into the buffer
	modeReduce        // combine it into the buffer
)

// recvStore receives segment dst from rank `from` according to mode: in
// copy mode straight into dst, in reduce mode combined into dst from the
// transport's buffer.
func (g *ProcessGroup) recvStore(ctx context.Context, from int, dst []byte, mode int, red reducer) error {
	if mode != modeReduce {
		return g.recvInto(ctx, from, dst)
	}
	if rr, ok := g.t.(transport.ReduceReceiver); ok && int(red.dt) < len(combiners) && int(red.op) < len(combiners[0]) {
		// Combined where the message lies (shared memory): no copy at all.
		h, n, err := rr.RecvReduce(ctx, from, tagColl, dst, red.dt.Size(), combiners[red.dt][red.op])
		return g.checkReceived(from, h, n, len(dst), err)
	}
	p, err := g.recvMsg(ctx, from, len(dst))
	if err != nil {
		return err
	}
	red.into(dst, p)
	g.t.Release(p)
	return nil
}

// checkReceived checks what RecvInto or RecvReduce returned: n bytes
// with header h from rank `from`, where want were expected. A message from
// another collective is a *DesyncError; one of another length a protocol
// error.
func (g *ProcessGroup) checkReceived(from int, h transport.Header, n, want int, err error) error {
	if err == nil {
		g.obs.met.Received(from, n)
	}
	wire, fp := parseHeader(h)
	if err != nil && !errors.Is(err, transport.ErrMessageTooLong) {
		return err
	}
	if wire != g.cur.wire || fp != g.cur.fp {
		return g.desync(from, wire, fp)
	}
	if err != nil || n != want {
		return &PeerError{Rank: from, Op: g.cur.kind.String(),
			Err: fmt.Errorf("%w: message of %d bytes, want %d", ErrProtocol, n, want)}
	}
	return nil
}

// combiners holds reducer.into of every (dtype, op) as a transport.Combine,
// made once so that passing one to RecvReduce does not allocate.
var combiners = func() (c [F64 + 1][Prod + 1]transport.Combine) {
	for dt := range c {
		for op := range c[dt] {
			r := reducer{dt: DType(dt), op: ReduceOp(op)}
			c[dt][op] = r.into
		}
	}
	return c
}()

// exchange sends snd to member `to` of c while receiving rcv from member
// `from`, segment by segment, storing what arrives according to mode. With
// ann, it receives the announce message before its first receive.
func (g *ProcessGroup) exchange(ctx context.Context, c comm, to int, snd []byte, from int, rcv []byte, mode int, red reducer, ann bool) error {
	ns, nr := g.nseg(len(snd)), g.nseg(len(rcv))
	to, from = c.at(to), c.at(from)
	for k := range max(ns, nr) {
		if k < ns {
			if err := g.send(ctx, to, g.seg(snd, k)); err != nil {
				return err
			}
		}
		if ann && k == 0 {
			if err := g.annRecv(ctx, c); err != nil {
				return err
			}
		}
		if k < nr {
			if err := g.recvStore(ctx, from, g.seg(rcv, k), mode, red); err != nil {
				return err
			}
		}
	}
	return nil
}

// sendAll sends b to member `to` of c in segments.
func (g *ProcessGroup) sendAll(ctx context.Context, c comm, to int, b []byte) error {
	to = c.at(to)
	for k := range g.nseg(len(b)) {
		if err := g.send(ctx, to, g.seg(b, k)); err != nil {
			return err
		}
	}
	return nil
}

// recvAll receives b from member `from` of c in segments. With ann, it
// first receives the announce message.
func (g *ProcessGroup) recvAll(ctx context.Context, c comm, from int, b []byte, mode int, red reducer, ann bool) error {
	if ann {
		if err := g.annRecv(ctx, c); err != nil {
			return err
		}
	}
	from = c.at(from)
	for k := range g.nseg(len(b)) {
		if err := g.recvStore(ctx, from, g.seg(b, k), mode, red); err != nil {
			return err
		}
	}
	return nil
}

// allReduceRD is recursive doubling: ceil(log2 n) rounds in which each rank
// swaps its whole partial result with the rank whose number differs in one
// bit and combines the two. With p the largest power of two <= n, the n-p
// "extra" ranks first fold their vectors into ranks 0..n-p-1 and get the
// result back at the end (two more rounds). Partners hold bitwise equal
// partials and combine them with a commutative operation, so every rank ends
// with the same bits. Ranks are c's members.
func (g *ProcessGroup) allReduceRD(ctx context.Context, c comm, data []byte, red reducer) error {
	n, r := c.n, c.me
	ann := n > 2 // for n == 2 the first exchange is with r+1 == r-1
	if ann {
		if err := g.annSend(ctx, c); err != nil {
			return err
		}
	}
	p2 := 1
	for p2*2 <= n {
		p2 *= 2
	}
	if r >= p2 { // extra rank: fold in, then wait for the result
		if err := g.sendAll(ctx, c, r-p2, data); err != nil {
			return err
		}
		return g.recvAll(ctx, c, r-p2, data, modeCopy, red, ann)
	}
	if r < n-p2 {
		if err := g.recvAll(ctx, c, r+p2, data, modeReduce, red, ann); err != nil {
			return err
		}
		ann = false
	}
	for mask := 1; mask < p2; mask <<= 1 {
		// Sending and combining the same buffer is safe: exchange sends
		// segment k before it combines the peer's segment k into it.
		peer := r ^ mask
		if err := g.exchange(ctx, c, peer, data, peer, data, modeReduce, red, ann); err != nil {
			return err
		}
		ann = false
	}
	red.finish(data, n)
	if r < n-p2 {
		return g.sendAll(ctx, c, r+p2, data)
	}
	return nil
}

// chunk returns block i (mod n) of a count-element buffer split into n
// nearly equal blocks of es-byte elements: block i holds elements
// [i*count/n, (i+1)*count/n).
func chunk(b []byte, es, n, i int) []byte {
	i = ((i % n) + n) % n
	count := len(b) / es
	lo, hi := i*count/n, (i+1)*count/n
	return b[lo*es : hi*es]
}

// allReduceRing is the ring all-reduce: a reduce-scatter (n-1 steps; after
// step s rank r holds the sum of s+2 ranks' block r-s-1) followed by an
// all-gather (n-1 steps) of the reduced blocks. Each rank sends and receives
// 2(n-1)/n of the vector. Each block is reduced in a fixed order by one rank
// and then copied, so every rank gets the same bits. Ranks are c's members.
func (g *ProcessGroup) allReduceRing(ctx context.Context, c comm, data []byte, es int, red reducer) error {
	n, r := c.n, c.me
	next, prev := (r+1)%n, (r+n-1)%n
	for s := range n - 1 {
		if err := g.exchange(ctx, c, next, chunk(data, es, n, r-s), prev, chunk(data, es, n, r-s-1), modeReduce, red, false); err != nil {
			return err
		}
	}
	red.finish(chunk(data, es, n, r+1), n)
	for s := range n - 1 {
		if err := g.exchange(ctx, c, next, chunk(data, es, n, r+1-s), prev, chunk(data, es, n, r-s), modeCopy, red, false); err != nil {
			return err
		}
	}
	return nil
}

// allGatherRing: in step s rank r passes block r-s on to r+1 and receives
// block r-s-1 from r-1.
func (g *ProcessGroup) allGatherRing(ctx context.Context, c comm, dst, src []byte) error {
	n, r := c.n, c.me
	b := len(src)
	copy(dst[r*b:(r+1)*b], src)
	next, prev := (r+1)%n, (r+n-1)%n
	block := func(i int) []byte {
		i = ((i % n) + n) % n
		return dst[i*b : (i+1)*b]
	}
	for s := range n - 1 {
		if err := g.exchange(ctx, c, next, block(r-s), prev, block(r-s-1), modeCopy, reducer{}, false); err != nil {
			return err
		}
	}
	return nil
}

// reduceScatterRing: in step s rank r sends its partial of block r-s-1 to
// r+1 and receives r-1's partial of block r-s-2, to which it adds its own
// contribution; after n-1 steps the block received is r, complete. Partials
// live in a scratch block of the group's, so src is left untouched.
func (g *ProcessGroup) reduceScatterRing(ctx context.Context, c comm, dst, src []byte, red reducer) error {
	n, r := c.n, c.me
	b := len(dst)
	next, prev := c.at((r+1)%n), c.at((r+n-1)%n)
	block := func(i int) []byte {
		i = ((i % n) + n) % n
		return src[i*b : (i+1)*b]
	}
	if cap(g.partial) < b {
		g.partial = make([]byte, b)
	}
	scratch := g.partial[:b]
	for s := range n - 1 {
		out := scratch
		if s == 0 {
			out = block(r - 1)
		}
		acc := scratch
		if s == n-2 {
			acc = dst
		}
		mine := block(r - s - 2)
		for k := range g.nseg(b) {
			if err := g.send(ctx, next, g.seg(out, k)); err != nil {
				return err
			}
			// acc's segment k went out above (or is dst), so it can take
			// the incoming partial in place.
			d := g.seg(acc, k)
			if err := g.recvInto(ctx, prev, d); err != nil {
				return err
			}
			red.into(d, g.seg(mine, k))
		}
	}
	red.finish(dst, n)
	return nil
}

// broadcastTree is a binomial tree rooted at member root of c: ceil(log2 n)
// rounds.
func (g *ProcessGroup) broadcastTree(ctx context.Context, c comm, data []byte, root int) error {
	if err := g.annSend(ctx, c); err != nil {
		return err
	}
	n := c.n
	vr := (c.me - root + n) % n
	real := func(v int) int { return (v + root) % n }
	mask := 1
	for mask < n {
		if vr&mask != 0 {
			if err := g.recvAll(ctx, c, real(vr-mask), data, modeCopy, reducer{}, true); err != nil {
				return err
			}
			break
		}
		mask <<= 1
	}
	for mask >>= 1; mask > 0; mask >>= 1 {
		if vr+mask < n {
			if err := g.sendAll(ctx, c, real(vr+mask), data); err != nil {
				return err
			}
		}
	}
	if vr == 0 {
		return g.annRecv(ctx, c)
	}
	return nil
}

// broadcastChain pipelines segments down the chain root, root+1, ... (c's
// members), so every link carries the vector once, concurrently.
func (g *ProcessGroup) broadcastChain(ctx context.Context, c comm, data []byte, root int) error {
	if err := g.annSend(ctx, c); err != nil {
		return err
	}
	n, r := c.n, c.me
	vr := (r - root + n) % n
	next, prev := c.at((r+1)%n), c.at((r+n-1)%n)
	if vr == 0 {
		if err := g.sendAll(ctx, c, (r+1)%n, data); err != nil {
			return err
		}
		return g.annRecv(ctx, c)
	}
	if err := g.annRecv(ctx, c); err != nil {
		return err
	}
	for k := range g.nseg(len(data)) {
		d := g.seg(data, k)
		if err := g.recvInto(ctx, prev, d); err != nil {
			return err
		}
		if vr < n-1 {
			if err := g.send(ctx, next, d); err != nil {
				return err
			}
		}
	}
	return nil
}

// reduceTree is a binomial tree reduction to member root of c. Inner ranks
// combine into a scratch buffer of the group's, so only root's data changes.
func (g *ProcessGroup) reduceTree(ctx context.Context, c comm, data []byte, root int, red reducer) error {
	if err := g.annSend(ctx, c); err != nil {
		return err
	}
	n := c.n
	vr := (c.me - root + n) % n
	real := func(v int) int { return (v + root) % n }
	acc := data
	if vr != 0 {
		if cap(g.partial) < len(data) {
			g.partial = make([]byte, len(data))
		}
		acc = g.partial[:len(data)]
		copy(acc, data)
	}
	ann := true
	for mask := 1; mask < n; mask <<= 1 {
		if vr&mask != 0 {
			if err := g.sendAll(ctx, c, real(vr-mask), acc); err != nil {
				return err
			}
			break
		}
		if vr+mask < n {
			if err := g.recvAll(ctx, c, real(vr+mask), acc, modeReduce, red, ann); err != nil {
				return err
			}
			ann = false
		}
	}
	if ann { // a leaf: it received nothing
		if err := g.annRecv(ctx, c); err != nil {
			return err
		}
	}
	if vr == 0 {
		red.finish(acc, n)
	}
	return nil
}

// reduceChain pipelines segments up the chain root-1, root-2, ..., root+1 ->
// root (c's members): each rank adds its contribution to the partial passing
// through.
func (g *ProcessGroup) reduceChain(ctx context.Context, c comm, data []byte, root int, red reducer) error {
	if err := g.annSend(ctx, c); err != nil {
		return err
	}
	n, r := c.n, c.me
	vr := (r - root + n) % n
	to, from := c.at((r+n-1)%n), c.at((r+1)%n)
	if vr == n-1 {
		if err := g.sendAll(ctx, c, (r+n-1)%n, data); err != nil {
			return err
		}
		return g.annRecv(ctx, c)
	}
	if err := g.annRecv(ctx, c); err != nil {
		return err
	}
	for k := range g.nseg(len(data)) {
		d := g.seg(data, k)
		p, err := g.recvMsg(ctx, from, len(d))
		if err != nil {
			return err
		}
		if vr == 0 {
			red.into(d, p)
		} else {
			red.into(p, d)
			err = g.send(ctx, to, p)
		}
		g.t.Release(p)
		if err != nil {
			return err
		}
	}
	if vr == 0 {
		red.finish(data, n)
	}
	return nil
}

// barrier is a dissemination barrier: in round k every rank signals rank
// r+2^k and waits for rank r-2^k; after ceil(log2 n) rounds every rank has
// heard, directly or not, from every other.
func (g *ProcessGroup) barrier(ctx context.Context) error {
	n, r := g.world, g.rank
	for d := 1; d < n; d <<= 1 {
		if err := g.send(ctx, (r+d)%n, nil); err != nil {
			return err
		}
		if err := g.recvInto(ctx, (r-d+n)%n, nil); err != nil {
			return err
		}
	}
	return nil
}
