package tcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/internal/bufpool"
	"github.com/gdist/gdist/dist/transport/internal/mailbox"
	"github.com/gdist/gdist/dist/transport/tcp/internal/wire"
)

const (
	// smallCopy: payloads up to this size are copied behind the header and
	// written with one write; larger ones go out with one writev.
	smallCopy = 4 << 10
	// readChunk: large payloads are read with reads of at most this many
	// bytes (each read that returns bytes counts as liveness).
	readChunk = 1 << 20
	// readBuf is the size of each link's read buffer.
	readBuf = 64 << 10
	// yieldMin: after queueing a payload this large the reader yields.
	yieldMin = 16 << 10
	// postedMax: a payload up to this size is read straight into a posted
	// receive (RecvInto); a larger one is read into a pooled buffer, which
	// the receiver copies into its own. The kernel's copy into a large
	// destination measured slower than the bounce through a reused pooled
	// buffer: the 4 MiB segments of a 16 MiB 2-rank broadcast over TCP
	// (GOMAXPROCS=1 per rank) took ~25% longer read straight into the
	// caller's vector, on both the best and the typical blocks of
	// alternating runs. (A guess at why: Go's memmove streams copies of
	// 1 MiB and more with non-temporal stores; the kernel's copy does not.)
	postedMax = 1 << 20
)

// Pending control work of a link (peer.pending). The link's control
// goroutine performs it, or a data writer that holds the write lock anyway
// (see peer.post).
const (
	pendCredit    = 1 << iota // send a Credit frame for the freed bytes
	pendBlocked               // send a Blocked frame
	pendHeartbeat             // send a Heartbeat frame
	pendEcho                  // answer a Heartbeat: send an Echo with peer.echo
	pendShutdown              // send nothing more: shut down the write side
)

// peer is one established link.
type peer struct {
	t    *Transport
	rank int
	conn stream       // the connection, or TLS over it
	raw  *net.TCPConn // the connection itself: what closing closes
	br   *frameReader

	// what the peer said in the handshake
	window   int64  // its queue limit for us: our send window (0 = unbounded)
	maxFrame uint64 // the largest payload it accepts

	// write side, guarded by wmu
	wmu     sync.Mutex
	wclosed bool
	hdr     [wire.HeaderSize]byte
	small   []byte // header + small payload
	vec     [2][]byte
	bufs    net.Buffers
	tx      atomic.Uint64 // frames written
	pending atomic.Uint32 // pend* bits
	ctl     chan struct{} // capacity 1: wakes the control goroutine

	// send credit (this rank -> peer)
	cmu         sync.Mutex
	inflight    int64         // bytes sent and not credited back (guarded by cmu)
	blockedSent bool          // a Blocked frame went out since the last Credit (guarded by cmu)
	waiters     int           // sends waiting for credit (guarded by cmu)
	credit      chan struct{} // a token per waiting send when credit arrives

	// receive credit (peer -> this rank)
	freed       atomic.Int64 // bytes the application took and we have not credited yet
	peerBlocked atomic.Bool

	// liveness
	rx       atomic.Uint64 // frames (and payload reads) read
	echo     atomic.Uint64 // stamp of the last Heartbeat received, to echo
	lastRx   uint64        // monitor only
	lastRxAt time.Time     // monitor only
	lastHbAt time.Time     // monitor only: when the last heartbeat was posted

	readDone chan struct{} // closed when readLoop returns

	gone     atomic.Bool // the peer said goodbye
	goneCh   chan struct{}
	goneOnce sync.Once

	lost     atomic.Bool // the link broke (see Transport.fail)
	lostErr  error       // why; set before lost
	lostCh   chan struct{}
	lostOnce sync.Once
}

func newPeer(t *Transport, rank int, l link) *peer {
	info := l.info
	p := &peer{
		t:        t,
		rank:     rank,
		conn:     l.conn,
		raw:      l.raw,
		br:       l.br,
		window:   int64(min(info.QueueLimit, 1<<62)),
		maxFrame: info.MaxFrame,
		small:    make([]byte, wire.HeaderSize+smallCopy),
		credit:   make(chan struct{}, wakeCap),
		ctl:      make(chan struct{}, 1),
		readDone: make(chan struct{}),
		goneCh:   make(chan struct{}),
		lostCh:   make(chan struct{}),
		lastRxAt: time.Now(),
	}
	p.br.rx = &p.rx
	return p
}

