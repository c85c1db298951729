// Package mailbox holds the receive side shared by gdist's transports: bounded
// FIFO queues of messages matched on (source rank, tag).
//
// A transport's reader (a goroutine per TCP peer, or the sender itself
// in-process) Puts messages; Recv Gets them. Bytes queued per source are
// bounded: Put waits while the bound is exceeded and that source already has
// something queued, so a single message larger than the bound still passes
// and nothing is ever dropped.
//
// A (source, tag) queue exists only while it holds messages or has a
// waiting receiver: a drained queue nobody waits on is removed (and its
// struct recycled), so memory stays flat however many distinct tags a job
// uses.
//
// Posted receives. GetInto waits with a destination buffer: if nothing is
// queued on its (source, tag) it posts the buffer, and a producer that calls
// Claim before queueing gets it and fills it directly (the TCP reader reads
// the payload from the socket straight into it), then hands the result over
// with Complete. A claimed receive always waits for Complete, whatever its
// context does, so no producer ever writes into a buffer its owner has
// taken back.
package mailbox

import (
	"cmp"
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
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
	msgs    []item[M]
	head    int
	waiters int           // Gets and GetIntos waiting on this queue
	posted  *Post[M]      // a posted receive, only while msgs is empty
	notify  chan struct{} // capacity 1: "something was queued"
}

func (q *queue[M]) empty() bool { return q.head == len(q.msgs) }

// Post is a receive posted by GetInto and claimed by a producer.
type Post[M any] struct {
	// Dst is the receiver's buffer. Between Claim and Complete the producer
	// may write into it; after Complete it must not touch it (or the Post).
	Dst []byte
	// Combine, if not nil, asks the producer to merge the message into Dst
	// with it instead of copying, on pieces whose lengths are multiples of
	// Unit (GetReduce); only a message of exactly len(Dst) bytes is merged.
	// A producer that claims posts made by GetReduce must honour it.
	Combine func(dst, src []byte)
	Unit    int

	state int // postPosted, postClaimed, postDone (guarded by the mailbox's mu)
	msg   M
	n     int
	err   error
	done  chan struct{} // capacity 1: Complete was called
}

const (
	postIdle = iota
	postPosted
	postClaimed
	postDone
)

type source struct {
	queued  int           // payload bytes queued from this source
	space   chan struct{} // capacity wakeCap: "bytes were dequeued", one token per waiting Put
	waiters int           // Puts waiting for space
	err     error         // set when the source left; Gets on empty queues return it
	gets    atomic.Int32  // Gets and GetIntos waiting for a message from this source
	msgs    atomic.Int32  // messages queued from this source
	ended   atomic.Bool   // err is set, or the mailbox failed
	// tagGets counts the waiting Gets and GetIntos by tag modulo
	// tagBuckets, so that Quiet answers without the lock for a tag no
	// receive waits on while others wait for the same source on other tags
	// (as a job's long-lived receives do: its failure watch, for one).
	tagGets [tagBuckets]atomic.Int32
}

// tagBuckets is the number of tag buckets of source.tagGets.
const tagBuckets = 32

// waiting counts one more (d = 1) or one fewer (-1) Get waiting on tag.
func (s *source) waiting(tag uint32, d int32) {
	s.gets.Add(d)
	s.tagGets[tag%tagBuckets].Add(d)
}

// wakeCap bounds how many waiting Puts one dequeue wakes directly; further
// ones are woken in a chain by the Puts that succeed.
const wakeCap = 1024

// freeMax bounds the recycled queue structs and posts kept per mailbox.
const freeMax = 64

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
	drop  func(M) // called on messages discarded by Fail and FailSource

	mu        sync.Mutex
	queues    map[key]*queue[M]
	peak      int       // the most queues the map has held since it was made
	lastKey   key       // one-entry cache in front of queues: most traffic
	lastQ     *queue[M] // repeats the previous (src, tag)
	freeQ     []*queue[M]
	freePosts []*Post[M]
	sources   []source
	err       error         // fatal error; set once
	done      chan struct{} // closed when err is set

	poller Poller        // set before use (SetPoller), then read-only
	spin   time.Duration // how long a receive polls before it blocks
}

