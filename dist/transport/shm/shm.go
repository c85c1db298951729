//go:build linux

package shm

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/internal/bufpool"
	"github.com/gdist/gdist/dist/transport/internal/mailbox"
)

// Transport is a shared-memory transport between ranks of one host: a
// pair of single-producer/single-consumer rings per pair of ranks, in
// memory the two processes share, and a Unix socket per pair for setup and
// liveness (see the package documentation). Create it with Rendezvous or
// New. It is safe for concurrent use.
type Transport struct {
	rank, world int
	cfg         config
	log         *slog.Logger
	box         *mailbox.Mailbox[transport.Message]
	peers       []atomic.Pointer[peer] // by rank; nil for this rank and ranks without a link
	linkedTo    []bool                 // ranks this transport has (or will have) a link to; fixed at construction

	// lifetime
	ctx      context.Context // cancelled when the transport stops
	cancel   context.CancelFunc
	stop     chan struct{}
	stopOnce sync.Once
	closing  atomic.Bool
	closeOne sync.Once
	wg       sync.WaitGroup // every goroutine the transport owns

	// setup
	mu       sync.Mutex
	ln       *net.UnixListener // Rendezvous only, until every link is up (guarded by mu)
	claimed  []bool            // (guarded by mu)
	linked   int               // (guarded by mu)
	setupErr error             // (guarded by mu)
	linkCh   chan struct{}
	pendHS   atomic.Int32

	// probe is a word of this process's memory whose address and value
	// each link publishes, so the peer can test reading our memory.
	probe *uint64
}

var (
	_ transport.Transport      = (*Transport)(nil)
	_ transport.ReduceReceiver = (*Transport)(nil)
	_ transport.StreamSender   = (*Transport)(nil)
)

func newTransport(rank, world int, cfg config) *Transport {
	t := &Transport{
		rank:     rank,
		world:    world,
		cfg:      cfg,
		log:      cfg.logger.With("rank", rank),
		box:      mailbox.New(world, cfg.queueLimit, func(m transport.Message) { bufpool.Default.Put(m.Payload) }),
		peers:    make([]atomic.Pointer[peer], world),
		linkedTo: make([]bool, world),
		stop:     make(chan struct{}),
		claimed:  make([]bool, world),
		linkCh:   make(chan struct{}, 1),
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	t.box.SetPoller(poller{t}, cfg.spin)
	var pv [8]byte
	rand.Read(pv[:])
	t.probe = new(uint64)
	*t.probe = binary.LittleEndian.Uint64(pv[:]) | 1
	if cfg.hbInterval > 0 && world > 1 {
		t.wg.Add(1)
		go t.monitor()
	}
	return t
}

// Rank implements transport.Transport.
func (t *Transport) Rank() int { return t.rank }

// WorldSize implements transport.Transport.
func (t *Transport) WorldSize() int { return t.world }

// HasLink reports whether this transport reaches rank r: r is this rank or
// a peer it has a shared-memory link to.
func (t *Transport) HasLink(r int) bool {
	return r == t.rank || (r >= 0 && r < t.world && t.linkedTo[r])
}

// SharedMemory implements transport.SharedMemory: it is HasLink.
func (t *Transport) SharedMemory(r int) bool { return t.HasLink(r) }

// peerFor returns the peer of rank r, or an error for op.
func (t *Transport) peerFor(op string, r int) (*peer, error) {
	if p := t.peers[r].Load(); p != nil { // a peer is added only for a rank linkedTo names
		return p, nil
	}
	return nil, t.noPeer(op, r)
}

// noPeer is peerFor's error for rank r.
func (t *Transport) noPeer(op string, r int) error {
	if !t.linkedTo[r] {
		return fmt.Errorf("shm: %s rank %d: %w", op, r, ErrNoLink)
	}
	// cannot happen once the constructor has returned
	return &transport.PeerError{Rank: r, Op: op, Err: transport.ErrPeerLost}
}

// Send implements transport.Transport. It waits, under ctx, until the
// receiver has queue space for p (flow control), then streams the message
// through the pair's ring; it returns once p is in the ring (p may be
// reused and is not retained). Streaming is not interrupted by ctx (that
// would leave half a message in the ring): the receiver always drains its
// ring, so it finishes unless the peer dies or freezes, which the socket
// and the heartbeat bound. A message longer than the receiver's maximum is
// refused with an error matching transport.ErrFrameTooLarge.
func (t *Transport) Send(ctx context.Context, to int, tag uint32, h transport.Header, p []byte) error {
	return t.send(ctx, to, tag, h, p, false)
}

// SendStream implements transport.StreamSender: Send, with the payload
// written into the ring with non-temporal stores, which go to memory past
// this core's caches. It pays where the receiver runs on a core that
// shares no cache with the sender's (two dies of one chip, or vCPUs the
// hypervisor placed so): a plain copy first fetches every line of the
// ring from the receiver's cache. Where the cores share a cache, Send is
// faster.
func (t *Transport) SendStream(ctx context.Context, to int, tag uint32, h transport.Header, p []byte) error {
	return t.send(ctx, to, tag, h, p, true)
}

func (t *Transport) send(ctx context.Context, to int, tag uint32, h transport.Header, p []byte, stream bool) error {
	if t.closing.Load() {
		return errClosed("send")
	}
	if err := transport.CheckRank(to, t.world); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("shm: send to rank %d: %w", to, err)
	}
	if to == t.rank {
		return t.sendSelf(ctx, tag, h, p)
	}
	pr, err := t.peerFor("send to", to)
	if err != nil {
		return err
	}
	return pr.send(ctx, tag, h, p, stream)
}

