// Package colltest simulates a network for the collective algorithms of
// package coll: n members in one process, each link a FIFO queue bounded
// in messages, and random pauses on both sides of every message so that
// deliveries on different links are reordered from run to run. An
// algorithm that needs more buffering than one message per link, or that
// receives what it did not expect, fails or blocks here (a blocked run
// ends with the context's error).
package colltest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"time"

	"github.com/gdist/gdist/dist/internal/coll"
)

// Network is n simulated members. Its exchanges are safe for use by one
// goroutine per member.
type Network struct {
	n     int
	cap   int
	links [][]*link // links[from][to]
	rngs  []*rand.Rand
	stats []Stats
}

// Stats counts what one member sent.
type Stats struct {
	Messages int
	Bytes    int
	Streamed int // messages sent by SendStream
}

type link struct {
	mu     sync.Mutex
	cond   *sync.Cond
	q      [][]byte
	closed bool
}

// New returns a network of n members whose links each hold at most cap
// messages (cap >= 1: a transport always admits one message to an empty
// queue, and may admit no more), pausing at random (seeded by seed).
func New(n, cap int, seed uint64) *Network {
	nw := &Network{n: n, cap: max(cap, 1), links: make([][]*link, n), rngs: make([]*rand.Rand, n), stats: make([]Stats, n)}
	for i := range nw.links {
		nw.links[i] = make([]*link, n)
		for j := range nw.links[i] {
			l := &link{}
			l.cond = sync.NewCond(&l.mu)
			nw.links[i][j] = l
		}
		nw.rngs[i] = rand.New(rand.NewPCG(seed, uint64(i)))
	}
	return nw
}

// Exchange returns member me's exchange.
func (nw *Network) Exchange(me int) coll.Exchange { return &exchange{nw: nw, me: me} }

// Stats returns what member me sent.
func (nw *Network) Stats(me int) Stats { return nw.stats[me] }

// Close wakes every blocked call, which then fails.
func (nw *Network) Close() {
	for _, row := range nw.links {
		for _, l := range row {
			l.mu.Lock()
			l.closed = true
			l.cond.Broadcast()
			l.mu.Unlock()
		}
	}
}

// Pending returns the number of messages sent and not received: 0 after
// every member's collective has returned, or an algorithm left messages
// behind for the next one.
func (nw *Network) Pending() int {
	n := 0
	for _, row := range nw.links {
		for _, l := range row {
			l.mu.Lock()
			n += len(l.q)
			l.mu.Unlock()
		}
	}
	return n
}

type exchange struct {
	nw *Network
	me int
}

// pause yields or sleeps for a random while, so that members interleave
// differently on every run.
func (e *exchange) pause() {
	r := e.nw.rngs[e.me]
	switch v := r.IntN(16); {
	case v < 8:
	case v < 14:
		for range v - 7 {
			runtime.Gosched()
		}
	default:
		time.Sleep(time.Duration(r.IntN(50)) * time.Microsecond)
	}
}

func (e *exchange) check(peer int) error {
	if peer < 0 || peer >= e.nw.n {
		return fmt.Errorf("colltest: member %d addressed member %d of %d", e.me, peer, e.nw.n)
	}
	if peer == e.me {
		return fmt.Errorf("colltest: member %d addressed itself", e.me)
	}
	return nil
}

// wait blocks on l's condition until ok or ctx ends.
func wait(ctx context.Context, l *link, ok func() bool) error {
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() {
			l.mu.Lock()
			l.cond.Broadcast()
			l.mu.Unlock()
		})
		defer stop()
	}
	for !ok() {
		if l.closed {
			return fmt.Errorf("colltest: network closed")
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		l.cond.Wait()
	}
	return nil
}

func (e *exchange) Send(ctx context.Context, to int, p []byte) error {
	if err := e.check(to); err != nil {
		return err
	}
	e.pause()
	l := e.nw.links[e.me][to]
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := wait(ctx, l, func() bool { return len(l.q) < e.nw.cap }); err != nil {
		return fmt.Errorf("colltest: member %d send to %d: %w", e.me, to, err)
	}
	l.q = append(l.q, append([]byte{}, p...))
	e.nw.stats[e.me].Messages++
	e.nw.stats[e.me].Bytes += len(p)
	l.cond.Broadcast()
	return nil
}

// SendStream implements coll.StreamExchange: Send, counted in
// Stats.Streamed.
func (e *exchange) SendStream(ctx context.Context, to int, p []byte) error {
	err := e.Send(ctx, to, p)
	if err == nil {
		e.nw.stats[e.me].Streamed++
	}
	return err
}

func (e *exchange) Recv(ctx context.Context, from int, dst []byte, red coll.Reducer) error {
	if err := e.check(from); err != nil {
		return err
	}
	e.pause()
	l := e.nw.links[from][e.me]
	l.mu.Lock()
	if err := wait(ctx, l, func() bool { return len(l.q) > 0 }); err != nil {
		l.mu.Unlock()
		return fmt.Errorf("colltest: member %d recv from %d: %w", e.me, from, err)
	}
	m := l.q[0]
	l.q = l.q[1:]
	l.cond.Broadcast()
	l.mu.Unlock()
	if len(m) != len(dst) {
		return fmt.Errorf("%w: member %d got %d bytes from %d, want %d", coll.ErrProtocol, e.me, len(m), from, len(dst))
	}
	if red.Combine == nil {
		copy(dst, m)
	} else {
		red.Combine(dst, m)
	}
	return nil
}
