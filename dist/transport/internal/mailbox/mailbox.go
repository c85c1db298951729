// Package mailbox holds the receive side shared by gdist's transports: bounded
// FIFO queues of messages matched on (source rank, tag).
//
// A transport's reader (a goroutine per TCP peer, or the sender itself
// in-process) Puts messages; Recv Gets them. Bytes queued per source are
// bounded: Put waits while the bound is exceeded and that source already has
// something queued, so a single message larger than the bound still passes
// and nothing is ever dropped.
package mailbox

import (
	"context"
	"fmt"
	"sync"
)

type key struct {
	src int
	tag uint32
}

type item[M any] struct {
	msg  M
	size int
}

type queue[M any] struct {
	msgs   []item[M]
	head   int
	notify chan struct{} // capacity 1: "something was queued"
}

type source struct {
	queued  int           // payload bytes queued from this source
	space   chan struct{} // capacity wakeCap: "bytes were dequeued", one token per waiting Put
	waiters int           // Puts waiting for space
	err     error         // set when the source left; Gets on empty queues return it
}

// wakeCap bounds how many waiting Puts one dequeue wakes directly; further
// ones are woken in a chain by the Puts that succeed.
const wakeCap = 1024

// wake puts up to n tokens into c without blocking.
func wake(c chan struct{}, n int) {
	for range min(n, cap(c)) {
		select {
		case c <- struct{}{}:
		default:
			return
		}
	}
}

// Mailbox is safe for concurrent use. M is the transport's message type.
type Mailbox[M any] struct {
	limit int
	drop  func(M) // called on messages discarded by Fail

	mu      sync.Mutex
	queues  map[key]*queue[M]
	lastKey key       // one-entry cache in front of queues: most traffic
	lastQ   *queue[M] // repeats the previous (src, tag)
	sources []source
	err     error         // fatal error; set once
	done    chan struct{} // closed when err is set
}

// New returns a mailbox for `world` sources that queues at most limit bytes
// per source (limit <= 0 means unbounded).
// drop, if not nil, is called on each message discarded by Fail.
func New[M any](world, limit int, drop func(M)) *Mailbox[M] {
	m := &Mailbox[M]{
		limit:   limit,
		drop:    drop,
		queues:  make(map[key]*queue[M]),
		sources: make([]source, world),
		done:    make(chan struct{}),
	}
	for i := range m.sources {
		m.sources[i].space = make(chan struct{}, wakeCap)
	}
	return m
}

func (m *Mailbox[M]) queue(k key) *queue[M] {
	if m.lastQ != nil && m.lastKey == k {
		return m.lastQ
	}
	q := m.queues[k]
	if q == nil {
		q = &queue[M]{notify: make(chan struct{}, 1)}
		m.queues[k] = q
	}
	m.lastKey, m.lastQ = k, q
	return q
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Put queues msg, whose payload is size bytes, from src under tag; ownership
// of msg passes to the mailbox. It waits for space (see package doc) and returns an error if ctx
// ends or the mailbox fails first; the payload is then not queued.
func (m *Mailbox[M]) Put(ctx context.Context, src int, tag uint32, msg M, size int) error {
	n := size
	waited := false
	m.mu.Lock()
	for {
		if m.err != nil {
			err := m.err
			m.mu.Unlock()
			return err
		}
		s := &m.sources[src]
		if s.err != nil {
			m.mu.Unlock()
			return s.err
		}
		if m.limit <= 0 || s.queued == 0 || s.queued+n <= m.limit {
			s.queued += n
			room := m.limit > 0 && s.queued < m.limit
			q := m.queue(key{src, tag})
			q.msgs = append(q.msgs, item[M]{msg, size})
			m.mu.Unlock()
			signal(q.notify)
			if waited && room {
				// More waiters than wakeCap: pass the wake-up on.
				signal(s.space)
			}
			return nil
		}
		// Every waiting Put gets a token when bytes are dequeued, so one that
		// still does not fit cannot strand another that would.
		space := s.space
		waited = true
		s.waiters++
		m.mu.Unlock()
		select {
		case <-space:
		case <-m.done:
		case <-ctx.Done():
			m.mu.Lock()
			s.waiters--
			m.mu.Unlock()
			return fmt.Errorf("dist: send: %w", ctx.Err())
		}
		m.mu.Lock()
		s.waiters--
	}
}

// Get returns the next message from src under tag, waiting until one arrives,
// ctx ends, src leaves (its error is returned once its queue is drained) or
// the mailbox fails.
func (m *Mailbox[M]) Get(ctx context.Context, src int, tag uint32) (M, error) {
	var zero M
	k := key{src, tag}
	m.mu.Lock()
	for {
		if m.err != nil {
			err := m.err
			m.mu.Unlock()
			return zero, err
		}
		q := m.queue(k)
		if q.head < len(q.msgs) {
			it := q.msgs[q.head]
			q.msgs[q.head] = item[M]{}
			q.head++
			if q.head == len(q.msgs) {
				q.msgs = q.msgs[:0]
				q.head = 0
			} else {
				signal(q.notify) // let another waiter on this key see the rest
			}
			s := &m.sources[src]
			s.queued -= it.size
			w := s.waiters
			m.mu.Unlock()
			wake(s.space, w)
			return it.msg, nil
		}
		if err := m.sources[src].err; err != nil {
			m.mu.Unlock()
			return zero, err
		}
		notify := q.notify
		m.mu.Unlock()
		select {
		case <-notify:
		case <-m.done:
		case <-ctx.Done():
			return zero, fmt.Errorf("dist: recv from rank %d: %w", src, ctx.Err())
		}
		m.mu.Lock()
	}
}

// CloseSource records that src will send nothing more. Messages already
// queued from it are still delivered; after that Gets from it return err.
// Only the first call per source has an effect.
func (m *Mailbox[M]) CloseSource(src int, err error) {
	m.mu.Lock()
	s := &m.sources[src]
	if s.err == nil {
		s.err = err
	}
	for k, q := range m.queues {
		if k.src == src {
			signal(q.notify)
		}
	}
	w := s.waiters
	m.mu.Unlock()
	wake(s.space, w)
}

// SourceErr returns the error recorded by CloseSource for src, or nil.
func (m *Mailbox[M]) SourceErr(src int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sources[src].err
}

// Fail makes every pending and later Put and Get return err. Queued messages
// are passed to the drop function. Only the first call has an effect; it
// reports whether this call was the first.
func (m *Mailbox[M]) Fail(err error) bool {
	m.mu.Lock()
	if m.err != nil {
		m.mu.Unlock()
		return false
	}
	m.err = err
	for k, q := range m.queues {
		for i := q.head; i < len(q.msgs); i++ {
			if m.drop != nil {
				m.drop(q.msgs[i].msg)
			}
		}
		delete(m.queues, k)
	}
	m.lastQ = nil
	close(m.done)
	m.mu.Unlock()
	return true
}

// Err returns the error Fail recorded, or nil.
func (m *Mailbox[M]) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

// Done is closed when the mailbox fails.
func (m *Mailbox[M]) Done() <-chan struct{} { return m.done }