// wakeCap bounds how many waiting sends one Credit wakes directly; the rest
// are woken in a chain by the sends that succeed.
const wakeCap = 1024

func signal(c chan struct{}) { wake(c, 1) }

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

// acquire waits until the peer can queue n more bytes from us and reserves
// them. Nothing is reserved when it returns an error.
func (p *peer) acquire(ctx context.Context, n int) error {
	if p.window <= 0 {
		return nil
	}
	waited := false
	p.cmu.Lock()
	for {
		if p.inflight == 0 || p.inflight+int64(n) <= p.window {
			p.inflight += int64(n)
			room := p.inflight < p.window
			p.cmu.Unlock()
			if waited && room {
				signal(p.credit) // more waiters than wakeCap: pass the wake-up on
			}
			return nil
		}
		notify := !p.blockedSent
		p.blockedSent = true
		p.waiters++
		p.cmu.Unlock()
		waited = true
		if notify {
			p.post(pendBlocked)
		}
		var err error
		select {
		case <-p.credit:
		case <-ctx.Done():
			err = fmt.Errorf("tcp: send to rank %d: %w", p.rank, ctx.Err())
		case <-p.goneCh:
			err = p.goneErr("send")
		case <-p.lostCh:
			err = p.goneErr("send")
		case <-p.t.stop:
			err = errClosed("send")
		}
		p.cmu.Lock()
		p.waiters--
		if err != nil {
			p.cmu.Unlock()
			return err
		}
	}
}

// addCredit handles a Credit frame.
func (p *peer) addCredit(n uint64) error {
	p.cmu.Lock()
	p.inflight -= int64(min(n, 1<<62))
	bad := p.inflight < 0
	p.blockedSent = false
	w := p.waiters
	p.cmu.Unlock()
	if bad {
		return fmt.Errorf("%w: credit of %d bytes exceeds what was sent", ErrProtocol, n)
	}
	wake(p.credit, w)
	return nil
}

// consumed records that the application took n bytes from this peer's queue
// and sends credit when enough has accumulated or the peer is waiting.
func (p *peer) consumed(n int) {
	if p.t.creditAt == 0 {
		return
	}
	if f := p.freed.Add(int64(n)); f >= p.t.creditAt || (f > 0 && p.peerBlocked.Load()) {
		p.post(pendCredit)
	}
}

// onBlocked handles a Blocked frame.
func (p *peer) onBlocked() {
	p.peerBlocked.Store(true)
	if p.freed.Load() > 0 {
		p.post(pendCredit)
	}
}

// post schedules control work without ever waiting: the link's control
// goroutine does it, unless a data writer holding the write lock gets there
// first. Neither the reader nor the heartbeat monitor may block on a socket
// write — if two ranks' readers both waited for the other to read, neither
// would — and a Send waiting for credit must stay free to give up when its
// context ends.
func (p *peer) post(bits uint32) {
	p.pending.Or(bits)
	signal(p.ctl)
}

// ctlLoop is the link's control goroutine.
func (p *peer) ctlLoop() {
	defer p.t.wg.Done()
	for {
		select {
		case <-p.ctl:
			p.wmu.Lock()
			p.unlock()
		case <-p.t.stop:
			return
		}
	}
}

// unlock performs pending control work and releases wmu.
func (p *peer) unlock() {
	if p.pending.Load() != 0 {
		p.flushLocked()
	}
	p.wmu.Unlock()
}

func (p *peer) flushLocked() {
	bits := p.pending.Swap(0)
	if p.wclosed {
		return
	}
	self := uint32(p.t.rank)
	if bits&pendCredit != 0 {
		if x := p.freed.Swap(0); x > 0 {
			p.peerBlocked.Store(false)
			if p.writeHeaderLocked(wire.Header{Kind: wire.Credit, Src: self, Grant: uint64(x)}) != nil {
				return
			}
		}
	}
	if bits&pendBlocked != 0 {
		if p.writeHeaderLocked(wire.Header{Kind: wire.Blocked, Src: self}) != nil {
			return
		}
	}
	if bits&pendHeartbeat != 0 {
		if p.writeHeaderLocked(wire.Header{Kind: wire.Heartbeat, Src: self, Stamp: p.t.stamp()}) != nil {
			return
		}
	}
	if bits&pendEcho != 0 {
		if p.writeHeaderLocked(wire.Header{Kind: wire.Echo, Src: self, Stamp: p.echo.Load()}) != nil {
			return
		}
	}
	if bits&pendShutdown != 0 {
		p.wclosed = true
		p.conn.CloseWrite()
	}
}

