package tcp

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/internal/bufpool"
	"github.com/gdist/gdist/dist/transport/internal/mailbox"
	"github.com/gdist/gdist/dist/transport/tcp/internal/wire"
)

// closeLinger bounds how long Close waits for peers to acknowledge its
// goodbye before it drops the connections.
const closeLinger = 5 * time.Second

// lingerSilence is how many heartbeat intervals a peer may have been
// silent before Close stops waiting for its acknowledgement: a live peer
// sends something every interval, so one that missed two heartbeats is
// stopped, cut off or gone, and waiting for it would only delay the
// caller (and whatever it reports) by the whole linger.
const lingerSilence = 2

// Transport is a full-mesh TCP transport: one authenticated connection per
// pair of ranks, a reader goroutine per peer and credit-based flow control
// (see the package documentation). Create it with New or Rendezvous. It is
// safe for concurrent use.
type Transport struct {
	rank, world int
	cfg         config
	log         *slog.Logger
	ln          net.Listener // nil only for a world of one without a listener
	box         *mailbox.Mailbox[transport.Message]
	peers       []atomic.Pointer[peer] // by rank; nil for this rank and links not up yet
	creditAt    int64                  // send a Credit once this many bytes were freed

	// lifetime
	epoch    time.Time       // heartbeat stamps are nanoseconds since epoch, plus one
	ctx      context.Context // cancelled when the transport stops
	cancel   context.CancelFunc
	stop     chan struct{} // closed when the transport closes or fails
	stopOnce sync.Once
	closing  atomic.Bool
	closeOne sync.Once
	wg       sync.WaitGroup // every goroutine the transport owns
	// Close's linger (see shutdown and Transport.linger): its deadline,
	// set before stop is closed, and lingerEnd, closed once every reader
	// has returned.
	lingerUntil time.Time
	lingerEnd   chan struct{}

	// setup
	mu         sync.Mutex
	claimed    []bool   // ranks whose handshake succeeded (guarded by mu)
	joinedFrom []string // where each claimed rank connected from (guarded by mu)
	linked     int      // peers added (guarded by mu)
	setupErr   error    // fatal setup error (guarded by mu)
	linkCh     chan struct{}
	accept     func(rank int) bool // which ranks may connect to this listener
	acceptMode uint8
	hsMu       sync.Mutex
	hsSlots    []*hsSlot    // connections in the handshake, oldest first (guarded by hsMu)
	addrs      []string     // rendezvous: the table
	regs       []registrant // rank 0 in rendezvous: registered links waiting for the table
	refused    *refusals    // connections refused, for the log and InitTimeoutError
	joining    bool         // rank > 0 in a rendezvous that has not received the table (guarded by mu)
	waiting    string       // the rendezvous step in progress, for InitTimeoutError (guarded by mu)
	dialErr    error        // the last error of a dial being retried (guarded by mu)
	// ownNonces holds the Hello nonces of this transport's handshakes in
	// progress as a client, true once its own listener received one
	// (guarded by mu).
	ownNonces map[[wire.NonceSize]byte]bool

	// links (Listen, Dial)
	idRank, idWorld int        // a link's rank and size of its star, which the handshake states (see ident)
	handOff         func(link) // accepting side of links: takes each authenticated link
	quietLoss       bool       // a lost peer is the layer above's to report: log it at debug level
}

var _ transport.Transport = (*Transport)(nil)

