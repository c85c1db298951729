package transport

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/gdist/gdist/dist/transport/internal/bufpool"
	"github.com/gdist/gdist/dist/transport/internal/mailbox"
	"github.com/gdist/gdist/internal/options"
)

// DefaultQueueLimit is the default bound, in bytes, on what one receiver
// queues from one sender.
const DefaultQueueLimit = 64 << 20

// LocalOption configures NewLocal. NewLocal applies each in turn and fails
// with the first refusal, an error matching ErrInvalidArgument that names
// the option; a nil LocalOption is refused the same way.
type LocalOption func(*localConfig) error

type localConfig struct {
	queueLimit int
	hosts      []int // WithHosts; nil: every rank on host 0
}

// WithLocalQueueLimit bounds the bytes a rank queues from each sender before
// senders wait. n == 0 means unbounded; n < 0 is invalid. The default is
// DefaultQueueLimit.
func WithLocalQueueLimit(n int) LocalOption {
	return func(c *localConfig) error {
		if n < 0 {
			return fmt.Errorf("transport: %w: WithLocalQueueLimit(%d): must not be negative", ErrInvalidArgument, n)
		}
		c.queueLimit = n
		return nil
	}
}

// WithHosts makes the ranks of the in-process job report a topology of
// several hosts (Topology.Hosts), for testing topology-aware code: rank r is
// on host hosts[r]. NewLocal refuses a slice that is not one entry per rank
// with hosts numbered 0, 1, ... in the order of their lowest rank (rank 0 on
// host 0, and a rank on a new host takes the next number). The slice is
// copied. Without it, every rank is on host 0.
func WithHosts(hosts []int) LocalOption {
	hosts = append([]int(nil), hosts...)
	return func(c *localConfig) error {
		if err := CheckHosts(hosts); err != nil {
			return fmt.Errorf("transport: %w: WithHosts: %w", ErrInvalidArgument, err)
		}
		c.hosts = hosts
		return nil
	}
}

// Rank states in a local job.
const (
	rankAlive = iota
	rankClosed
	rankKilled
)

type hub struct {
	boxes []*mailbox.Mailbox[Message]
	state []atomic.Int32
	hosts []int // host of every rank
}

// Local is an in-process Transport: n ranks in one process exchanging copies
// of messages. It is what tests and examples use.
type Local struct {
	hub    *hub
	rank   int
	closed atomic.Bool
	once   sync.Once
}

var (
	_ Transport = (*Local)(nil)
	_ Topology  = (*Local)(nil)
	_ Backlog   = (*Local)(nil)
)

// NewLocal returns the n transports of an in-process job; element i has rank
// i. It returns an error wrapping ErrInvalidArgument if n < 1 or an option
// is invalid.
func NewLocal(n int, opts ...LocalOption) ([]*Local, error) {
	if n < 1 {
		return nil, fmt.Errorf("transport: NewLocal: %w: need at least one rank, got %d", ErrInvalidArgument, n)
	}
	cfg := localConfig{queueLimit: DefaultQueueLimit}
	if err := options.Apply(&cfg, opts, "transport: NewLocal", ErrInvalidArgument); err != nil {
		return nil, err
	}
	if cfg.hosts != nil && len(cfg.hosts) != n {
		return nil, fmt.Errorf("transport: NewLocal: %w: WithHosts: %d hosts for %d ranks", ErrInvalidArgument, len(cfg.hosts), n)
	}
	if cfg.hosts == nil {
		cfg.hosts = make([]int, n)
	}
	h := &hub{boxes: make([]*mailbox.Mailbox[Message], n), state: make([]atomic.Int32, n), hosts: cfg.hosts}
	for i := range h.boxes {
		h.boxes[i] = mailbox.New(n, cfg.queueLimit, func(m Message) { bufpool.Default.Put(m.Payload) })
	}
	ts := make([]*Local, n)
	for i := range ts {
		ts[i] = &Local{hub: h, rank: i}
	}
	return ts, nil
}

// Rank implements Transport.
func (l *Local) Rank() int { return l.rank }

// WorldSize implements Transport.
func (l *Local) WorldSize() int { return len(l.hub.boxes) }

// Hosts implements Topology: the host map given to NewLocal by WithHosts,
// else every rank on host 0 (as in-process ranks are). It returns a fresh
// copy.
func (l *Local) Hosts() []int { return append([]int(nil), l.hub.hosts...) }

// SharedMemory implements transport.SharedMemory: in-process ranks share
// memory, except across the hosts a WithHosts map simulates.
func (l *Local) SharedMemory(r int) bool {
	return r >= 0 && r < len(l.hub.hosts) && l.hub.hosts[r] == l.hub.hosts[l.rank]
}

// peerErr is the error for an operation on rank r that is gone.
func (l *Local) peerErr(op string, r int) error {
	cause := ErrPeerClosed
	if l.hub.state[r].Load() == rankKilled {
		cause = ErrPeerLost
	}
	return &PeerError{Rank: r, Op: op, Err: cause}
}