// writeHeaderLocked writes a control frame; errors are handled (the link is
// failed) and only reported.
func (p *peer) writeHeaderLocked(h wire.Header) error {
	h.Put(p.hdr[:])
	_, err := p.conn.Write(p.hdr[:])
	p.tx.Add(1)
	if err != nil {
		return p.writeFailed(err)
	}
	return nil
}

// writeData writes one Data frame: header and payload in a single write.
func (p *peer) writeData(tag uint32, meta transport.Header, payload []byte) error {
	h := wire.Header{Kind: wire.Data, Src: uint32(p.t.rank), Tag: tag, Meta: meta, Len: uint64(len(payload))}
	p.wmu.Lock()
	if p.wclosed {
		p.unlock()
		return p.closedErr()
	}
	var err error
	if len(payload) <= smallCopy {
		b := p.small[:wire.HeaderSize+len(payload)]
		h.Put(b)
		copy(b[wire.HeaderSize:], payload)
		_, err = p.conn.Write(b)
	} else {
		h.Put(p.hdr[:])
		p.vec[0], p.vec[1] = p.hdr[:], payload
		p.bufs = p.vec[:]
		_, err = p.bufs.WriteTo(p.conn)
		p.vec[1] = nil
	}
	p.tx.Add(1)
	if err != nil {
		err = p.writeFailed(err)
	}
	p.unlock()
	return err
}

func (p *peer) closedErr() error {
	if err := p.goneErr("send"); err != nil {
		return err
	}
	return errClosed("send")
}

// goneErr returns, for operation op, the *transport.PeerError of a peer
// that was lost or said goodbye (or ErrClosed after Close), and nil for a
// live peer.
func (p *peer) goneErr(op string) error {
	switch {
	case p.t.closing.Load():
		return errClosed(op)
	case p.lost.Load():
		return &transport.PeerError{Rank: p.rank, Op: op, Err: p.lostErr}
	case p.gone.Load():
		return &transport.PeerError{Rank: p.rank, Op: op, Err: transport.ErrPeerClosed}
	}
	return nil
}

// writeFailed handles a failed write: the link is broken, which fails the
// peer unless the transport is closing or the peer said goodbye.
func (p *peer) writeFailed(err error) error {
	if p.gone.Load() {
		return &transport.PeerError{Rank: p.rank, Op: "send", Err: transport.ErrPeerClosed}
	}
	p.t.fail(p.rank, fmt.Errorf("%w: write: %w", transport.ErrPeerLost, err))
	if gerr := p.goneErr("send"); gerr != nil {
		return gerr
	}
	return &transport.PeerError{Rank: p.rank, Op: "send", Err: fmt.Errorf("%w: write: %w", transport.ErrPeerLost, err)}
}

// goodbye sends Goodbye and shuts down the write side, waiting at most until
// deadline for a write in progress.
func (p *peer) goodbye(deadline time.Time) {
	p.conn.SetWriteDeadline(deadline)
	p.wmu.Lock()
	if !p.wclosed {
		p.conn.SetWriteDeadline(deadline)
		h := wire.Header{Kind: wire.Goodbye, Src: uint32(p.t.rank)}
		h.Put(p.hdr[:])
		p.conn.Write(p.hdr[:])
		p.wclosed = true
		p.conn.CloseWrite()
	}
	p.wmu.Unlock()
}

// onGoodbye handles a Goodbye: messages already queued stay deliverable,
// then Recv reports the peer as closed; sends to it fail; our write side is
// shut down so that the peer's Close finishes promptly.
func (p *peer) onGoodbye() {
	p.gone.Store(true)
	p.goneOnce.Do(func() { close(p.goneCh) })
	p.t.box.CloseSource(p.rank, &transport.PeerError{Rank: p.rank, Op: "recv", Err: transport.ErrPeerClosed})
	p.post(pendShutdown)
}

