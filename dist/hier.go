package dist

import (
	"context"
	"errors"
	"fmt"

	"github.com/gdist/gdist/dist/transport"
)

// Hierarchical (topology-aware) collectives.
//
// When the transport knows which ranks share a host (transport.Topology)
// and the job spans several hosts, at least one of them with several ranks,
// AllReduce and Broadcast keep most of their traffic within the hosts:
//
//   - all-reduce: each host reduces to its leader (its lowest rank) with the
//     binomial tree or, for large vectors, the chain; the leaders all-reduce
//     among themselves (recursive doubling or ring), one member per host;
//     each leader divides by the world size for Mean and broadcasts the
//     result within its host (tree or chain). Large vectors go through the
//     three phases block by block, so that they overlap. Only the
//     leaders' all-reduce crosses hosts: per host, 2(h-1)/h of the vector
//     leaves and enters it for h hosts, against the flat ring's 2(n-1)/n of
//     the vector per rank crossing wherever the ring crosses.
//   - broadcast: the root sends to the leaders of the other hosts (the root
//     standing in for its own host's leader), then every host broadcasts
//     from that member to its other ranks.
//
// The phases are the flat algorithms run over sub-groups (comm). Every
// rank makes the same choices, from the host map, the world size and the
// message size only; each reduction is done in a fixed order and the result
// then copied, so every rank ends with the same bits. Mean divides once, by
// the world size.
//
// Desync detection: a hierarchical collective first sends the announce
// message (hierMark) to global rank r+1 and receives the one from r-1
// before anything else, so it obeys the two rules of "Desync detection"
// (algorithms.go) on the whole group; its phases then send no announce
// messages of their own.

// hierPlan is the precomputed shape of the hierarchical collectives for
// this rank. It is built once in New.
type hierPlan struct {
	hosts   []int // host index of every rank
	host    int   // this rank's host
	nhosts  int
	local   comm    // the ranks of this host, ascending; member 0 is the leader
	leaders []int   // leaders[h] is the lowest rank of host h
	cross   []int   // scratch: the members of a broadcast's cross-host phase
	ann     [1]byte // scratch: the announce message received
}

// newHierPlan returns the plan of rank in a job with the given host map, or
// nil if the collectives are better flat: one host, or one rank per host.
// hosts must be valid (checkHosts).
func newHierPlan(hosts []int, rank int) *hierPlan {
	nhosts := 0
	for _, h := range hosts {
		nhosts = max(nhosts, h+1)
	}
	if nhosts < 2 || nhosts == len(hosts) {
		return nil
	}
	p := &hierPlan{
		hosts:   hosts,
		host:    hosts[rank],
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
			if r == rank {
				p.local.me = len(local)
			}
			local = append(local, r)
		}
	}
	p.local.n, p.local.ranks, p.local.sub = len(local), local, true
	return p
}

// checkHosts checks a transport's host map: one entry per rank, hosts
// numbered 0, 1, ... in the order of their lowest rank.
func checkHosts(hosts []int, world int) error {
	if len(hosts) != world {
		return fmt.Errorf("dist: %w: transport topology: %d host entries for %d ranks", ErrInvalidArgument, len(hosts), world)
	}
	if err := transport.CheckHosts(hosts); err != nil {
		return fmt.Errorf("dist: %w: transport topology: %w", ErrInvalidArgument, err)
	}
	return nil
}

// topologyPlan returns the hierarchical plan for t's job, or nil if the
// collectives stay flat: hierarchical collectives are off, t does not
// implement transport.Topology, or the host map does not call for them. A
// host map that breaks the Topology contract is an error.
func topologyPlan(t transport.Transport, cfg *config, world, rank int) (*hierPlan, error) {
	if !cfg.hier {
		return nil, nil
	}
	tp, ok := t.(transport.Topology)
	if !ok {
		return nil, nil
	}
	hosts := tp.Hosts()
	if err := checkHosts(hosts, world); err != nil {
		return nil, err
	}
	return newHierPlan(hosts, rank), nil
}

// leaderComm returns the comm of the hosts' leaders if this rank is one
// (ok false otherwise).
func (p *hierPlan) leaderComm() (c comm, ok bool) {
	if p.local.me != 0 {
		return comm{}, false
	}
	return comm{n: p.nhosts, me: p.host, ranks: p.leaders, sub: true}, true
}

// hierMark is the payload of a hierarchical collective's announce message.
// The flat algorithms' announce is empty and none of their other messages
// is one byte long (a segment holds whole elements of at least 2 bytes), so
// a rank that runs a collective flat next to one that runs it
// hierarchically (the two disagree on WithHierarchical) fails at its first
// receive instead of exchanging mismatched messages.
var hierMark = []byte{'H'}

