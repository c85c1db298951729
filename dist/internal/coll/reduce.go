package coll

import (
	"context"
	"time"
)

// AllReduce combines data element by element across c's members and leaves
// the result in data on each of them: hierarchically when the Net has a
// plan, else by recursive doubling below Small bytes (SmallPair for 2
// members) and by the ring above; between 2 members that share memory
// (PairSegment > 0), by allReducePair from Small bytes.
func (nt *Net) AllReduce(ctx context.Context, c Comm, data []byte, red Reducer) error {
	if c.N == 1 {
		red.finish(data, 1)
		return nil
	}
	if nt.Hier != nil {
		return nt.allReduceHier(ctx, c, data, red)
	}
	if c.N == 2 && nt.PairSegment > 0 && len(data) >= nt.Small {
		return nt.allReducePair(ctx, c, data, red)
	}
	if len(data) < nt.Small || (c.N == 2 && len(data) < nt.SmallPair) {
		return nt.allReduceRD(ctx, c, data, red)
	}
	return nt.allReduceRing(ctx, c, data, red)
}

// ReduceScatter reduces src element by element across the members and
// gives member i block i of the result in dst: len(src) == N*len(dst).
// src is left untouched.
func (nt *Net) ReduceScatter(ctx context.Context, c Comm, dst, src []byte, red Reducer) error {
	if c.N == 1 {
		copy(dst, src)
		red.finish(dst, 1)
		return nil
	}
	return nt.reduceScatterRing(ctx, c, dst, src, red)
}

// Reduce combines data across the members and leaves the result in
// member root's data; the others' data is left unchanged. Binomial tree
// below Small bytes, pipelined chain above.
func (nt *Net) Reduce(ctx context.Context, c Comm, data []byte, root int, red Reducer) error {
	if c.N == 1 {
		red.finish(data, 1)
		return nil
	}
	if len(data) < nt.Small {
		return nt.reduceTree(ctx, c, data, root, red)
	}
	return nt.reduceChain(ctx, c, data, root, red)
}

// allReduceRD is recursive doubling: ceil(log2 n) rounds in which each
// member swaps its whole partial result with the member whose number
// differs in one bit and combines the two. With p the largest power of two
// <= n, the n-p "extra" members first fold their vectors into members
// 0..n-p-1 and get the result back at the end (two more rounds). Partners
// hold bitwise equal partials and combine them with a commutative
// operation, so every member ends with the same bits.
func (nt *Net) allReduceRD(ctx context.Context, c Comm, data []byte, red Reducer) error {
	n, r := c.N, c.Me
	ann := n > 2 // for n == 2 the first exchange is with r+1 == r-1
	if ann {
		if err := nt.annSend(ctx, c); err != nil {
			return err
		}
	}
	p2 := 1
	for p2*2 <= n {
		p2 *= 2
	}
	if r >= p2 { // extra member: fold in, then wait for the result
		if err := nt.sendAll(ctx, c, r-p2, data); err != nil {
			return err
		}
		return nt.recvAll(ctx, c, r-p2, data, copying, ann)
	}
	if r < n-p2 {
		if err := nt.recvAll(ctx, c, r+p2, data, red, ann); err != nil {
			return err
		}
		ann = false
	}
	for mask := 1; mask < p2; mask <<= 1 {
		peer := r ^ mask
		if err := nt.exchange(ctx, c, peer, data, peer, data, red, ann); err != nil {
			return err
		}
		ann = false
	}
	red.finish(data, n)
	if r < n-p2 {
		return nt.sendAll(ctx, c, r+p2, data)
	}
	return nil
}

// chunk returns block i (mod n) of a buffer of es-byte elements split into
// n nearly equal blocks: block i holds elements [i*count/n, (i+1)*count/n).
func chunk(b []byte, es, n, i int) []byte {
	i = mod(i, n)
	count := len(b) / es
	lo, hi := i*count/n, (i+1)*count/n
	return b[lo*es : hi*es]
}

// allReduceRing is the ring all-reduce: a reduce-scatter (n-1 steps; after
// step s member r holds the combination of s+2 members' block r-s-1)
// followed by an all-gather (n-1 steps) of the reduced blocks. Each member
// sends and receives 2(n-1)/n of the vector. Each block is reduced in a
// fixed order by one member and then copied, so every member gets the same
// bits.
func (nt *Net) allReduceRing(ctx context.Context, c Comm, data []byte, red Reducer) error {
	n, r, es := c.N, c.Me, red.Size
	next, prev := c.next(), c.prev()
	for s := range n - 1 {
		if err := nt.exchange(ctx, c, next, chunk(data, es, n, r-s), prev, chunk(data, es, n, r-s-1), red, false); err != nil {
			return err
		}
	}
	red.finish(chunk(data, es, n, r+1), n)
	for s := range n - 1 {
		if err := nt.exchange(ctx, c, next, chunk(data, es, n, r+1-s), prev, chunk(data, es, n, r-s), copying, false); err != nil {
			return err
		}
	}
	return nil
}

