package hybrid

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/internal/bufpool"
	"github.com/gdist/gdist/dist/transport/tcp"
)

// Routes Via reports.
const (
	ViaSelf = "self" // this rank: loopback through the TCP transport's queues
	ViaSHM  = "shm"  // shared memory (a peer on this host)
	ViaTCP  = "tcp"  // TCP (a peer on another host, or shared memory off)
)

// shmLink is what the hybrid needs of the shared-memory transport.
type shmLink interface {
	transport.Transport
	transport.Backlog
	HasLink(r int) bool
	Kill()
}

// Transport routes each peer to one underlying transport: shared memory
// for the peers on this rank's host (when the mode allows and it set up),
// TCP for the others and for this rank itself. Since a peer's messages
// all take one route, messages with the same (source, tag) arrive in send
// order. Create it with Rendezvous. It is safe for concurrent use.
type Transport struct {
	rank, world int
	tcp         *tcp.Transport
	shm         shmLink               // nil when no peer uses shared memory
	routes      []transport.Transport // by rank: the transport that reaches it
	via         []string              // by rank: ViaSelf, ViaSHM or ViaTCP
	hosts       []int                 // by rank: host index

	closing  atomic.Bool
	closeOne sync.Once
}

var (
	_ transport.Transport      = (*Transport)(nil)
	_ transport.Topology       = (*Transport)(nil)
	_ transport.ReduceReceiver = (*Transport)(nil)
	_ transport.Backlog        = (*Transport)(nil)
	_ transport.StreamSender   = (*Transport)(nil)
)

// Rank implements transport.Transport.
func (t *Transport) Rank() int { return t.rank }

// WorldSize implements transport.Transport.
func (t *Transport) WorldSize() int { return t.world }

// Hosts implements transport.Topology: the host index of every rank,
// hosts numbered 0, 1, ... in the order of their lowest rank, the same on
// every rank. It is a fresh copy.
func (t *Transport) Hosts() []int { return slices.Clone(t.hosts) }

// Via reports how this rank reaches rank r: ViaSelf for itself, ViaSHM or
// ViaTCP for a peer, "" for a rank outside [0, WorldSize). The routes are
// fixed by Rendezvous.
func (t *Transport) Via(r int) string {
	if r < 0 || r >= t.world {
		return ""
	}
	return t.via[r]
}

// SharedMemory implements transport.SharedMemory: rank r is this rank or
// reached through shared memory (Via is ViaSelf or ViaSHM).
func (t *Transport) SharedMemory(r int) bool {
	v := t.Via(r)
	return v == ViaSelf || v == ViaSHM
}

// Summary says in words how this rank reaches its peers: "shm to 1 peer",
// "shm to 3 peers, tcp to 4 peers", or "no peers" in a world of one.
func (t *Transport) Summary() string {
	var shm, tcp int
	for r, v := range t.via {
		switch {
		case r == t.rank:
		case v == ViaSHM:
			shm++
		case v == ViaTCP:
			tcp++
		}
	}
	peers := func(n int) string {
		if n == 1 {
			return "1 peer"
		}
		return fmt.Sprintf("%d peers", n)
	}
	switch {
	case shm > 0 && tcp > 0:
		return "shm to " + peers(shm) + ", tcp to " + peers(tcp)
	case shm > 0:
		return "shm to " + peers(shm)
	case tcp > 0:
		return "tcp to " + peers(tcp)
	}
	return "no peers"
}

func (t *Transport) route(op string, r int) (transport.Transport, error) {
	if t.closing.Load() {
		return nil, errClosed(op)
	}
	if err := transport.CheckRank(r, t.world); err != nil {
		return nil, fmt.Errorf("hybrid: %s: %w", op, err)
	}
	return t.routes[r], nil
}

// Send implements transport.Transport, through the route to `to` (see
// the underlying transport's Send for flow control and ownership: p is
// never retained).
func (t *Transport) Send(ctx context.Context, to int, tag uint32, h transport.Header, p []byte) error {
	tr, err := t.route("send", to)
	if err != nil {
		return err
	}
	return t.stateErr("send", tr.Send(ctx, to, tag, h, p))
}