// hierAnnounce sends the announce message to global rank r+1 and receives
// and checks the one from r-1: the start of every hierarchical collective.
func (g *ProcessGroup) hierAnnounce(ctx context.Context, p *hierPlan) error {
	if err := g.send(ctx, (g.rank+1)%g.world, hierMark); err != nil {
		return err
	}
	from := (g.rank + g.world - 1) % g.world
	buf := p.ann[:]
	h, n, err := g.t.RecvInto(ctx, from, tagColl, buf)
	if err == nil {
		g.obs.met.Received(from, n)
	}
	if err != nil && !errors.Is(err, transport.ErrMessageTooLong) {
		return err
	}
	if wire, fp := parseHeader(h); wire != g.cur.wire || fp != g.cur.fp {
		return g.desync(from, wire, fp)
	}
	if err != nil || n != 1 || buf[0] != hierMark[0] {
		return &PeerError{Rank: from, Op: g.cur.kind.String(),
			Err: fmt.Errorf("%w: rank %d runs %s flat (a message of %d bytes), this rank hierarchically: every rank must use the same WithHierarchical or GDIST_HIERARCHICAL setting", ErrProtocol, from, g.cur.kind, n)}
	}
	return nil
}

// sumOf returns red with Mean replaced by Sum: the phases of a hierarchical
// all-reduce sum, and the division by the world size comes once at the end.
func sumOf(red reducer) reducer {
	if red.op == Mean {
		red.op = Sum
	}
	return red
}

// allReduceHier is the hierarchical all-reduce (see above).
func (g *ProcessGroup) allReduceHier(ctx context.Context, p *hierPlan, data []byte, es int, red reducer) error {
	if err := g.hierAnnounce(ctx, p); err != nil {
		return err
	}
	if len(data) >= g.cfg.small {
		return g.allReduceHierPipelined(ctx, p, data, es, red)
	}
	sum := sumOf(red)
	if p.local.n > 1 {
		if err := g.reduceTree(ctx, p.local, data, 0, sum); err != nil {
			return err
		}
	}
	if lc, ok := p.leaderComm(); ok {
		if err := g.allReduceRD(ctx, lc, data, sum); err != nil {
			return err
		}
		red.finish(data, g.world)
	}
	if p.local.n > 1 {
		return g.broadcastTree(ctx, p.local, data, 0)
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
// configuration, so every rank cuts the same blocks.
func (g *ProcessGroup) hierBlock(n int) int {
	b := (n/4 + 7) &^ 7
	return min(max(b, minHierBlock), maxHierBlock, g.cfg.segment)
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
// pipelined block by block (hierBlock): for block k a leader
// receives its host's partial from the chain, all-reduces the block with
// the other leaders (ring) and sends the result down the chain, while the
// other ranks of its host already send their contributions to block k+1 and
// only then wait for the result of block k. So the phases within a host
// overlap with the exchange between hosts, and each link holds at most two
// blocks in flight.
func (g *ProcessGroup) allReduceHierPipelined(ctx context.Context, p *hierPlan, data []byte, es int, red reducer) error {
	sum := sumOf(red)
	bs := g.hierBlock(len(data))
	nb := nblocks(len(data), bs)
	lc, leader := p.leaderComm()
	for k := range nb {
		b := block(data, bs, k)
		if p.local.n > 1 {
			if err := g.reduceChain(ctx, p.local, b, 0, sum); err != nil {
				return err
			}
		}
		if !leader {
			if k > 0 {
				if err := g.broadcastChain(ctx, p.local, block(data, bs, k-1), 0); err != nil {
					return err
				}
			}
			continue
		}
		if err := g.allReduceRing(ctx, lc, b, es, sum); err != nil {
			return err
		}
		red.finish(b, g.world)
		if p.local.n > 1 {
			if err := g.broadcastChain(ctx, p.local, b, 0); err != nil {
				return err
			}
		}
	}
	if !leader {
		return g.broadcastChain(ctx, p.local, block(data, bs, nb-1), 0)
	}
	return nil
}

// broadcastHier is the hierarchical broadcast (see above). A large vector
// is pipelined block by block (hierBlock): a rank passes block
// k on across hosts and then within its host before it waits for block k+1.
func (g *ProcessGroup) broadcastHier(ctx context.Context, p *hierPlan, data []byte, root int) error {
	if err := g.hierAnnounce(ctx, p); err != nil {
		return err
	}
	rootHost := p.hosts[root]
	// Cross-host phase: the root and the leaders of the other hosts.
	copy(p.cross, p.leaders)
	p.cross[rootHost] = root
	cross := comm{n: p.nhosts, me: p.host, ranks: p.cross, sub: true}
	inCross := p.cross[p.host] == g.rank
	// Within-host phase, from the member that took part in the first.
	from := 0
	if p.host == rootHost {
		for i, r := range p.local.ranks {
			if r == root {
				from = i
			}
		}
	}
	if len(data) < g.cfg.small {
		if inCross {
			if err := g.broadcastTree(ctx, cross, data, rootHost); err != nil {
				return err
			}
		}
		if p.local.n > 1 {
			return g.broadcastTree(ctx, p.local, data, from)
		}
		return nil
	}
	bs := g.hierBlock(len(data))
	for k := range nblocks(len(data), bs) {
		b := block(data, bs, k)
		if inCross {
			if err := g.broadcastChain(ctx, cross, b, rootHost); err != nil {
				return err
			}
		}
		if p.local.n > 1 {
			if err := g.broadcastChain(ctx, p.local, b, from); err != nil {
				return err
			}
		}
	}
	return nil
}
