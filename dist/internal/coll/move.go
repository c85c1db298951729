package coll

import "context"

// The collectives that move data without combining it.

// Broadcast copies member root's data into data on every other member:
// hierarchically when the Net has a plan, else by a binomial tree below
// Small bytes and a pipelined chain above.
func (nt *Net) Broadcast(ctx context.Context, c Comm, data []byte, root int) error {
	if c.N == 1 {
		return nil
	}
	if nt.Hier != nil {
		return nt.broadcastHier(ctx, c, data, root)
	}
	if len(data) < nt.Small {
		return nt.broadcastTree(ctx, c, data, root)
	}
	return nt.broadcastChain(ctx, c, data, root)
}

// AllGather concatenates every member's src into dst in member order:
// member i's src lands at dst[i*len(src):]. len(dst) == N*len(src); src
// may be that part of dst.
func (nt *Net) AllGather(ctx context.Context, c Comm, dst, src []byte) error {
	b := len(src)
	copy(dst[c.Me*b:(c.Me+1)*b], src)
	if c.N == 1 {
		return nil
	}
	offs := nt.offsets(c.N, func(int) int { return b })
	return nt.allGatherRing(ctx, c, dst, offs)
}

// AllGatherV is AllGather with blocks of different lengths: member i
// contributes counts[i] elements of es bytes (its src, so len(src) ==
// es*counts[Me]) and dst, of es times the sum of counts, receives them in
// member order.
func (nt *Net) AllGatherV(ctx context.Context, c Comm, dst, src []byte, counts []int, es int) error {
	offs := nt.offsets(c.N, func(i int) int { return es * counts[i] })
	copy(dst[offs[c.Me]:offs[c.Me+1]], src)
	if c.N == 1 {
		return nil
	}
	return nt.allGatherRing(ctx, c, dst, offs)
}

// offsets returns the n+1 prefix sums of size(0..n-1) in the Net's
// scratch, so that the uneven collectives allocate nothing in steady state.
func (nt *Net) offsets(n int, size func(int) int) []int {
	if cap(nt.offs) < n+1 {
		nt.offs = make([]int, n+1)
	}
	o := nt.offs[:n+1]
	o[0] = 0
	for i := range n {
		o[i+1] = o[i] + size(i)
	}
	return o
}

// allGatherRing: in step s member r passes block r-s on to r+1 and
// receives block r-s-1 from r-1. Block i is dst[offs[i]:offs[i+1]].
func (nt *Net) allGatherRing(ctx context.Context, c Comm, dst []byte, offs []int) error {
	n, r := c.N, c.Me
	block := func(i int) []byte {
		i = mod(i, n)
		return dst[offs[i]:offs[i+1]]
	}
	for s := range n - 1 {
		if err := nt.exchange(ctx, c, c.next(), block(r-s), c.prev(), block(r-s-1), copying, false); err != nil {
			return err
		}
	}
	return nil
}

// AllToAll sends block i of src to member i and receives member i's block
// for this member into block i of dst. With nil counts the blocks are
// equal: src and dst split into N blocks each. Otherwise send block i
// holds sendCounts[i] elements of es bytes and receive block i
// recvCounts[i], in member order. The block a member keeps is copied.
// Each of the n-1 steps s exchanges with members me+s (to) and me-s
// (from): every member sends and receives each byte once, and the first
// step is a ring step, so desyncs are caught as in the ring.
func (nt *Net) AllToAll(ctx context.Context, c Comm, dst, src []byte, sendCounts, recvCounts []int, es int) error {
	n, r := c.N, c.Me
	// One table of offsets: the receive side's after the send side's.
	all := nt.offsets(2*n, func(i int) int {
		switch {
		case sendCounts == nil && i < n:
			return len(src) / n
		case sendCounts == nil:
			return len(dst) / n
		case i < n:
			return es * sendCounts[i]
		}
		return es * recvCounts[i-n]
	})
	so, ro := all[:n+1], all[n:]
	rbase := ro[0]
	sblock := func(i int) []byte { return src[so[i]:so[i+1]] }
	rblock := func(i int) []byte { return dst[ro[i]-rbase : ro[i+1]-rbase] }
	copy(rblock(r), sblock(r))
	for s := 1; s < n; s++ {
		to, from := (r+s)%n, mod(r-s, n)
		if err := nt.exchange(ctx, c, to, sblock(to), from, rblock(from), copying, false); err != nil {
			return err
		}
	}
	return nil
}