// Poller lets a goroutine that waits for a message deliver it itself, as a
// transport's reader would, instead of waiting to be woken: package shm
// reads its peer's ring from the waiting goroutine, which saves the
// hand-off from the reader goroutine to the receiver (two goroutine
// switches per message).
type Poller interface {
	// Begin and End bracket a goroutine's polling of source src.
	Begin(src int)
	End(src int)
	// Poll delivers, on the calling goroutine, what has arrived from src
	// and can be delivered at once (with Claim, Complete and Put, as a
	// reader does), and reports whether it delivered anything. It must not
	// block.
	Poll(src int) bool
}

// SetPoller makes Get, GetInto and GetReduce call p.Poll for up to spin
// since the last delivery before they block. Call it before the mailbox is
// used.
func (m *Mailbox[M]) SetPoller(p Poller, spin time.Duration) {
	m.poller, m.spin = p, spin
}

// pollCheck is how many polls go by between looks at the clock, the
// context and the other goroutines (runtime.Gosched).
const pollCheck = 32

// poll polls source src until a token arrives on a or b (it is consumed:
// the caller proceeds as if its select had received it) and returns true,
// or returns false when the spin budget runs out, ctx ends or the mailbox
// fails: the caller then blocks in its select, which sees why. Called
// without mu.
func (m *Mailbox[M]) poll(ctx context.Context, src int, a, b <-chan struct{}) bool {
	m.poller.Begin(src)
	defer m.poller.End(src)
	last := time.Now()
	for i := 1; ; i++ {
		delivered := m.poller.Poll(src)
		if delivered {
			last = time.Time{} // the budget starts again
		}
		// Looking at the channels locks them: only after a delivery (most
		// likely this receive's) and now and then (another goroutine's).
		if delivered || i%pollCheck == 0 {
			select {
			case <-a:
				return true
			case <-b:
				return true
			default:
			}
		}
		if i%pollCheck == 0 {
			now := time.Now()
			if last.IsZero() {
				last = now
			}
			if now.Sub(last) > m.spin || ctx.Err() != nil {
				return false
			}
			select {
			case <-m.done:
				return false
			default:
			}
			runtime.Gosched()
		}
	}
}

// New returns a mailbox for `world` sources that queues at most limit bytes
// per source (limit <= 0 means unbounded).
// drop, if not nil, is called on each message discarded by Fail or FailSource.
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

// queue returns the queue of k, creating it if needed.
func (m *Mailbox[M]) queue(k key) *queue[M] {
	if m.lastQ != nil && m.lastKey == k {
		return m.lastQ
	}
	q := m.queues[k]
	if q == nil {
		if n := len(m.freeQ); n > 0 {
			q = m.freeQ[n-1]
			m.freeQ[n-1] = nil
			m.freeQ = m.freeQ[:n-1]
		} else {
			q = &queue[M]{notify: make(chan struct{}, 1)}
		}
		m.queues[k] = q
		m.peak = max(m.peak, len(m.queues))
	}
	m.lastKey, m.lastQ = k, q
	return q
}

// shrinkMin: a map that held at least this many queues is rebuilt once it
// holds less than an eighth of its peak, since Go maps never give back the
// memory of a burst.
const shrinkMin = 1024

// lookup returns the queue of k without creating it.
func (m *Mailbox[M]) lookup(k key) *queue[M] {
	if m.lastQ != nil && m.lastKey == k {
		return m.lastQ
	}
	return m.queues[k]
}

