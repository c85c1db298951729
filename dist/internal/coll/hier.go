package coll

import (
	"context"
	"errors"
	"fmt"
)

// Hierarchical (topology-aware) all-reduce and broadcast.
//
// When the members span several hosts, at least one of them with several
// members, AllReduce and Broadcast keep most of their traffic within the
// hosts:
//
//   - all-reduce: each host reduces to its leader (its lowest member) with
//     the binomial tree or, for large vectors, the chain; the leaders
//     all-reduce among themselves (recursive doubling or ring), one member
//     per host; each leader finishes the reduction (Mean divides by the
//     number of members) and broadcasts the result within its host (tree
//     or chain). Large vectors go through the three phases block by block,
//     so that they overlap. Only the leaders' all-reduce crosses hosts.
//   - broadcast: the root sends to the leaders of the other hosts (the root
//     standing in for its own host's leader), then every host broadcasts
//     from that member to its other members.
//
// Every member makes the same choices, from the host map, the member count
// and the message size only; each reduction is done in a fixed order and
// the result then copied, so every member ends with the same bits.
//
// Desync detection: a hierarchical collective first sends the announce
// message (hierMark) to member me+1 and receives the one from me-1 before
// anything else; its phases then send no announce messages of their own.

// Plan is the precomputed shape of the hierarchical collectives for one
// member of a comm.
type Plan struct {
	hosts   []int // host index of every member
	host    int   // this member's host
	nhosts  int
	local   Comm    // the members of this host, ascending; member 0 is the leader
	leaders []int   // leaders[h] is the lowest member of host h
	cross   []int   // scratch: the members of a broadcast's cross-host phase
	ann     [1]byte // scratch: the announce message received
}

// NewPlan returns the plan of member me of a comm whose member i is on
// host hosts[i], or nil if the collectives are better flat: one host, or
// one member per host. Hosts are numbered 0, 1, ... in the order of their
// lowest member (see transport.CheckHosts); NewPlan keeps hosts.
func NewPlan(hosts []int, me int) *Plan {
	nhosts := 0
	for _, h := range hosts {
		nhosts = max(nhosts, h+1)
	}
	if nhosts < 2 || nhosts == len(hosts) {
		return nil
	}
	p := &Plan{
		hosts:   hosts,
		host:    hosts[me],
		nhosts:  nhosts,
		leaders: make([]int, nhosts),
		cross:   make([]int, nhosts),
	}
	for h := range p.leaders {
		p.leaders[h] = -1
	}
	var local []int
	for r, h := range hosts {
		if p.leaders[h] < 0 {
			p.leaders[h] = r
		}
		if h == p.host {
			if r == me {
				p.local.Me = len(local)
			}
			local = append(local, r)
		}
	}
	p.local.N, p.local.ranks, p.local.sub = len(local), local, true
	return p
}

// leaderComm returns the comm of the hosts' leaders if this member is one
// (ok false otherwise).
func (p *Plan) leaderComm() (c Comm, ok bool) {
	if p.local.Me != 0 {
		return Comm{}, false
	}
	return Comm{N: p.nhosts, Me: p.host, ranks: p.leaders, sub: true}, true
}

// hierMark is the payload of a hierarchical collective's announce message.
// The flat algorithms' announce is empty and none of their other messages
// is one byte long (a segment holds whole elements of at least 2 bytes), so
// a member that runs a collective flat next to one that runs it
// hierarchically (the two disagree on the setting) fails at its first
// receive instead of exchanging mismatched messages.
var hierMark = []byte{'H'}

// ErrFlatPeer is wrapped by the error of a hierarchical collective whose
// neighbour runs it flat.
var ErrFlatPeer = errors.New("the neighbour runs it flat, this member hierarchically: every rank must use the same WithHierarchical or GDIST_HIERARCHICAL setting")

// hierAnnounce sends the announce message to member me+1 and receives and
// checks the one from me-1: the start of every hierarchical collective.
func (nt *Net) hierAnnounce(ctx context.Context, c Comm) error {
	if err := nt.send(ctx, c, c.next(), hierMark); err != nil {
		return err
	}
	buf := nt.Hier.ann[:]
	err := nt.recv(ctx, c, c.prev(), buf, copying)
	if errors.Is(err, ErrProtocol) {
		return fmt.Errorf("%w (%w)", err, ErrFlatPeer)
	}
	if err != nil {
		return err
	}
	if buf[0] != hierMark[0] {
		return fmt.Errorf("%w: announce byte %#x (%w)", ErrProtocol, buf[0], ErrFlatPeer)
	}
	return nil
}