func (t *Transport) sendSelf(ctx context.Context, tag uint32, h transport.Header, p []byte) error {
	if len(p) > t.cfg.maxFrame {
		return fmt.Errorf("shm: send to self: %w: %d bytes, limit %d", transport.ErrFrameTooLarge, len(p), t.cfg.maxFrame)
	}
	if post := t.box.Claim(t.rank, tag); post != nil {
		switch {
		case len(p) > len(post.Dst):
			t.box.Complete(post, transport.Message{Header: h}, len(p), transport.TooLong(t.rank, len(p), len(post.Dst)))
		case post.Combine != nil:
			if len(p) == len(post.Dst) {
				post.Combine(post.Dst, p)
			}
			t.box.Complete(post, transport.Message{Header: h}, len(p), nil)
		default:
			t.box.Complete(post, transport.Message{Header: h}, copy(post.Dst, p), nil)
		}
		return nil
	}
	buf := bufpool.Default.Get(len(p))
	copy(buf, p)
	if err := t.box.Put(ctx, t.rank, tag, transport.Message{Header: h, Payload: buf}, len(buf)); err != nil {
		bufpool.Default.Put(buf)
		return t.stateErr("send", err)
	}
	return nil
}

// Recv implements transport.Transport. The returned payload belongs to the
// caller; handing it back with Release lets the transport reuse it.
func (t *Transport) Recv(ctx context.Context, from int, tag uint32) (transport.Message, error) {
	if t.closing.Load() {
		return transport.Message{}, errClosed("recv")
	}
	if err := transport.CheckRank(from, t.world); err != nil {
		return transport.Message{}, err
	}
	var pr *peer
	if from != t.rank {
		var err error
		if pr, err = t.peerFor("recv from", from); err != nil {
			return transport.Message{}, err
		}
	}
	if pr != nil {
		if h, ok := pr.takeNext(ctx, tag, uint64(t.cfg.maxFrame), false); ok {
			buf := bufpool.Default.Get(int(h.Len))
			err := pr.readInto(buf)
			if pr.finishTake(h, err) {
				return transport.Message{Header: h.Meta, Payload: buf}, nil
			}
			bufpool.Default.Put(buf)
		}
	}
	m, err := t.box.Get(ctx, from, tag)
	if err != nil {
		return transport.Message{}, t.stateErr("recv", err)
	}
	if pr != nil {
		pr.consumed(len(m.Payload))
	}
	return m, nil
}

// RecvInto implements transport.Transport. When it is already waiting and
// nothing from (from, tag) is queued, the peer's reader copies the next
// message straight from the ring into dst, chunk by chunk as it arrives (a
// posted receive); otherwise the queued message is copied into dst and its
// buffer reused. Once the reader has started filling dst, RecvInto waits
// for the whole message even if ctx ends meanwhile, and returns it; a
// peer that dies or freezes meanwhile ends the wait with a
// *transport.PeerError.
func (t *Transport) RecvInto(ctx context.Context, from int, tag uint32, dst []byte) (transport.Header, int, error) {
	if t.closing.Load() {
		return transport.Header{}, 0, errClosed("recv")
	}
	if err := transport.CheckRank(from, t.world); err != nil {
		return transport.Header{}, 0, err
	}
	var pr *peer
	if from != t.rank {
		var err error
		if pr, err = t.peerFor("recv from", from); err != nil {
			return transport.Header{}, 0, err
		}
	}
	if pr != nil {
		if h, ok := pr.takeNext(ctx, tag, uint64(len(dst)), false); ok {
			n := int(h.Len)
			err := pr.readInto(dst[:n])
			if pr.finishTake(h, err) {
				return h.Meta, n, nil
			}
		}
	}
	m, n, direct, err := t.box.GetInto(ctx, from, tag, dst)
	if direct { // the reader filled dst and returned the credit
		if err != nil {
			return m.Header, n, t.stateErr("recv", err)
		}
		return m.Header, n, nil
	}
	if err != nil {
		return transport.Header{}, 0, t.stateErr("recv", err)
	}
	n, err = transport.Deliver(m, from, dst, nil)
	bufpool.Default.Put(m.Payload)
	if pr != nil {
		pr.consumed(n)
	}
	return m.Header, n, err
}