// SendStream implements transport.StreamSender: through the route to `to`,
// streamed where the route can (shared memory), a plain Send elsewhere.
func (t *Transport) SendStream(ctx context.Context, to int, tag uint32, h transport.Header, p []byte) error {
	tr, err := t.route("send", to)
	if err != nil {
		return err
	}
	s, ok := tr.(transport.StreamSender)
	if !ok {
		return t.stateErr("send", tr.Send(ctx, to, tag, h, p))
	}
	return t.stateErr("send", s.SendStream(ctx, to, tag, h, p))
}

// Recv implements transport.Transport. The payload belongs to the caller,
// who may hand it back with Release.
func (t *Transport) Recv(ctx context.Context, from int, tag uint32) (transport.Message, error) {
	tr, err := t.route("recv", from)
	if err != nil {
		return transport.Message{}, err
	}
	m, err := tr.Recv(ctx, from, tag)
	return m, t.stateErr("recv", err)
}

// RecvInto implements transport.Transport. dst stays the caller's.
func (t *Transport) RecvInto(ctx context.Context, from int, tag uint32, dst []byte) (transport.Header, int, error) {
	tr, err := t.route("recv", from)
	if err != nil {
		return transport.Header{}, 0, err
	}
	h, n, err := tr.RecvInto(ctx, from, tag, dst)
	return h, n, t.stateErr("recv", err)
}

// RecvReduce implements transport.ReduceReceiver: from a peer on shared
// memory the message is combined into dst where it lies in the ring; from
// one on TCP (or this rank) it is received, then combined
// (transport.RecvThenCombine).
func (t *Transport) RecvReduce(ctx context.Context, from int, tag uint32, dst []byte, unit int, combine transport.Combine) (transport.Header, int, error) {
	tr, err := t.route("recv", from)
	if err != nil {
		return transport.Header{}, 0, err
	}
	var h transport.Header
	var n int
	if rr, ok := tr.(transport.ReduceReceiver); ok {
		h, n, err = rr.RecvReduce(ctx, from, tag, dst, unit, combine)
	} else {
		h, n, err = transport.RecvThenCombine(ctx, tr, from, tag, dst, unit, combine)
	}
	return h, n, t.stateErr("recv", err)
}

// Release implements transport.Transport. Both underlying transports
// take their receive buffers from, and release them to, the one shared
// buffer pool (dist/transport/internal/bufpool), so a payload goes back
// there whichever route delivered it.
func (t *Transport) Release(p []byte) { bufpool.Default.Put(p) }

// Queued implements transport.Backlog: the messages that arrived at this
// rank over either route and that nobody has received yet.
func (t *Transport) Queued() []transport.Queued {
	out := t.tcp.Queued()
	if t.shm != nil {
		out = append(out, t.shm.Queued()...)
		slices.SortFunc(out, func(a, b transport.Queued) int {
			return cmp.Or(cmp.Compare(a.From, b.From), cmp.Compare(a.Tag, b.Tag))
		})
	}
	return out
}

// Close implements transport.Transport: it closes both underlying
// transports (peers see this rank as closed on every route) and waits for
// their goroutines. Pending calls return an error matching
// transport.ErrClosed, as do all later ones. Close is idempotent and
// always returns nil.
func (t *Transport) Close() error {
	t.shutdown(false)
	return nil
}

// Kill simulates this rank crashing: both underlying transports drop
// their links without a goodbye (tcp.Transport.Kill, shm.Transport.Kill),
// so peers see this rank as lost on every route. Later calls return
// transport.ErrClosed. It is meant for tests of failure handling.
func (t *Transport) Kill() { t.shutdown(true) }

func (t *Transport) shutdown(kill bool) {
	t.closeOne.Do(func() {
		t.closing.Store(true)
		var wg sync.WaitGroup
		if t.shm != nil {
			wg.Go(func() {
				if kill {
					t.shm.Kill()
				} else {
					t.shm.Close()
				}
			})
		}
		if kill {
			t.tcp.Kill()
		} else {
			t.tcp.Close()
		}
		wg.Wait()
	})
}

// stateErr maps an error from an underlying transport to what the caller
// should see: one matching ErrClosed once Close has begun.
func (t *Transport) stateErr(op string, err error) error {
	if err != nil && t.closing.Load() && !errors.Is(err, transport.ErrClosed) {
		return errClosed(op)
	}
	return err
}

func errClosed(op string) error { return fmt.Errorf("hybrid: %s: %w", op, transport.ErrClosed) }
