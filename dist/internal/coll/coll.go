// Package coll holds gdist's collective algorithms, free of I/O and of any
// group state: each is a function over an Exchange (send a message to a
// member, receive or combine a message from a member) and a Comm (how many
// members, which one this is). package dist runs them over a transport;
// the tests run them over a simulated network (package colltest) that
// reorders deliveries at random and checks them against naive references.
//
// Every algorithm cuts messages longer than the segment size into
// segments, sends an empty buffer as one empty message (so the message
// pattern never depends on the data) and fixes its reduction order, so
// every member ends with the same bits.
//
// # Desync detection
//
// The caller tags every message with the collective's sequence number and
// fingerprint, so a member that called another collective is found at the
// first message it exchanges with a member that did not. Every algorithm
// obeys two rules so that such a message is always exchanged before anyone
// can wait forever: (1) before its first receive, a member sends a message
// to member me+1 (mod n), and nothing it does before that can block; (2)
// its first receive is from member me-1. The ring algorithms, the
// pairwise all-to-all and the dissemination barrier start that way by
// themselves; the others (recursive doubling for n > 2, trees, chains,
// gather, scatter) first send an empty "announce" message to me+1 and
// receive the one from me-1 just before their first real receive. The
// hierarchical collectives announce themselves once on the whole comm and
// run their phases over sub-comms without announce messages.
package coll

import (
	"context"
	"errors"
)

// ErrProtocol means a peer sent a message that breaks a collective's
// protocol, such as a message of the wrong length. package dist exports it
// as dist.ErrProtocol.
var ErrProtocol = errors.New("dist: protocol violation")

// Exchange moves one collective's messages between the members of a
// group, addressed by member index. Messages from one member arrive in the
// order it sent them. An implementation tags them with the running
// collective, so that a message of another collective is an error (a
// desync) rather than data.
type Exchange interface {
	// Send sends p to member to. It returns once p may be reused; an empty
	// p is still one message.
	Send(ctx context.Context, to int, p []byte) error
	// Recv receives the next message from member from, which must be
	// exactly len(dst) bytes long (else an error wrapping ErrProtocol):
	// with red.Combine nil it copies the message into dst, otherwise it
	// sets dst = dst op message element by element (red.Combine(dst, msg)).
	Recv(ctx context.Context, from int, dst []byte, red Reducer) error
}

// StreamExchange is implemented by an Exchange that can send a message
// with its payload written past the sender's caches
// (transport.StreamSender); allReducePair uses it where that is measured
// to be faster.
type StreamExchange interface {
	// SendStream is Send, streamed where the transport can.
	SendStream(ctx context.Context, to int, p []byte) error
}

// Reducer is how a reduction combines buffers of one element type. Its
// zero value means "no reduction": Exchange.Recv copies.
type Reducer struct {
	// Size is the size of one element in bytes.
	Size int
	// Combine sets dst = dst op src element by element (len(src) ==
	// len(dst), a whole number of elements). Mean combines as Sum.
	Combine func(dst, src []byte)
	// Finish completes a reduction of n contributions in dst (Mean divides
	// by n); nil for the other operations.
	Finish func(dst []byte, n int)
}

func (r Reducer) finish(dst []byte, n int) {
	if r.Finish != nil {
		r.Finish(dst, n)
	}
}

// partial is r without its Finish: the phases of a hierarchical
// collective combine partial sums, and only the whole is finished.
func (r Reducer) partial() Reducer {
	r.Finish = nil
	return r
}

// copying is the zero Reducer: Recv copies.
var copying Reducer

// Comm is the set of members an algorithm runs over: N of them, this one
// being Me; member i is Exchange address at(i). A Comm made by World
// addresses members directly; the hierarchical collectives run their
// phases over sub-comms that map their members to the group's and send no
// announce messages.
type Comm struct {
	N, Me int
	ranks []int // member i is Exchange address ranks[i]; nil: i
	sub   bool  // a phase of a larger collective: no announce messages
}

// World returns the Comm of n members in which this one is me.
func World(n, me int) Comm { return Comm{N: n, Me: me} }

// at returns the Exchange address of member i.
func (c Comm) at(i int) int {
	if c.ranks == nil {
		return i
	}
	return c.ranks[i]
}

// next and prev are the members after and before this one on the ring.
func (c Comm) next() int { return (c.Me + 1) % c.N }
func (c Comm) prev() int { return (c.Me + c.N - 1) % c.N }