// RecvReduce implements transport.ReduceReceiver. When it is already
// waiting and nothing from (from, tag) is queued, the peer's reader
// combines the message into dst straight from the ring as it arrives, or,
// for a message sent by single copy, from the sender's memory a piece at a
// time through a small buffer; otherwise it combines the queued message
// and reuses its buffer. Once the reader has started, RecvReduce waits for
// the whole message even if ctx ends meanwhile, as RecvInto does.
func (t *Transport) RecvReduce(ctx context.Context, from int, tag uint32, dst []byte, unit int, combine transport.Combine) (transport.Header, int, error) {
	if t.closing.Load() {
		return transport.Header{}, 0, errClosed("recv")
	}
	if err := transport.CheckRank(from, t.world); err != nil {
		return transport.Header{}, 0, err
	}
	if err := transport.CheckUnit(len(dst), unit); err != nil {
		return transport.Header{}, 0, err
	}
	if combine == nil {
		return transport.Header{}, 0, fmt.Errorf("shm: %w: RecvReduce with a nil combine", transport.ErrInvalidArgument)
	}
	var pr *peer
	if from != t.rank {
		var err error
		if pr, err = t.peerFor("recv from", from); err != nil {
			return transport.Header{}, 0, err
		}
	}
	if pr != nil {
		if h, ok := pr.takeNext(ctx, tag, uint64(len(dst)), true); ok {
			n := int(h.Len)
			err := pr.combineFrom(dst[:n], unit, combine)
			if pr.finishTake(h, err) {
				return h.Meta, n, nil
			}
		}
	}
	m, n, direct, err := t.box.GetReduce(ctx, from, tag, dst, unit, combine)
	if direct { // the reader combined into dst and returned the credit
		if err != nil {
			return m.Header, n, t.stateErr("recv", err)
		}
		return m.Header, n, nil
	}
	if err != nil {
		return transport.Header{}, 0, t.stateErr("recv", err)
	}
	n, err = transport.Deliver(m, from, dst, combine)
	bufpool.Default.Put(m.Payload)
	if pr != nil {
		pr.consumed(n)
	}
	return m.Header, n, err
}

// Release implements transport.Transport.
func (t *Transport) Release(p []byte) { bufpool.Default.Put(p) }

// Queued implements transport.Backlog: the messages that arrived at this
// rank and that nobody has received yet.
func (t *Transport) Queued() []transport.Queued {
	var out []transport.Queued
	for _, q := range t.box.Backlog() {
		out = append(out, transport.Queued{From: q.Src, To: t.rank, Tag: q.Tag, Messages: q.Msgs, Bytes: q.Bytes})
	}
	return out
}

// Close implements transport.Transport: it tells every peer goodbye (they
// see this rank as closed, not lost, once they have read what it sent —
// which stays readable in their mapping after this process unmaps or
// exits), closes the sockets, waits for every goroutine the transport
// started and unmaps the memory. Pending calls return an error matching
// transport.ErrClosed, as do all later ones. Close is idempotent and
// always returns nil.
func (t *Transport) Close() error {
	t.closeOne.Do(func() { t.shutdown(true) })
	return nil
}

// Kill simulates this rank crashing: it drops every socket without a
// goodbye, so peers see it as lost (transport.ErrPeerLost), as if the
// process had died. Later calls return transport.ErrClosed. It is meant for
// tests of failure handling; Close is the normal way out.
func (t *Transport) Kill() {
	t.closeOne.Do(func() { t.shutdown(false) })
}

