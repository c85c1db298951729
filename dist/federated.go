package dist

import (
	"context"
	"errors"
	"time"

	"github.com/gdist/gdist/dist/transport"
)

// fedState is FederatedAverage's per-group state, owned by the running
// collective.
type fedState struct {
	round   uint64
	pending map[int]transport.Message // early vectors (from a later round), by rank
}

// fedCall is one FederatedAverage call's own arguments and result, beside
// the collective call that sequences it.
type fedCall struct {
	deadline time.Time // rank 0 stops waiting for vectors then
	n        int       // vectors averaged (out)
}

// FederatedAverage averages data across the ranks that are on time, for
// federated learning with stragglers. Rank 0 (the leader) averages its own
// data with the vectors that reach it by deadline, skips the others, and
// sends the average to every rank, which stores it in data. It returns the
// number of vectors averaged on rank 0, and 0 on the other ranks.
//
// Every rank must call FederatedAverage the same number of times: each call
// is a numbered round, and a vector that arrives after its round's deadline
// is discarded in the next round, never averaged into it. Non-leaders wait
// for their round's average, bounded by ctx (or the group's default timeout).
// deadline only matters on rank 0. A peer that sends a vector of another
// length gets every rank a *DesyncError. data stays the caller's.
//
// FederatedAverage takes its turn among the group's collectives like any
// other collective, and a failure aborts the group like theirs: a client
// that dies ends the job. Package dist/fed is its successor for federated
// learning whose clients come and go (they are dropped and join again),
// with weighted FedAvg, client sampling, server optimizers and secure
// aggregation. Because it
// waits for no one but the leader, it cannot tell a slow rank from one that
// called another collective instead: such a mismatch is caught by the
// timeouts (ctx or WithTimeout), not by desync detection.
func (g *ProcessGroup) FederatedAverage(ctx context.Context, data []float32, deadline time.Time) (int, error) {
	fc := fedCall{deadline: deadline}
	c := call{kind: kFederated, dt: Float32, op: Mean, count: len(data), data: f32Bytes(data), fed: &fc}
	if err := g.run(ctx, &c, nil); err != nil {
		return 0, err
	}
	return fc.n, nil
}

func (g *ProcessGroup) federated(ctx context.Context, c *call) error {
	t := g.d.t
	g.fed.round++
	round := g.fed.round
	meta := collHeader(round, g.cur.fp)
	if g.rank != 0 {
		if err := t.Send(ctx, g.global(0), g.tag+tagFedUp, meta, c.data); err != nil {
			return err
		}
		for {
			m, err := t.Recv(ctx, g.global(0), g.tag+tagFedDown)
			if err != nil {
				return err
			}
			if seq, _ := parseHeader(m.Header); seq < round { // the average of a round we gave up on
				g.d.t.Release(m.Payload)
				continue
			}
			if m.Header != meta || len(m.Payload) != len(c.data) {
				g.d.t.Release(m.Payload)
				return g.fedDesync(0, m.Header, round)
			}
			copy(c.data, m.Payload)
			g.d.t.Release(m.Payload)
			c.fed.n = 0
			return nil
		}
	}

	dctx, cancel := context.WithDeadline(ctx, c.fed.deadline)
	defer cancel()
	n := 1
	for p := 1; p < g.size; p++ {
		m, ok, err := g.fedCollect(dctx, ctx, p, round)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		if _, fp := parseHeader(m.Header); fp != g.cur.fp || len(m.Payload) != len(c.data) {
			g.d.t.Release(m.Payload)
			return g.fedDesync(p, m.Header, round)
		}
		red := reducer{Float32, Sum}
		red.into(c.data, m.Payload)
		g.d.t.Release(m.Payload)
		n++
	}
	reducer{Float32, Mean}.finish(c.data, n)
	for p := 1; p < g.size; p++ {
		if err := t.Send(ctx, g.global(p), g.tag+tagFedDown, meta, c.data); err != nil {
			return err
		}
	}
	c.fed.n = n
	return nil
}

// fedCollect returns rank p's vector for round, or ok == false if it has
// not arrived by the deadline (dctx). Vectors of earlier rounds are dropped;
// one of a later round is kept for that round.
func (g *ProcessGroup) fedCollect(dctx, ctx context.Context, p int, round uint64) (transport.Message, bool, error) {
	if m, ok := g.fed.pending[p]; ok {
		seq, _ := parseHeader(m.Header)
		if seq == round {
			delete(g.fed.pending, p)
			return m, true, nil
		}
		if seq > round {
			return transport.Message{}, false, nil
		}
		delete(g.fed.pending, p)
		g.d.t.Release(m.Payload)
	}
	for {
		m, err := g.d.t.Recv(dctx, g.global(p), g.tag+tagFedUp)
		if err != nil {
			if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
				return transport.Message{}, false, nil // late: skip it this round
			}
			return transport.Message{}, false, err
		}
		switch seq, _ := parseHeader(m.Header); {
		case seq < round:
			g.d.t.Release(m.Payload)
		case seq > round:
			if g.fed.pending == nil {
				g.fed.pending = make(map[int]transport.Message)
			}
			g.fed.pending[p] = m
			return transport.Message{}, false, nil
		default:
			return m, true, nil
		}
	}
}

func (g *ProcessGroup) fedDesync(peer int, h transport.Header, round uint64) error {
	seq, fp := parseHeader(h)
	return &DesyncError{
		Rank: g.d.rank, Peer: g.global(peer),
		Seq: round, PeerSeq: seq,
		Local: describe(g.cur.fp), Remote: describe(fp),
	}
}