// readLoop reads frames from the peer until the link ends.
func (p *peer) readLoop() {
	t := p.t
	defer t.wg.Done()
	defer close(p.readDone)
	var hb [wire.HeaderSize]byte
	bye := false
	for {
		if err := p.br.readHeader(hb[:]); err != nil {
			if !bye {
				p.readFailed(err)
			}
			return
		}
		p.rx.Add(1)
		h, err := wire.Parse(hb[:], uint64(t.cfg.maxFrame))
		if err != nil {
			p.protocolError(err)
			return
		}
		if bye || t.closing.Load() {
			// Drain (so closing the socket does not reset the peer) and discard.
			if h.Kind == wire.Data {
				if err := p.br.discard(h.Len); err != nil {
					return
				}
			}
			continue
		}
		switch h.Kind {
		case wire.Data:
			if h.Src != uint32(p.rank) {
				p.protocolError(fmt.Errorf("data frame claims source rank %d", h.Src))
				return
			}
			if h.Len <= postedMax {
				if post := t.box.Claim(p.rank, h.Tag); post != nil {
					if !p.readInto(post, h) {
						return
					}
					continue
				}
			}
			buf := bufpool.Default.Get(int(h.Len))
			if err := p.br.readPayload(buf); err != nil {
				bufpool.Default.Put(buf)
				p.readFailed(err)
				return
			}
			m := transport.Message{Header: h.Meta, Payload: buf}
			if err := t.box.Put(t.ctx, p.rank, h.Tag, m, len(buf)); err != nil {
				bufpool.Default.Put(buf) // the transport is closing or failed
			} else if len(buf) >= yieldMin {
				// Let a waiting receiver take the message (and release its
				// buffer) before reading on: otherwise, when Ps are few, the
				// reader runs a whole queue ahead into cold buffers, where the
				// pool could have handed back the same warm one.
				runtime.Gosched()
			}
		case wire.Credit:
			if err := p.addCredit(h.Grant); err != nil {
				p.protocolError(err)
				return
			}
		case wire.Blocked:
			p.onBlocked()
		case wire.Heartbeat:
			if h.Stamp != 0 {
				p.echo.Store(h.Stamp)
				p.post(pendEcho)
			}
		case wire.Echo:
			if f := t.cfg.hbObserver; f != nil && h.Stamp != 0 {
				if rtt := t.stamp() - h.Stamp; rtt < 1<<62 {
					f(p.rank, time.Duration(rtt))
				}
			}
		case wire.Goodbye:
			bye = true
			p.onGoodbye()
		default:
			p.protocolError(fmt.Errorf("unexpected %v frame on an established link", h.Kind))
			return
		}
	}
}

// readInto reads the payload of the Data frame h straight into the
// receive it claimed and completes that receive, whatever happens. A
// payload longer than the receiver's buffer is skipped and reported as too
// long. It reports whether the link is still readable.
func (p *peer) readInto(post *mailbox.Post[transport.Message], h wire.Header) bool {
	t := p.t
	m := transport.Message{Header: h.Meta}
	n := int(h.Len)
	var err error
	if n > len(post.Dst) {
		err = p.br.discard(h.Len)
	} else {
		err = p.br.readPayload(post.Dst[:n])
	}
	if err != nil {
		p.readFailed(err)
		rerr := p.goneErr("recv")
		if rerr == nil {
			rerr = &transport.PeerError{Rank: p.rank, Op: "recv", Err: fmt.Errorf("%w: %w", transport.ErrPeerLost, err)}
		}
		t.box.Complete(post, m, 0, rerr)
		return false
	}
	if n > len(post.Dst) {
		t.box.Complete(post, m, n, transport.TooLong(p.rank, n, len(post.Dst)))
	} else {
		t.box.Complete(post, m, n, nil)
	}
	p.consumed(n)
	return true
}

func (p *peer) readFailed(err error) {
	if p.t.closing.Load() || p.lost.Load() {
		return
	}
	if errors.Is(err, io.EOF) {
		err = fmt.Errorf("connection closed without goodbye: %w", err)
	}
	p.t.fail(p.rank, fmt.Errorf("%w: %w", transport.ErrPeerLost, err))
}

func (p *peer) protocolError(err error) {
	if p.t.closing.Load() {
		return
	}
	if errors.Is(err, wire.ErrFrameTooLarge) {
		err = fmt.Errorf("%w: %w", transport.ErrFrameTooLarge, err)
	}
	p.t.fail(p.rank, fmt.Errorf("%w: %w: %w", transport.ErrPeerLost, ErrProtocol, err))
}