// release removes q (the queue of k) if it is drained and nobody waits on
// it, and recycles it.
func (m *Mailbox[M]) release(k key, q *queue[M]) {
	if !q.empty() || q.waiters > 0 || q.posted != nil || m.queues[k] != q {
		return
	}
	delete(m.queues, k)
	if m.lastQ == q {
		m.lastQ = nil
	}
	if m.peak >= shrinkMin && len(m.queues) < m.peak/8 {
		qs := make(map[key]*queue[M], len(m.queues))
		for k, q := range m.queues {
			qs[k] = q
		}
		m.queues, m.peak = qs, len(qs)
	}
	if len(m.freeQ) < freeMax {
		select { // drop a stale wake-up
		case <-q.notify:
		default:
		}
		q.msgs = q.msgs[:0]
		q.head = 0
		if cap(q.msgs) > 64 {
			q.msgs = nil // do not pin a burst's backlog
		}
		m.freeQ = append(m.freeQ, q)
	}
}

// Len returns the number of (source, tag) queues the mailbox holds: those
// with queued messages or waiting receivers.
func (m *Mailbox[M]) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.queues)
}

// Backlog is what is queued from one source under one tag.
type Backlog struct {
	Src   int
	Tag   uint32
	Msgs  int // messages queued
	Bytes int // their payload bytes
}

// Backlog returns what is queued and not received yet, one entry per
// (source, tag) that holds messages, ordered by source and tag.
func (m *Mailbox[M]) Backlog() []Backlog {
	m.mu.Lock()
	var out []Backlog
	for k, q := range m.queues {
		if q.empty() {
			continue
		}
		b := Backlog{Src: k.src, Tag: k.tag, Msgs: len(q.msgs) - q.head}
		for _, it := range q.msgs[q.head:] {
			b.Bytes += it.size
		}
		out = append(out, b)
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b Backlog) int {
		return cmp.Or(cmp.Compare(a.Src, b.Src), cmp.Compare(a.Tag, b.Tag))
	})
	return out
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Put queues msg, whose payload is size bytes, from src under tag; ownership
// of msg passes to the mailbox. It waits for space (see package doc) and
// returns an error if ctx ends, src failed or the mailbox fails first; the
// payload is then not queued.
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
			s.msgs.Add(1)
			signal(q.notify)
			m.mu.Unlock()
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
			return fmt.Errorf("transport: send: %w", ctx.Err())
		}
		m.mu.Lock()
		s.waiters--
	}
}

// take dequeues the head of q (which must not be empty) and accounts for
// it. It is called with mu held and returns with it released.
func (m *Mailbox[M]) take(k key, q *queue[M]) M {
	it := q.msgs[q.head]
	q.msgs[q.head] = item[M]{}
	q.head++
	if q.empty() {
		q.msgs = q.msgs[:0]
		q.head = 0
		m.release(k, q)
	} else {
		signal(q.notify) // let another waiter on this key see the rest
	}
	s := &m.sources[k.src]
	s.queued -= it.size
	s.msgs.Add(-1)
	w := s.waiters
	m.mu.Unlock()
	wake(s.space, w)
	return it.msg
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
		if !q.empty() {
			return m.take(k, q), nil
		}
		if err := m.sources[src].err; err != nil {
			m.release(k, q)
			m.mu.Unlock()
			return zero, err
		}
		q.waiters++
		m.sources[src].waiting(tag, 1)
		notify := q.notify
		m.mu.Unlock()
		var err error
		if m.poller == nil || !m.poll(ctx, src, notify, nil) {
			select {
			case <-notify:
			case <-m.done:
			case <-ctx.Done():
				err = fmt.Errorf("transport: recv from rank %d: %w", src, ctx.Err())
			}
		}
		m.mu.Lock()
		q.waiters--
		m.sources[src].waiting(tag, -1)
		if err != nil {
			m.release(k, q)
			m.mu.Unlock()
			return zero, err
		}
	}
}