func (t *Transport) shutdown(graceful bool) {
	t.mu.Lock()
	t.closing.Store(true)
	ln := t.ln
	t.ln = nil
	t.mu.Unlock()
	if ln != nil {
		ln.Close()
	}
	t.box.Fail(errClosed("recv"))
	t.stopNow()
	for r := range t.peers {
		p := t.peers[r].Load()
		if p == nil {
			continue
		}
		if graceful && !p.lost.Load() {
			p.conn.SetWriteDeadline(time.Now().Add(time.Second))
			p.conn.Write([]byte{msgBye})
		}
		p.conn.Close()
		p.myBell.Force()
		signal(p.kick)
	}
	t.wg.Wait()
	for r := range t.peers {
		if p := t.peers[r].Load(); p != nil {
			p.unmap()
		}
	}
}

func (t *Transport) stopNow() {
	t.stopOnce.Do(func() {
		close(t.stop)
		t.cancel()
	})
}

// fail records that peer rank was lost: pending and later calls involving
// it return a *transport.PeerError naming it, and what it sent that nobody
// received yet is dropped. The other links are left alone.
func (t *Transport) fail(rank int, cause error) {
	p := t.peers[rank].Load()
	if t.closing.Load() || p == nil {
		return
	}
	p.lostOnce.Do(func() {
		p.lostErr = cause
		p.lost.Store(true)
		close(p.lostCh)
		level := slog.LevelError
		if t.cfg.quietLoss {
			level = slog.LevelDebug
		}
		t.log.Log(context.Background(), level, "shm: peer lost", "peer", rank, "err", cause)
		t.box.FailSource(rank, &transport.PeerError{Rank: rank, Op: "recv", Err: cause})
		p.conn.Close()
		// Wake the reader. fail may run on an application goroutine (a
		// Send that found corrupt memory) while Close unmaps: fmu keeps
		// the region mapped meanwhile.
		p.fmu.Lock()
		if !p.fdead {
			p.myBell.Force()
		}
		p.fmu.Unlock()
		signal(p.kick)
	})
}

// stateErr maps an error from a blocking operation to what the caller
// should see: ErrClosed after Close, err otherwise.
func (t *Transport) stateErr(op string, err error) error {
	if t.closing.Load() {
		return errClosed(op)
	}
	return err
}

func errClosed(op string) error { return fmt.Errorf("shm: %s: %w", op, transport.ErrClosed) }

// monitor advances this rank's heartbeat counters every interval and
// fails a peer whose counter has not moved for the heartbeat timeout (a
// stopped or frozen process: one that dies closes its socket, which
// ctlLoop sees at once). It checks four times per interval, as TCP's
// monitor does, so a peer that stops is named between timeout - interval
// and timeout + interval/2 after it stopped.
func (t *Transport) monitor() {
	defer t.wg.Done()
	period := max(t.cfg.hbInterval/4, time.Millisecond)
	tick := time.NewTicker(period)
	defer tick.Stop()
	var beatAt time.Time // when this rank last advanced its counters
	for {
		select {
		case <-t.stop:
			return
		case now := <-tick.C:
			beat := now.Sub(beatAt) >= t.cfg.hbInterval-period/2
			if beat {
				beatAt = now
			}
			for r := range t.peers {
				p := t.peers[r].Load()
				if p == nil || p.gone.Load() || p.lost.Load() {
					continue
				}
				if beat {
					p.outR.AddBeat()
				}
				if b := p.inR.Beat(); b != p.lastBeat {
					p.lastBeat, p.lastBeatAt = b, now
				} else if silent := now.Sub(p.lastBeatAt); silent > t.cfg.hbTimeout {
					t.fail(p.rank, fmt.Errorf("%w: %w: no heartbeat for %v",
						transport.ErrPeerUnresponsive, ErrHeartbeatTimeout, silent.Round(time.Millisecond)))
				}
			}
		}
	}
}

// poller lets a receiver waiting on the mailbox deliver its peer's records
// itself (mailbox.Poller).
type poller struct{ t *Transport }

func (x poller) peer(src int) *peer {
	if src == x.t.rank || src < 0 || src >= x.t.world {
		return nil
	}
	return x.t.peers[src].Load()
}

// Begin implements mailbox.Poller.
func (x poller) Begin(src int) {
	if p := x.peer(src); p != nil {
		if p.pollers.begin() {
			p.pspin.begin()
		}
	}
}

// End implements mailbox.Poller: the last poller to stop wakes the reader.
func (x poller) End(src int) {
	if p := x.peer(src); p != nil {
		p.endPoll(false, false)
	}
}

// Poll implements mailbox.Poller: one poll of the ring, and past the spin
// budget a yield of the CPU (pollSpin).
func (x poller) Poll(src int) bool {
	p := x.peer(src)
	if p == nil || p.lost.Load() || x.t.closing.Load() {
		return false
	}
	if p.progress() {
		p.pspin.served()
		return true
	}
	p.pspin.idle()
	return false
}