func newTransport(rank, world int, ln net.Listener, cfg config) *Transport {
	t := &Transport{
		rank:       rank,
		world:      world,
		cfg:        cfg,
		log:        cfg.logger.With("rank", rank),
		ln:         ln,
		box:        mailbox.New(world, cfg.queueLimit, func(m transport.Message) { bufpool.Default.Put(m.Payload) }),
		peers:      make([]atomic.Pointer[peer], world),
		stop:       make(chan struct{}),
		lingerEnd:  make(chan struct{}),
		claimed:    make([]bool, world),
		joinedFrom: make([]string, world),
		linkCh:     make(chan struct{}, 1),
		accept:     func(int) bool { return false },
	}
	if cfg.queueLimit > 0 {
		t.creditAt = max(int64(cfg.queueLimit)/4, 1)
	}
	t.refused = newRefusals(t.log)
	t.epoch = time.Now()
	t.ctx, t.cancel = context.WithCancel(context.Background())
	if cfg.hbInterval > 0 {
		t.wg.Add(1)
		go t.monitor()
	}
	return t
}

// ident is the rank and world size this side states in the handshake: its
// own, or a dialed link's rank in its star.
func (t *Transport) ident() (rank, world uint32) {
	if t.idWorld == 0 {
		return uint32(t.rank), uint32(t.world)
	}
	return uint32(t.idRank), uint32(t.idWorld)
}

// Rank implements transport.Transport.
func (t *Transport) Rank() int { return t.rank }

// WorldSize implements transport.Transport.
func (t *Transport) WorldSize() int { return t.world }

// Addr returns the address this rank listens on, or nil if it has no
// listener.
func (t *Transport) Addr() net.Addr {
	if t.ln == nil {
		return nil
	}
	return t.ln.Addr()
}

// Send implements transport.Transport. It waits, under ctx, until the
// receiver has queue space for p (flow control), then writes the frame; it
// returns once p is written to the socket, so p may be reused and is not
// retained. The write itself is not interrupted by ctx (that would leave
// half a frame on the wire): the receiver always drains its socket, so it
// finishes promptly unless the peer is lost, which the heartbeat timeout
// bounds. A message longer than the receiver's maximum frame is refused with
// an error matching transport.ErrFrameTooLarge.
func (t *Transport) Send(ctx context.Context, to int, tag uint32, h transport.Header, p []byte) error {
	if t.closing.Load() {
		return errClosed("send")
	}
	if err := transport.CheckRank(to, t.world); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("tcp: send to rank %d: %w", to, err)
	}
	if to == t.rank {
		return t.sendSelf(ctx, tag, h, p)
	}
	pr := t.peers[to].Load()
	if pr == nil { // cannot happen once New has returned
		return &transport.PeerError{Rank: to, Op: "send", Err: transport.ErrPeerLost}
	}
	if uint64(len(p)) > pr.maxFrame {
		return fmt.Errorf("tcp: send to rank %d: %w: %d bytes, the peer accepts %d",
			to, transport.ErrFrameTooLarge, len(p), pr.maxFrame)
	}
	if err := pr.goneErr("send"); err != nil {
		return err
	}
	if err := pr.acquire(ctx, len(p)); err != nil {
		return err
	}
	return pr.writeData(tag, h, p)
}