// allReduceHier is the hierarchical all-reduce (see above).
func (nt *Net) allReduceHier(ctx context.Context, c Comm, data []byte, red Reducer) error {
	p := nt.Hier
	if err := nt.hierAnnounce(ctx, c); err != nil {
		return err
	}
	if len(data) >= nt.Small {
		return nt.allReduceHierPipelined(ctx, c, data, red)
	}
	sum := red.partial()
	if p.local.N > 1 {
		if err := nt.reduceTree(ctx, p.local, data, 0, sum); err != nil {
			return err
		}
	}
	if lc, ok := p.leaderComm(); ok {
		if err := nt.allReduceRD(ctx, lc, data, sum); err != nil {
			return err
		}
		red.finish(data, c.N)
	}
	if p.local.N > 1 {
		return nt.broadcastTree(ctx, p.local, data, 0)
	}
	return nil
}

// minHierBlock and maxHierBlock bound the blocks of the pipelined
// hierarchical collectives.
const (
	minHierBlock = 256 << 10
	maxHierBlock = 1 << 20
)

// hierBlock returns the block size of the pipelined hierarchical
// collectives for an n-byte vector: a quarter of it, so that even a vector
// of one segment goes through the phases in four overlapping blocks, but
// at least minHierBlock and at most one segment; a multiple of 8 bytes, so
// blocks hold whole elements of every dtype. It depends only on n and the
// configuration, so every member cuts the same blocks.
func (nt *Net) hierBlock(n int) int {
	b := (n/4 + 7) &^ 7
	return min(max(b, minHierBlock), maxHierBlock, nt.Segment)
}

// nblocks is the number of bs-byte blocks of an n-byte vector (1 for an
// empty one).
func nblocks(n, bs int) int { return max(1, (n+bs-1)/bs) }

// block returns block k of b.
func block(b []byte, bs, k int) []byte {
	lo := k * bs
	return b[lo:min(lo+bs, len(b))]
}

// allReduceHierPipelined is the hierarchical all-reduce of a large vector,
// pipelined block by block (hierBlock): for block k a leader receives its
// host's partial from the chain, all-reduces the block with the other
// leaders (ring) and sends the result down the chain, while the other
// members of its host already send their contributions to block k+1 and
// only then wait for the result of block k. So the phases within a host
// overlap with the exchange between hosts, and each link holds at most two
// blocks in flight.
func (nt *Net) allReduceHierPipelined(ctx context.Context, c Comm, data []byte, red Reducer) error {
	p := nt.Hier
	sum := red.partial()
	bs := nt.hierBlock(len(data))
	nb := nblocks(len(data), bs)
	lc, leader := p.leaderComm()
	for k := range nb {
		b := block(data, bs, k)
		if p.local.N > 1 {
			if err := nt.reduceChain(ctx, p.local, b, 0, sum); err != nil {
				return err
			}
		}
		if !leader {
			if k > 0 {
				if err := nt.broadcastChain(ctx, p.local, block(data, bs, k-1), 0); err != nil {
					return err
				}
			}
			continue
		}
		if err := nt.allReduceRing(ctx, lc, b, sum); err != nil {
			return err
		}
		red.finish(b, c.N)
		if p.local.N > 1 {
			if err := nt.broadcastChain(ctx, p.local, b, 0); err != nil {
				return err
			}
		}
	}
	if !leader {
		return nt.broadcastChain(ctx, p.local, block(data, bs, nb-1), 0)
	}
	return nil
}

// broadcastHier is the hierarchical broadcast (see above). A large vector
// is pipelined block by block (hierBlock): a member passes block k on
// across hosts and then within its host before it waits for block k+1.
func (nt *Net) broadcastHier(ctx context.Context, c Comm, data []byte, root int) error {
	p := nt.Hier
	if err := nt.hierAnnounce(ctx, c); err != nil {
		return err
	}
	rootHost := p.hosts[root]
	// Cross-host phase: the root and the leaders of the other hosts.
	copy(p.cross, p.leaders)
	p.cross[rootHost] = root
	cross := Comm{N: p.nhosts, Me: p.host, ranks: p.cross, sub: true}
	inCross := p.cross[p.host] == c.Me
	// Within-host phase, from the member that took part in the first.
	from := 0
	if p.host == rootHost {
		for i, r := range p.local.ranks {
			if r == root {
				from = i
			}
		}
	}
	if len(data) < nt.Small {
		if inCross {
			if err := nt.broadcastTree(ctx, cross, data, rootHost); err != nil {
				return err
			}
		}
		if p.local.N > 1 {
			return nt.broadcastTree(ctx, p.local, data, from)
		}
		return nil
	}
	bs := nt.hierBlock(len(data))
	for k := range nblocks(len(data), bs) {
		b := block(data, bs, k)
		if inCross {
			if err := nt.broadcastChain(ctx, cross, b, rootHost); err != nil {
				return err
			}
		}
		if p.local.N > 1 {
			if err := nt.broadcastChain(ctx, p.local, b, from); err != nil {
				return err
			}
		}
	}
	return nil
}

// Host returns this member's host.
func (p *Plan) Host() int { return p.host }

// Local returns the members on this member's host, ascending (the first
// is its leader), and this member's index among them.
func (p *Plan) Local() (members []int, me int) { return p.local.ranks, p.local.Me }

// Leaders returns the leader (lowest member) of every host.
func (p *Plan) Leaders() []int { return p.leaders }