// Net runs the algorithms over an Exchange. One Net serves one group and
// runs one collective at a time; it keeps scratch buffers between calls,
// so steady-state collectives allocate nothing.
type Net struct {
	Ex Exchange
	// Segment is the largest message the algorithms send: longer buffers
	// go in segments, so that reduction overlaps transfer. A positive
	// multiple of 8.
	Segment int
	// Small is the buffer size, in bytes, below which the latency-optimal
	// algorithms (recursive doubling, binomial trees) are used.
	Small int
	// SmallPair is Small for all-reduce between 2 members, where recursive
	// doubling and the ring move the same bytes and recursive doubling
	// needs one exchange instead of two.
	SmallPair int
	// PairSegment, when positive, is the segment size of the all-reduce
	// between 2 members from Small bytes up (allReducePair), which replaces
	// recursive doubling and the ring there. Set it when the 2 members
	// share memory: it sends twice as many messages, each costing more
	// than the bytes it saves over a network. A positive multiple of 8.
	PairSegment int
	// Hier is the plan of the hierarchical all-reduce and broadcast, nil
	// when they run flat (see NewPlan).
	Hier *Plan

	pair    pairChoice // allReducePair's choice of streamed or plain sends
	scratch []byte     // partial results of reduce_scatter and reduce
	offs    []int      // byte offsets of the uneven collectives' blocks
}

// buf returns n bytes of the Net's scratch buffer.
func (nt *Net) buf(n int) []byte {
	if cap(nt.scratch) < n {
		nt.scratch = make([]byte, n)
	}
	return nt.scratch[:n]
}

// nseg is the number of segments of an n-byte buffer (1 for an empty one).
func (nt *Net) nseg(n int) int { return max(1, (n+nt.Segment-1)/nt.Segment) }

// seg returns segment k of b.
func (nt *Net) seg(b []byte, k int) []byte {
	lo := k * nt.Segment
	return b[lo:min(lo+nt.Segment, len(b))]
}

func (nt *Net) send(ctx context.Context, c Comm, to int, p []byte) error {
	return nt.Ex.Send(ctx, c.at(to), p)
}

func (nt *Net) recv(ctx context.Context, c Comm, from int, dst []byte, red Reducer) error {
	return nt.Ex.Recv(ctx, c.at(from), dst, red)
}

// annSend sends the empty announce message to member me+1 (see "Desync
// detection"). In a sub-comm it does nothing.
func (nt *Net) annSend(ctx context.Context, c Comm) error {
	if c.sub {
		return nil
	}
	return nt.send(ctx, c, c.next(), nil)
}

// annRecv receives the announce message from member me-1. In a sub-comm
// it does nothing.
func (nt *Net) annRecv(ctx context.Context, c Comm) error {
	if c.sub {
		return nil
	}
	return nt.recv(ctx, c, c.prev(), nil, copying)
}

// exchange sends snd to member to while receiving rcv from member from,
// segment by segment, storing what arrives as red says. With ann, it
// receives the announce message before its first receive. Sending and
// combining into the same buffer is safe: segment k goes out before the
// peer's segment k is combined into it.
func (nt *Net) exchange(ctx context.Context, c Comm, to int, snd []byte, from int, rcv []byte, red Reducer, ann bool) error {
	ns, nr := nt.nseg(len(snd)), nt.nseg(len(rcv))
	for k := range max(ns, nr) {
		if k < ns {
			if err := nt.send(ctx, c, to, nt.seg(snd, k)); err != nil {
				return err
			}
		}
		if ann && k == 0 {
			if err := nt.annRecv(ctx, c); err != nil {
				return err
			}
		}
		if k < nr {
			if err := nt.recv(ctx, c, from, nt.seg(rcv, k), red); err != nil {
				return err
			}
		}
	}
	return nil
}

// sendAll sends b to member to in segments.
func (nt *Net) sendAll(ctx context.Context, c Comm, to int, b []byte) error {
	for k := range nt.nseg(len(b)) {
		if err := nt.send(ctx, c, to, nt.seg(b, k)); err != nil {
			return err
		}
	}
	return nil
}

// recvAll receives b from member from in segments. With ann, it first
// receives the announce message.
func (nt *Net) recvAll(ctx context.Context, c Comm, from int, b []byte, red Reducer, ann bool) error {
	if ann {
		if err := nt.annRecv(ctx, c); err != nil {
			return err
		}
	}
	for k := range nt.nseg(len(b)) {
		if err := nt.recv(ctx, c, from, nt.seg(b, k), red); err != nil {
			return err
		}
	}
	return nil
}

// mod returns i mod n in [0, n).
func mod(i, n int) int { return ((i % n) + n) % n }