// reduceScatterRing: in step s member r sends its partial of block r-s-1
// to r+1 and receives r-1's partial of block r-s-2, to which it adds its
// own contribution; after n-1 steps the block received is r, complete.
// Partials live in the Net's scratch buffer, so src is left untouched.
func (nt *Net) reduceScatterRing(ctx context.Context, c Comm, dst, src []byte, red Reducer) error {
	n, r := c.N, c.Me
	b := len(dst)
	next, prev := c.next(), c.prev()
	block := func(i int) []byte {
		i = mod(i, n)
		return src[i*b : (i+1)*b]
	}
	scratch := nt.buf(b)
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
		for k := range nt.nseg(b) {
			if err := nt.send(ctx, c, next, nt.seg(out, k)); err != nil {
				return err
			}
			// acc's segment k went out above (or is dst), so it can take
			// the incoming partial in place.
			d := nt.seg(acc, k)
			if err := nt.recv(ctx, c, prev, d, copying); err != nil {
				return err
			}
			red.Combine(d, nt.seg(mine, k))
		}
	}
	red.finish(dst, n)
	return nil
}

// reduceTree is a binomial tree reduction to member root. Inner members
// combine into the Net's scratch buffer, so only root's data changes.
func (nt *Net) reduceTree(ctx context.Context, c Comm, data []byte, root int, red Reducer) error {
	if err := nt.annSend(ctx, c); err != nil {
		return err
	}
	n := c.N
	vr := mod(c.Me-root, n)
	real := func(v int) int { return (v + root) % n }
	acc := data
	if vr != 0 {
		acc = nt.buf(len(data))
		copy(acc, data)
	}
	ann := true
	for mask := 1; mask < n; mask <<= 1 {
		if vr&mask != 0 {
			if err := nt.sendAll(ctx, c, real(vr-mask), acc); err != nil {
				return err
			}
			break
		}
		if vr+mask < n {
			if err := nt.recvAll(ctx, c, real(vr+mask), acc, red, ann); err != nil {
				return err
			}
			ann = false
		}
	}
	if ann { // a leaf: it received nothing
		if err := nt.annRecv(ctx, c); err != nil {
			return err
		}
	}
	if vr == 0 {
		red.finish(acc, n)
	}
	return nil
}

// reduceChain pipelines segments up the chain root-1, root-2, ...,
// root+1 -> root: each member adds its contribution to the partial passing
// through (partial op own, in that order), which travels through the
// Net's scratch buffer.
func (nt *Net) reduceChain(ctx context.Context, c Comm, data []byte, root int, red Reducer) error {
	if err := nt.annSend(ctx, c); err != nil {
		return err
	}
	n := c.N
	vr := mod(c.Me-root, n)
	to, from := c.prev(), c.next()
	if vr == n-1 {
		if err := nt.sendAll(ctx, c, to, data); err != nil {
			return err
		}
		return nt.annRecv(ctx, c)
	}
	if err := nt.annRecv(ctx, c); err != nil {
		return err
	}
	var scratch []byte
	if vr != 0 {
		scratch = nt.buf(min(len(data), nt.Segment))
	}
	for k := range nt.nseg(len(data)) {
		d := nt.seg(data, k)
		if vr == 0 {
			if err := nt.recv(ctx, c, from, d, red); err != nil {
				return err
			}
			continue
		}
		p := scratch[:len(d)]
		if err := nt.recv(ctx, c, from, p, copying); err != nil {
			return err
		}
		red.Combine(p, d)
		if err := nt.send(ctx, c, to, p); err != nil {
			return err
		}
	}
	if vr == 0 {
		red.finish(data, n)
	}
	return nil
}

// allReducePair is the all-reduce between 2 members that share memory: a
// reduce-scatter and an all-gather interleaved segment by segment. For
// each segment of PairSegment bytes, member r sends its contribution to
// the peer's block, combines the peer's contribution to block r into
// data, sends the combined segment back while it is still in its cache,
// and receives the peer's combined segment. Each member moves half the
// vector each way, as in the ring; against recursive doubling, which moves
// the whole vector once, it combines half as much and copies segments
// small enough to stay in the caches. Block r is combined by member r
// only, so both members end with the same bits.
//
// Where the Exchange can stream (StreamExchange), the segments go
// streamed or plainly as pairChoice measures faster for the size; the time
// counts from the first combined segment, past any wait for the peer to
// arrive.
func (nt *Net) allReducePair(ctx context.Context, c Comm, data []byte, red Reducer) error {
	peer := 1 - c.Me
	mine, theirs := chunk(data, red.Size, 2, c.Me), chunk(data, red.Size, 2, peer)
	seg := nt.PairSegment
	part := func(b []byte, k int) []byte {
		lo := min(k*seg, len(b))
		return b[lo:min(lo+seg, len(b))]
	}
	sx, _ := nt.Ex.(StreamExchange)
	class, stream := nt.pair.pick(len(data))
	stream = stream && sx != nil
	send := func(p []byte) error {
		if stream {
			return sx.SendStream(ctx, c.at(peer), p)
		}
		return nt.send(ctx, c, peer, p)
	}
	var start time.Time
	for k := range max(1, (len(mine)+seg-1)/seg, (len(theirs)+seg-1)/seg) {
		if err := send(part(theirs, k)); err != nil {
			return err
		}
		m := part(mine, k)
		if err := nt.recv(ctx, c, peer, m, red); err != nil {
			return err
		}
		if k == 0 && sx != nil {
			start = time.Now()
		}
		red.finish(m, 2)
		if err := send(m); err != nil {
			return err
		}
		if err := nt.recv(ctx, c, peer, part(theirs, k), copying); err != nil {
			return err
		}
	}
	if sx != nil {
		nt.pair.record(class, stream, time.Since(start), len(data))
	}
	return nil
}