// Gather concatenates every member's src into root's dst in member order
// (len(dst) == N*len(src) on root; dst is not used elsewhere). Each member
// sends its block straight to root, which receives them in turn.
func (nt *Net) Gather(ctx context.Context, c Comm, dst, src []byte, root int) error {
	b := len(src)
	if c.Me == root {
		copy(dst[root*b:(root+1)*b], src)
	}
	if c.N == 1 {
		return nil
	}
	if err := nt.annSend(ctx, c); err != nil {
		return err
	}
	if err := nt.annRecv(ctx, c); err != nil {
		return err
	}
	if c.Me != root {
		return nt.sendAll(ctx, c, root, src)
	}
	for i := 1; i < c.N; i++ {
		from := (root + i) % c.N
		if err := nt.recvAll(ctx, c, from, dst[from*b:(from+1)*b], copying, false); err != nil {
			return err
		}
	}
	return nil
}

// Scatter sends block i of root's src to member i, into its dst
// (len(src) == N*len(dst) on root; src is not used elsewhere).
func (nt *Net) Scatter(ctx context.Context, c Comm, dst, src []byte, root int) error {
	b := len(dst)
	if c.Me == root {
		copy(dst, src[root*b:(root+1)*b])
	}
	if c.N == 1 {
		return nil
	}
	if err := nt.annSend(ctx, c); err != nil {
		return err
	}
	if err := nt.annRecv(ctx, c); err != nil {
		return err
	}
	if c.Me != root {
		return nt.recvAll(ctx, c, root, dst, copying, false)
	}
	for i := 1; i < c.N; i++ {
		to := (root + i) % c.N
		if err := nt.sendAll(ctx, c, to, src[to*b:(to+1)*b]); err != nil {
			return err
		}
	}
	return nil
}

// Barrier returns once every member has entered it: a dissemination
// barrier, in round k every member signals member me+2^k and waits for
// member me-2^k; after ceil(log2 n) rounds every member has heard,
// directly or not, from every other.
func (nt *Net) Barrier(ctx context.Context, c Comm) error {
	for d := 1; d < c.N; d <<= 1 {
		if err := nt.send(ctx, c, (c.Me+d)%c.N, nil); err != nil {
			return err
		}
		if err := nt.recv(ctx, c, mod(c.Me-d, c.N), nil, copying); err != nil {
			return err
		}
	}
	return nil
}

// broadcastTree is a binomial tree rooted at member root: ceil(log2 n)
// rounds.
func (nt *Net) broadcastTree(ctx context.Context, c Comm, data []byte, root int) error {
	if err := nt.annSend(ctx, c); err != nil {
		return err
	}
	n := c.N
	vr := mod(c.Me-root, n)
	real := func(v int) int { return (v + root) % n }
	mask := 1
	for mask < n {
		if vr&mask != 0 {
			if err := nt.recvAll(ctx, c, real(vr-mask), data, copying, true); err != nil {
				return err
			}
			break
		}
		mask <<= 1
	}
	for mask >>= 1; mask > 0; mask >>= 1 {
		if vr+mask < n {
			if err := nt.sendAll(ctx, c, real(vr+mask), data); err != nil {
				return err
			}
		}
	}
	if vr == 0 {
		return nt.annRecv(ctx, c)
	}
	return nil
}

// broadcastChain pipelines segments down the chain root, root+1, ..., so
// every link carries the vector once, concurrently.
func (nt *Net) broadcastChain(ctx context.Context, c Comm, data []byte, root int) error {
	if err := nt.annSend(ctx, c); err != nil {
		return err
	}
	n := c.N
	vr := mod(c.Me-root, n)
	if vr == 0 {
		if err := nt.sendAll(ctx, c, c.next(), data); err != nil {
			return err
		}
		return nt.annRecv(ctx, c)
	}
	if err := nt.annRecv(ctx, c); err != nil {
		return err
	}
	for k := range nt.nseg(len(data)) {
		d := nt.seg(data, k)
		if err := nt.recv(ctx, c, c.prev(), d, copying); err != nil {
			return err
		}
		if vr < n-1 {
			if err := nt.send(ctx, c, c.next(), d); err != nil {
				return err
			}
		}
	}
	return nil
}
