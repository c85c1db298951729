// Package rawtcp is the raw-socket baseline of gdist's benchmarks: plain TCP
// (package net only, nothing of gdist on the path) between the same two
// rank processes a benchmark measures, in the same run, so that its figures
// can be printed as ratios to what the machine's loopback gives at that
// moment. It measures ping-pong round trips, one-way streaming, both-ways
// streaming and the lock-step rounds of a 2-rank ring.
//
// The two sides must call the same methods in the same order with the same
// arguments. The lower rank is the leader: it listens, initiates the
// ping-pong, sends the stream and reports the figures; the other side's
// figures are its own view (zero where it has none).
//
// It does not import package dist: a *dist.ProcessGroup is a Peer, over
// which Connect sends the listener's address.
//
// # Usage
//
//	c, err := rawtcp.Connect(ctx, pg, pg.Rank(), 1-pg.Rank(), tagRawAddr)
//	if err != nil { ... }
//	defer c.Close()
//	f, err := c.Measure(ctx, rawtcp.Config{ExchangeBytes: gradBytes})
//	if c.Leader() {
//		fmt.Printf("raw: %.1f us one way, %.2f GB/s\n", f.LatencyUs, f.StreamGBps)
//	}
package rawtcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"time"
)

// Peer carries the listener's address from the leader to the other rank: a
// *dist.ProcessGroup's point-to-point messages.
type Peer interface {
	Send(ctx context.Context, to int, tag uint32, p []byte) error
	Recv(ctx context.Context, from int, tag uint32) ([]byte, error)
}

// Conn is a plain TCP connection between two ranks (Nagle off).
type Conn struct {
	c      *net.TCPConn
	leader bool
}

// Connect opens a Conn between ranks me and peer: the lower rank listens on
// loopback, sends its address to the other through p with tag and accepts;
// the other dials. ctx bounds the whole setup.
func Connect(ctx context.Context, p Peer, me, peer int, tag uint32) (*Conn, error) {
	if me == peer {
		return nil, fmt.Errorf("rawtcp: connect rank %d to itself", me)
	}
	if me < peer {
		l, err := Listen("127.0.0.1")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		if err := p.Send(ctx, peer, tag, []byte(l.Addr())); err != nil {
			return nil, fmt.Errorf("rawtcp: send address: %w", err)
		}
		return l.Accept(ctx)
	}
	addr, err := p.Recv(ctx, peer, tag)
	if err != nil {
		return nil, fmt.Errorf("rawtcp: receive address: %w", err)
	}
	return Dial(ctx, string(addr))
}

// Listener is the leader's side of the setup, for programs that pass the
// address themselves.
type Listener struct{ l *net.TCPListener }

// Listen listens on a free port of host.
func Listen(host string) (*Listener, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, fmt.Errorf("rawtcp: %w", err)
	}
	return &Listener{l: l.(*net.TCPListener)}, nil
}

// Addr is the address to Dial.
func (l *Listener) Addr() string { return l.l.Addr().String() }

// Close closes the listener (not the accepted Conn).
func (l *Listener) Close() error { return l.l.Close() }

// Accept waits, until ctx ends, for the other rank to Dial; the Conn it
// returns is the leader's.
func (l *Listener) Accept(ctx context.Context) (*Conn, error) {
	stop := context.AfterFunc(ctx, func() { _ = l.l.SetDeadline(time.Now()) })
	defer stop()
	c, err := l.l.AcceptTCP()
	if err != nil {
		return nil, ctxErr(ctx, "accept", err)
	}
	return newConn(c, true), nil
}

// Dial connects to a Listener's address; the Conn it returns is not the
// leader's.
func Dial(ctx context.Context, addr string) (*Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("rawtcp: %w", err)
	}
	return newConn(c.(*net.TCPConn), false), nil
}

func newConn(c *net.TCPConn, leader bool) *Conn {
	_ = c.SetNoDelay(true)
	return &Conn{c: c, leader: leader}
}

// Leader reports whether this is the leader's side.
func (c *Conn) Leader() bool { return c.leader }

// Close closes the connection.
func (c *Conn) Close() error { return c.c.Close() }

