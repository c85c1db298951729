package transport

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/gdist/gdist/dist/transport/internal/mailbox"
	"github.com/gdist/gdist/internal/bufpool"
)

// DefaultQueueLimit is the default bound, in bytes, on what one receiver
// queues from one sender.
const DefaultQueueLimit = 64 << 20

// LocalOption configures NewLocal.
type LocalOption func(*localConfig)

type localConfig struct {
	queueLimit int
}

// WithLocalQueueLimit bounds the bytes a rank queues from each sender before
// senders wait. n <= 0 means unbounded. The default is DefaultQueueLimit.
func WithLocalQueueLimit(n int) LocalOption {
	return func(c *localConfig) { c.queueLimit = n }
}

type hub struct {
	boxes []*mailbox.Mailbox[Message]
}

// Local is an in-process Transport: n ranks in one process exchanging copies
// of messages. It is what tests and examples use.
type Local struct {
	hub    *hub
	rank   int
	closed atomic.Bool
	once   sync.Once
}

var _ Transport = (*Local)(nil)

// NewLocal returns the n transports of an in-process job; element i has rank i.
func NewLocal(n int, opts ...LocalOption) []*Local {
	if n < 1 {
		panic(fmt.Sprintf("transport: NewLocal(%d): need at least one rank", n))
	}
	cfg := localConfig{queueLimit: DefaultQueueLimit}
	for _, o := range opts {
		o(&cfg)
	}
	h := &hub{boxes: make([]*mailbox.Mailbox[Message], n)}
	for i := range h.boxes {
		h.boxes[i] = mailbox.New(n, cfg.queueLimit, func(m Message) { bufpool.Default.Put(m.Payload) })
	}
	ts := make([]*Local, n)
	for i := range ts {
		ts[i] = &Local{hub: h, rank: i}
	}
	return ts
}

// Rank implements Transport.
func (l *Local) Rank() int { return l.rank }

// WorldSize implements Transport.
func (l *Local) WorldSize() int { return len(l.hub.boxes) }

// Send implements Transport. It copies p.
func (l *Local) Send(ctx context.Context, to int, tag uint32, meta Meta, p []byte) error {
	if l.closed.Load() {
		return fmt.Errorf("dist: send: %w", ErrClosed)
	}
	if err := CheckRank(to, l.WorldSize()); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("dist: send to rank %d: %w", to, err)
	}
	if err := l.hub.boxes[l.rank].Err(); err != nil && tag < TagReservedBase {
		return err // this rank already failed (a peer was lost)
	}
	buf := bufpool.Default.Get(len(p))
	copy(buf, p)
	err := l.hub.boxes[to].Put(ctx, l.rank, tag, Message{Meta: meta, Payload: buf}, len(buf))
	if err != nil {
		bufpool.Default.Put(buf)
		if errors.Is(err, ErrClosed) && to != l.rank {
			return &PeerError{Rank: to, Op: "send", Err: ErrPeerClosed}
		}
		if l.closed.Load() {
			return fmt.Errorf("dist: send: %w", ErrClosed)
		}
		return err
	}
	return nil
}

// Recv implements Transport.
func (l *Local) Recv(ctx context.Context, from int, tag uint32) (Message, error) {
	if l.closed.Load() {
		return Message{}, fmt.Errorf("dist: recv: %w", ErrClosed)
	}
	if err := CheckRank(from, l.WorldSize()); err != nil {
		return Message{}, err
	}
	m, err := l.hub.boxes[l.rank].Get(ctx, from, tag)
	if err != nil && l.closed.Load() {
		return Message{}, fmt.Errorf("dist: recv: %w", ErrClosed)
	}
	return m, err
}

// Release implements Transport.
func (l *Local) Release(p []byte) { bufpool.Default.Put(p) }

// Close implements Transport: later calls on l return ErrClosed and the other
// ranks see this rank as cleanly gone (ErrPeerClosed once its messages are
// drained).
func (l *Local) Close() error {
	l.once.Do(func() {
		l.closed.Store(true)
		l.hub.boxes[l.rank].Fail(ErrClosed)
		for i, b := range l.hub.boxes {
			if i != l.rank {
				b.CloseSource(l.rank, &PeerError{Rank: l.rank, Op: "recv", Err: ErrPeerClosed})
			}
		}
	})
	return nil
}

// Kill simulates this rank crashing: every other rank's pending and later
// operations fail with a *PeerError wrapping ErrPeerLost, as they would when a
// TCP peer dies. It is for tests of failure handling.
func (l *Local) Kill() {
	l.once.Do(func() {
		l.closed.Store(true)
		// Fail the survivors first, so that a send racing with the kill sees
		// ErrPeerLost rather than this rank's own ErrClosed.
		for i, b := range l.hub.boxes {
			if i != l.rank {
				b.Fail(&PeerError{Rank: l.rank, Op: "recv", Err: ErrPeerLost})
			}
		}
		l.hub.boxes[l.rank].Fail(ErrClosed)
	})
}