// GetInto is Get with a destination. If a message is queued it returns it
// with direct == false: the caller copies it into dst. Otherwise it posts
// dst (see package doc): if a producer claims it, GetInto returns what the
// producer passed to Complete with direct == true, and err is the
// producer's error. Once claimed, GetInto waits for Complete even if ctx
// ends. Only one receive per (source, tag) is posted at a time; concurrent
// ones wait for queued messages as Get does.
func (m *Mailbox[M]) GetInto(ctx context.Context, src int, tag uint32, dst []byte) (msg M, n int, direct bool, err error) {
	return m.getInto(ctx, src, tag, dst, 0, nil)
}

// GetReduce is GetInto for a receive that combines the message into dst:
// a producer that claims its post finds Combine and Unit set.
func (m *Mailbox[M]) GetReduce(ctx context.Context, src int, tag uint32, dst []byte, unit int, combine func(dst, src []byte)) (msg M, n int, direct bool, err error) {
	return m.getInto(ctx, src, tag, dst, unit, combine)
}

func (m *Mailbox[M]) getInto(ctx context.Context, src int, tag uint32, dst []byte, unit int, combine func(dst, src []byte)) (msg M, n int, direct bool, err error) {
	k := key{src, tag}
	m.mu.Lock()
	p := m.newPost(dst)
	p.Combine, p.Unit = combine, unit
	defer func() {
		m.mu.Lock()
		m.freePost(p)
		m.mu.Unlock()
	}()
	for {
		if p.state == postClaimed || p.state == postDone {
			for p.state != postDone {
				done := p.done
				m.mu.Unlock()
				<-done // the producer always completes what it claimed
				m.mu.Lock()
			}
			msg, n, err = p.msg, p.n, p.err
			m.mu.Unlock()
			return msg, n, true, err
		}
		q := m.queue(k)
		unpost := func() {
			if q.posted == p {
				q.posted = nil
				p.state = postIdle
			}
		}
		if m.err != nil {
			unpost()
			err = m.err
			m.release(k, q)
			m.mu.Unlock()
			return msg, 0, false, err
		}
		if !q.empty() {
			unpost()
			return m.take(k, q), 0, false, nil
		}
		if e := m.sources[src].err; e != nil {
			unpost()
			m.release(k, q)
			m.mu.Unlock()
			return msg, 0, false, e
		}
		if q.posted == nil && p.state == postIdle {
			q.posted = p
			p.state = postPosted
		}
		q.waiters++
		m.sources[src].waiting(tag, 1)
		notify := q.notify
		m.mu.Unlock()
		var cerr error
		if m.poller == nil || !m.poll(ctx, src, notify, p.done) {
			select {
			case <-notify:
			case <-p.done:
			case <-m.done:
			case <-ctx.Done():
				cerr = ctx.Err()
			}
		}
		m.mu.Lock()
		q.waiters--
		m.sources[src].waiting(tag, -1)
		if cerr != nil && p.state != postClaimed && p.state != postDone {
			unpost()
			m.release(k, q)
			m.mu.Unlock()
			return msg, 0, false, fmt.Errorf("transport: recv from rank %d: %w", src, cerr)
		}
		if p.state == postClaimed || p.state == postDone {
			m.release(k, q)
		}
	}
}