// SetBuffers sets the kernel's send and receive buffers of the socket to n
// bytes (as a transport's socket-buffer option would, for a fair baseline).
func (c *Conn) SetBuffers(n int) error {
	return errors.Join(c.c.SetReadBuffer(n), c.c.SetWriteBuffer(n))
}

// watch makes the connection's blocking calls return once ctx ends; call
// the returned function when done.
func (c *Conn) watch(ctx context.Context) func() bool {
	return context.AfterFunc(ctx, func() { _ = c.c.SetDeadline(time.Now()) })
}

// ctxErr returns ctx's error if it has ended (the deadline it set is the
// cause of err), else err, both prefixed with op.
func ctxErr(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("rawtcp: %s: %w", op, ctx.Err())
	}
	return fmt.Errorf("rawtcp: %s: %w", op, err)
}

// Sync lines both sides up: a one-byte round trip.
func (c *Conn) Sync(ctx context.Context) error {
	defer c.watch(ctx)()
	if err := c.sync(); err != nil {
		return ctxErr(ctx, "sync", err)
	}
	return nil
}

func (c *Conn) sync() error {
	var x [1]byte
	if c.leader {
		if _, err := c.c.Write(x[:]); err != nil {
			return err
		}
		_, err := io.ReadFull(c.c, x[:])
		return err
	}
	if _, err := io.ReadFull(c.c, x[:]); err != nil {
		return err
	}
	_, err := c.c.Write(x[:])
	return err
}

// Latency summarises round-trip times.
type Latency struct {
	Median, Mean time.Duration
	N            int // round trips measured
}

// Summarize returns the median and mean of d (zero for none); d is not
// modified.
func Summarize(d []time.Duration) Latency {
	if len(d) == 0 {
		return Latency{}
	}
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return Latency{Median: s[len(s)/2], Mean: sum / time.Duration(len(s)), N: len(s)}
}

// PingPong times n round trips of a size-byte message after warmup
// untimed ones: the leader sends, the other side echoes. The leader gets
// the round-trip times; the other side a zero Latency.
func (c *Conn) PingPong(ctx context.Context, size, warmup, n int) (Latency, error) {
	defer c.watch(ctx)()
	if err := c.sync(); err != nil {
		return Latency{}, ctxErr(ctx, "ping-pong", err)
	}
	buf := make([]byte, max(size, 1))
	var rtts []time.Duration
	if c.leader {
		rtts = make([]time.Duration, 0, n)
	}
	for i := range warmup + n {
		t0 := time.Now()
		var err error
		if c.leader {
			if _, err = c.c.Write(buf); err == nil {
				_, err = io.ReadFull(c.c, buf)
			}
		} else if _, err = io.ReadFull(c.c, buf); err == nil {
			_, err = c.c.Write(buf)
		}
		if err != nil {
			return Latency{}, ctxErr(ctx, "ping-pong", err)
		}
		if c.leader && i >= warmup {
			rtts = append(rtts, time.Since(t0))
		}
	}
	return Summarize(rtts), nil
}

// Stream sends n messages of size bytes from the leader to the other side,
// which acknowledges once it has read them all, and returns the bytes per
// second each side saw (the leader's includes the acknowledgement).
func (c *Conn) Stream(ctx context.Context, size, n int) (float64, error) {
	defer c.watch(ctx)()
	if err := c.sync(); err != nil {
		return 0, ctxErr(ctx, "stream", err)
	}
	buf := make([]byte, size)
	var ack [1]byte
	t0 := time.Now()
	var err error
	if c.leader {
		for i := 0; i < n && err == nil; i++ {
			_, err = c.c.Write(buf)
		}
		if err == nil {
			_, err = io.ReadFull(c.c, ack[:])
		}
	} else {
		for i := 0; i < n && err == nil; i++ {
			_, err = io.ReadFull(c.c, buf)
		}
		if err == nil {
			_, err = c.c.Write(ack[:])
		}
	}
	if err != nil {
		return 0, ctxErr(ctx, "stream", err)
	}
	return float64(size) * float64(n) / time.Since(t0).Seconds(), nil
}