// Send implements Transport. It copies p: straight into the receiver's
// buffer when a RecvInto is waiting for it, else into a pooled buffer.
func (l *Local) Send(ctx context.Context, to int, tag uint32, h Header, p []byte) error {
	if l.closed.Load() {
		return fmt.Errorf("transport: send: %w", ErrClosed)
	}
	if err := CheckRank(to, l.WorldSize()); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("transport: send to rank %d: %w", to, err)
	}
	if to != l.rank && l.hub.state[to].Load() != rankAlive {
		return l.peerErr("send", to)
	}
	box := l.hub.boxes[to]
	if post := box.Claim(l.rank, tag); post != nil {
		if len(p) > len(post.Dst) {
			box.Complete(post, Message{Header: h}, len(p), TooLong(l.rank, len(p), len(post.Dst)))
		} else {
			box.Complete(post, Message{Header: h}, copy(post.Dst, p), nil)
		}
		return nil
	}
	buf := bufpool.Default.Get(len(p))
	copy(buf, p)
	err := box.Put(ctx, l.rank, tag, Message{Header: h, Payload: buf}, len(buf))
	if err != nil {
		bufpool.Default.Put(buf)
		if l.closed.Load() {
			return fmt.Errorf("transport: send: %w", ErrClosed)
		}
		if errors.Is(err, ErrClosed) && to != l.rank {
			return l.peerErr("send", to)
		}
		return err
	}
	return nil
}

// Recv implements Transport.
func (l *Local) Recv(ctx context.Context, from int, tag uint32) (Message, error) {
	if l.closed.Load() {
		return Message{}, fmt.Errorf("transport: recv: %w", ErrClosed)
	}
	if err := CheckRank(from, l.WorldSize()); err != nil {
		return Message{}, err
	}
	m, err := l.hub.boxes[l.rank].Get(ctx, from, tag)
	if err != nil && l.closed.Load() {
		return Message{}, fmt.Errorf("transport: recv: %w", ErrClosed)
	}
	return m, err
}

// RecvInto implements Transport. A sender that finds it waiting copies its
// message straight into dst; a message queued before it is copied from
// its pooled buffer.
func (l *Local) RecvInto(ctx context.Context, from int, tag uint32, dst []byte) (Header, int, error) {
	if l.closed.Load() {
		return Header{}, 0, fmt.Errorf("transport: recv: %w", ErrClosed)
	}
	if err := CheckRank(from, l.WorldSize()); err != nil {
		return Header{}, 0, err
	}
	m, n, direct, err := l.hub.boxes[l.rank].GetInto(ctx, from, tag, dst)
	if direct {
		return m.Header, n, err
	}
	if err != nil {
		if l.closed.Load() {
			return Header{}, 0, fmt.Errorf("transport: recv: %w", ErrClosed)
		}
		return Header{}, 0, err
	}
	n, err = Deliver(m, from, dst, nil)
	bufpool.Default.Put(m.Payload)
	return m.Header, n, err
}

// Release implements Transport.
func (l *Local) Release(p []byte) { bufpool.Default.Put(p) }

// Queued implements Backlog: the messages queued at this rank, then those
// this rank sent that wait unreceived at another.
func (l *Local) Queued() []Queued {
	var mine, sent []Queued
	for to, b := range l.hub.boxes {
		for _, q := range b.Backlog() {
			e := Queued{From: q.Src, To: to, Tag: q.Tag, Messages: q.Msgs, Bytes: q.Bytes}
			switch {
			case to == l.rank:
				mine = append(mine, e)
			case q.Src == l.rank:
				sent = append(sent, e)
			}
		}
	}
	return append(mine, sent...)
}

// Close implements Transport: later calls on l return ErrClosed and the other
// ranks see this rank as cleanly gone (ErrPeerClosed once its messages are
// drained).
func (l *Local) Close() error {
	l.once.Do(func() {
		l.hub.state[l.rank].Store(rankClosed)
		l.closed.Store(true)
		l.hub.boxes[l.rank].Fail(fmt.Errorf("transport: recv: %w", ErrClosed))
		for i, b := range l.hub.boxes {
			if i != l.rank {
				b.CloseSource(l.rank, &PeerError{Rank: l.rank, Op: "recv", Err: ErrPeerClosed})
			}
		}
	})
	return nil
}

// Kill simulates this rank crashing: the other ranks' pending and later
// operations involving it fail with a *PeerError wrapping ErrPeerLost, as
// they would when a TCP peer dies; messages it sent and nobody received yet
// are dropped. It is for tests of failure handling.
func (l *Local) Kill() {
	l.once.Do(func() {
		l.hub.state[l.rank].Store(rankKilled)
		l.closed.Store(true)
		for i, b := range l.hub.boxes {
			if i != l.rank {
				b.FailSource(l.rank, &PeerError{Rank: l.rank, Op: "recv", Err: ErrPeerLost})
			}
		}
		l.hub.boxes[l.rank].Fail(fmt.Errorf("transport: recv: %w", ErrClosed))
	})
}