func (t *Transport) sendSelf(ctx context.Context, tag uint32, h transport.Header, p []byte) error {
	if uint64(len(p)) > uint64(t.cfg.maxFrame) {
		return fmt.Errorf("tcp: send to self: %w: %d bytes, limit %d", transport.ErrFrameTooLarge, len(p), t.cfg.maxFrame)
	}
	if post := t.box.Claim(t.rank, tag); post != nil {
		if len(p) > len(post.Dst) {
			t.box.Complete(post, transport.Message{Header: h}, len(p), transport.TooLong(t.rank, len(p), len(post.Dst)))
		} else {
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
	m, err := t.box.Get(ctx, from, tag)
	if err != nil {
		return transport.Message{}, t.stateErr("recv", err)
	}
	if from != t.rank {
		if pr := t.peers[from].Load(); pr != nil {
			pr.consumed(len(m.Payload))
		}
	}
	return m, nil
}

// RecvInto implements transport.Transport. When it is already waiting,
// nothing from (from, tag) is queued and the next message's payload is at
// most 1 MiB, the peer's reader reads that payload from the socket straight
// into dst (a posted receive); otherwise the message is queued as for Recv,
// then copied into dst and its buffer reused. (The kernel's copy straight
// into a large destination measured slower than a copy through a pooled
// buffer: the 4 MiB segments of a 16 MiB 2-rank broadcast took ~25% longer.)
//
// Once the reader has started filling dst, RecvInto waits for the whole
// payload even if ctx ends meanwhile, and then returns the message: it
// never returns while the reader still writes into dst. That wait is
// bounded by the peer's sending (a frame's payload follows its header on
// the wire) and by the heartbeat timeout if the peer stalls or dies; a lost
// peer ends it with a *transport.PeerError and dst partly written.
func (t *Transport) RecvInto(ctx context.Context, from int, tag uint32, dst []byte) (transport.Header, int, error) {
	if t.closing.Load() {
		return transport.Header{}, 0, errClosed("recv")
	}
	if err := transport.CheckRank(from, t.world); err != nil {
		return transport.Header{}, 0, err
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
	if from != t.rank {
		if pr := t.peers[from].Load(); pr != nil {
			pr.consumed(n)
		}
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
// see this rank as closed, not lost, once they have drained its messages),
// waits for each peer's goodbye in turn, at most min(5 s, heartbeat
// timeout), and, with heartbeats on, not at all for a peer that has sent
// nothing for two heartbeat intervals (stopped, cut off or gone: its
// connection is closed at once), closes the connections and the listener and waits for every
// goroutine the transport started. Pending calls return an error matching
// transport.ErrClosed, as do all later ones. Close is idempotent and always
// returns nil.
func (t *Transport) Close() error {
	t.closeOne.Do(func() { t.shutdown(true) })
	return nil
}

// Kill simulates this rank crashing: it drops every connection without a
// goodbye, so peers see it as lost (transport.ErrPeerLost), as if the
// process had died. Later calls return transport.ErrClosed. It is meant for
// tests of failure handling; Close is the normal way out.
func (t *Transport) Kill() {
	t.closeOne.Do(func() { t.shutdown(false) })
}

func (t *Transport) shutdown(graceful bool) {
	t.mu.Lock()
	t.closing.Store(true)
	regs := t.regs
	t.regs = nil
	t.mu.Unlock()
	for _, r := range regs {
		r.l.raw.Close() // registered with rank 0, still waiting for the table
	}
	t.box.Fail(errClosed("recv"))
	deadline := time.Now().Add(min(closeLinger, max(t.cfg.hbTimeout, time.Second)))
	t.lingerUntil = deadline // read by the monitor after stop is closed
	t.stopNow()
	if t.ln != nil {
		t.ln.Close()
	}
	for r := range t.peers {
		p := t.peers[r].Load()
		if p == nil {
			continue
		}
		if graceful && !p.lost.Load() {
			p.goodbye(deadline)
			p.conn.SetReadDeadline(deadline)
		} else {
			p.raw.Close()
		}
	}
	// No peer is added once closing is set (addPeer checks it under mu), so
	// these are all the readers. Each ends at the peer's goodbye and EOF,
	// at the deadline, or when the monitor gives up on a silent peer.
	for r := range t.peers {
		if p := t.peers[r].Load(); p != nil {
			<-p.readDone
		}
	}
	close(t.lingerEnd)
	t.wg.Wait()
	for r := range t.peers {
		if p := t.peers[r].Load(); p != nil {
			p.raw.Close()
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
// it (sends to it, receives from it) return a *transport.PeerError naming
// it, and what it sent that nobody received yet is dropped. The links to
// the other peers are left alone: calls involving them keep working, so the
// layer above can still tell the survivors why it stops.
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
		if t.quietLoss {
			level = slog.LevelDebug
		}
		t.log.Log(context.Background(), level, "tcp: peer lost", "peer", rank, "err", cause)
		pe := &transport.PeerError{Rank: rank, Op: "recv", Err: cause}
		t.box.FailSource(rank, pe)
		t.setupFailed(&transport.PeerError{Rank: rank, Op: "connect", Err: cause}) // only matters during setup
		p.raw.Close()
	})
}

// stateErr maps an error from a blocking operation to what the caller
// should see: ErrClosed after Close, err otherwise (a context error or a
// peer that was lost or said goodbye).
func (t *Transport) stateErr(op string, err error) error {
	if t.closing.Load() {
		return errClosed(op)
	}
	return err
}

func errClosed(op string) error { return fmt.Errorf("tcp: %s: %w", op, transport.ErrClosed) }

// stamp is the current heartbeat stamp: never 0 (0 asks for no echo).
func (t *Transport) stamp() uint64 { return uint64(time.Since(t.epoch)) + 1 }

// monitor sends a heartbeat on every link each interval and fails a peer
// from which nothing has been received for the heartbeat timeout. It
// checks four times per interval, so a silent peer is named at most a
// quarter interval after the timeout.
//
// Neither it nor the reader writes to a socket: the heartbeat goes out
// through the link's control goroutine (see peer.post). Liveness counts
// every read that returns bytes, also within a large payload, so a peer
// in the middle of sending a long frame over a slow link is not taken
// for a silent one.
func (t *Transport) monitor() {
	defer t.wg.Done()
	period := max(t.cfg.hbInterval/4, time.Millisecond)
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			t.linger(tick)
			return
		case now := <-tick.C:
			for r := range t.peers {
				p := t.peers[r].Load()
				if p == nil || p.gone.Load() || p.lost.Load() {
					continue
				}
				if rx := p.rx.Load(); rx != p.lastRx {
					p.lastRx, p.lastRxAt = rx, now
				} else if silent := now.Sub(p.lastRxAt); silent+period/2 > t.cfg.hbTimeout {
					// lastRxAt is the tick that saw the last bytes, up to
					// a period after they came; the half period absorbs the
					// ticker's jitter, so the peer is named at the tick
					// timeout after that one.
					t.fail(p.rank, fmt.Errorf("%w: %w: nothing received for %v (heartbeat timeout %v)",
						transport.ErrPeerUnresponsive, ErrHeartbeatTimeout, silent.Round(time.Millisecond), t.cfg.hbTimeout))
					continue
				}
				if now.Sub(p.lastHbAt) >= t.cfg.hbInterval-t.cfg.hbInterval/8 {
					p.lastHbAt = now
					p.post(pendHeartbeat)
				}
			}
		}
	}
}

// linger is the monitor while Close waits for the peers to acknowledge its
// goodbye (their own goodbye and end of stream). A peer that has sent
// nothing for lingerSilence heartbeat intervals is not waited for: its
// connection is closed at once. That is safe: the reader drains the socket,
// so a silent peer has left nothing unread on this side, and closing sends
// a plain end of stream rather than a reset that could destroy what this
// rank wrote before (its goodbye, and the layer above's last words, which
// the kernel still delivers if the peer is alive after all). Without
// this, a survivor that learned of a stopped or cut-off peer from another
// rank, before its own heartbeat timeout named it, would spend the whole
// linger (up to 5 s) waiting for that peer in Close. linger returns once
// every reader has ended (lingerEnd) or the linger deadline has passed.
func (t *Transport) linger(tick *time.Ticker) {
	silence := lingerSilence * t.cfg.hbInterval
	now := time.Now()
	for {
		for r := range t.peers {
			p := t.peers[r].Load()
			if p == nil {
				continue
			}
			select {
			case <-p.readDone:
				continue
			default:
			}
			if rx := p.rx.Load(); rx != p.lastRx {
				p.lastRx, p.lastRxAt = rx, now
			} else if now.Sub(p.lastRxAt) >= silence {
				p.raw.Close()
			}
		}
		if now.After(t.lingerUntil) {
			return
		}
		select {
		case now = <-tick.C:
		case <-t.lingerEnd:
			return
		}
	}
}