// Exchange has both sides send n messages of size bytes to each other at
// once, streaming (neither waits for the other's messages before sending
// its next), and returns the time it took on this side: a both-ways
// stream.
func (c *Conn) Exchange(ctx context.Context, size, n int) (time.Duration, error) {
	return c.exchange(ctx, "exchange", size, n, false)
}

// Rounds runs n rounds in which both sides send size bytes to each other at
// once and each starts the next round only once it has received the
// current one: what a 2-rank ring moves (a ring step waits for its input),
// without the arithmetic. It returns the time the rounds took on this side.
func (c *Conn) Rounds(ctx context.Context, size, n int) (time.Duration, error) {
	return c.exchange(ctx, "rounds", size, n, true)
}

func (c *Conn) exchange(ctx context.Context, op string, size, n int, lockstep bool) (time.Duration, error) {
	defer c.watch(ctx)()
	if err := c.sync(); err != nil {
		return 0, ctxErr(ctx, op, err)
	}
	out, in := make([]byte, size), make([]byte, size)
	// One token per message the writer may send: all at once when
	// streaming, one per round in lock-step.
	var next chan struct{}
	if lockstep {
		next = make(chan struct{}, 1)
	} else {
		next = make(chan struct{}, n)
		for range n {
			next <- struct{}{}
		}
	}
	werr := make(chan error, 1)
	go func() { // the writer, owned by this call: it ends when next is closed
		var err error
		for range next {
			if err == nil {
				_, err = c.c.Write(out)
			}
		}
		werr <- err
	}()
	t0 := time.Now()
	var rerr error
	for range n {
		if lockstep {
			next <- struct{}{}
		}
		if _, rerr = io.ReadFull(c.c, in); rerr != nil {
			break
		}
	}
	d := time.Since(t0)
	close(next)
	if err := errors.Join(rerr, <-werr); err != nil {
		return 0, ctxErr(ctx, op, err)
	}
	return d, nil
}

// Config sets what Measure measures; zero fields take the defaults.
type Config struct {
	Pings       int // 8-byte round trips (default 2000, after Pings/10 warm-up)
	StreamBytes int // bytes streamed one way (default 64 MiB)
	Chunk       int // bytes per write of the stream (default 1 MiB)
	// ExchangeBytes > 0 also measures ExchangeReps (default 10) exchanges
	// of a 2-rank ring all-reduce of that many bytes: two rounds of half
	// of them each way.
	ExchangeBytes int
	ExchangeReps  int
}

// Figures are the standard baseline, as the leader saw it.
type Figures struct {
	LatencyUs  float64 // one-way latency: half the mean round trip of 8 bytes
	StreamGBps float64 // one-way streaming, GB/s (1e9 bytes)
	// ExchangeMs is the time of one 2-rank ring exchange of
	// ExchangeBytes (0 if not measured).
	ExchangeMs    float64
	ExchangeBytes int
}

// Measure runs the standard baseline: ping-pong, stream and, if asked, the
// ring exchange.
func (c *Conn) Measure(ctx context.Context, cfg Config) (Figures, error) {
	pings := cmpOr(cfg.Pings, 2000)
	stream := cmpOr(cfg.StreamBytes, 64<<20)
	chunk := cmpOr(cfg.Chunk, 1<<20)
	reps := cmpOr(cfg.ExchangeReps, 10)
	var f Figures
	l, err := c.PingPong(ctx, 8, pings/10, pings)
	if err != nil {
		return f, err
	}
	f.LatencyUs = float64(l.Mean) / 1e3 / 2
	bw, err := c.Stream(ctx, chunk, max(stream/chunk, 1))
	if err != nil {
		return f, err
	}
	if c.leader {
		f.StreamGBps = bw / 1e9
	}
	if cfg.ExchangeBytes > 0 {
		d, err := c.Rounds(ctx, cfg.ExchangeBytes/2, 2*reps)
		if err != nil {
			return f, err
		}
		f.ExchangeBytes = cfg.ExchangeBytes
		f.ExchangeMs = 1e3 * d.Seconds() / float64(reps)
	}
	return f, nil
}

func cmpOr(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}