// Quiet reports whether a receive from src under tag may take the
// source's next message for tag straight from the producer: nothing from
// (src, tag) is queued or posted, no other receive waits there, and
// neither the mailbox nor the source has ended. The answer holds while
// nothing from src is delivered meanwhile (the producer counts its
// deliveries to know).
func (m *Mailbox[M]) Quiet(src int, tag uint32) bool {
	if src >= 0 && src < len(m.sources) {
		s := &m.sources[src]
		if s.msgs.Load() == 0 && s.tagGets[tag%tagBuckets].Load() == 0 && !s.ended.Load() {
			return true // nothing queued from src, no receive waiting on tag: no lock needed
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil || src < 0 || src >= len(m.sources) || m.sources[src].err != nil {
		return false
	}
	q := m.lookup(key{src, tag})
	return q == nil || (q.empty() && q.posted == nil && q.waiters == 0)
}

// Waiting reports whether a Get, GetInto or GetReduce waits for a message
// from src (polling or blocked). It takes no lock.
func (m *Mailbox[M]) Waiting(src int) bool {
	return src >= 0 && src < len(m.sources) && m.sources[src].gets.Load() > 0
}

// newPost returns a posted-receive record for dst; called with mu held.
func (m *Mailbox[M]) newPost(dst []byte) *Post[M] {
	var p *Post[M]
	if n := len(m.freePosts); n > 0 {
		p = m.freePosts[n-1]
		m.freePosts[n-1] = nil
		m.freePosts = m.freePosts[:n-1]
	} else {
		p = &Post[M]{done: make(chan struct{}, 1)}
	}
	p.Dst = dst
	p.state = postIdle
	return p
}

// freePost recycles p; called with mu held.
func (m *Mailbox[M]) freePost(p *Post[M]) {
	var zero M
	p.Dst, p.msg, p.err, p.n = nil, zero, nil, 0
	p.Combine, p.Unit = nil, 0
	select {
	case <-p.done:
	default:
	}
	if len(m.freePosts) < freeMax {
		m.freePosts = append(m.freePosts, p)
	}
}

// Claim is called by a producer about to deliver a message from src under
// tag. If a receive is posted there and nothing is queued ahead of it, Claim
// takes it and returns it; the producer then owns p.Dst until it calls
// Complete, which it must do exactly once. Otherwise Claim returns nil and
// the producer Puts the message as usual.
func (m *Mailbox[M]) Claim(src int, tag uint32) *Post[M] {
	k := key{src, tag}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return nil
	}
	q := m.lookup(k)
	if q == nil || q.posted == nil || !q.empty() {
		return nil
	}
	p := q.posted
	q.posted = nil
	p.state = postClaimed
	m.release(k, q)
	return p
}

// Complete hands the result of a claimed receive to its receiver: msg (the
// message without its payload), n payload bytes written to p.Dst, or err.
// The producer must not use p afterwards.
func (m *Mailbox[M]) Complete(p *Post[M], msg M, n int, err error) {
	m.mu.Lock()
	p.msg, p.n, p.err = msg, n, err
	p.state = postDone
	done := p.done
	m.mu.Unlock()
	signal(done)
}

// CloseSource records that src will send nothing more. Messages already
// queued from it are still delivered; after that Gets from it return err.
// Only the first call per source has an effect.
func (m *Mailbox[M]) CloseSource(src int, err error) {
	m.closeSource(src, err, false)
}

// FailSource records that src was lost: messages queued from it are
// dropped, and pending and later Gets from it return err (receives a
// producer already claimed still complete). Only the first CloseSource or
// FailSource per source has an effect.
func (m *Mailbox[M]) FailSource(src int, err error) {
	m.closeSource(src, err, true)
}

func (m *Mailbox[M]) closeSource(src int, err error, discard bool) {
	m.mu.Lock()
	s := &m.sources[src]
	first := s.err == nil
	if first {
		s.err = err
		s.ended.Store(true)
	}
	for k, q := range m.queues {
		if k.src != src {
			continue
		}
		if first && discard {
			for i := q.head; i < len(q.msgs); i++ {
				if m.drop != nil {
					m.drop(q.msgs[i].msg)
				}
				q.msgs[i] = item[M]{}
			}
			s.msgs.Add(-int32(len(q.msgs) - q.head))
			q.msgs, q.head = q.msgs[:0], 0
			s.queued = 0
		}
		signal(q.notify)
		m.release(k, q)
	}
	w := s.waiters
	m.mu.Unlock()
	wake(s.space, w)
}

// SourceErr returns the error recorded by CloseSource or FailSource for
// src, or nil.
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
	for i := range m.sources {
		m.sources[i].ended.Store(true)
	}
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
