package tcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/gdist/gdist/dist/transport/tcp/internal/wire"
)

// New connects rank `rank` of a job of `world` ranks whose listen addresses
// are all known: addrs[i] is where rank i listens, and ln is this rank's
// listener (its address should be addrs[rank]). Rank i dials every rank
// j < i and accepts from every rank j > i; dials are retried until ctx ends,
// so ranks may start in any order. New returns once every link is up.
//
// The transport takes ownership of ln and closes it in Close; it keeps
// accepting (and refusing, with a log line) connections until then. ln may
// be nil only when world is 1. addrs is not retained.
func New(ctx context.Context, rank, world int, ln net.Listener, addrs []string, opts ...Option) (*Transport, error) {
	cfg, err := apply(opts)
	if err != nil {
		return nil, err
	}
	if err := checkArgs(rank, world, &cfg); err != nil {
		return nil, err
	}
	if cfg.listenSet {
		return nil, fmt.Errorf("tcp: %w: WithListenAddr is for Rendezvous; New listens on the listener it is given", ErrInvalidArgument)
	}
	if len(addrs) != world {
		return nil, fmt.Errorf("tcp: %w: %d addresses for a world of %d", ErrInvalidArgument, len(addrs), world)
	}
	if ln == nil && world > 1 {
		return nil, fmt.Errorf("tcp: %w: nil listener", ErrInvalidArgument)
	}
	t := newTransport(rank, world, ln, cfg)
	t.accept = func(r int) bool { return r > rank }
	t.acceptMode = wire.ModeMesh
	t.startAccepting()
	sctx, cancel := t.setupContext(ctx)
	defer cancel()
	for j := 0; j < rank; j++ {
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			l, err := t.dial(sctx, j, addrs[j], wire.ModeMesh)
			if err == nil {
				err = t.addPeer(l)
			}
			if err != nil {
				t.setupFailed(err)
			}
		}()
	}
	if err := t.waitLinked(sctx); err != nil {
		err = t.setupError(sctx, err)
		cancel()
		t.Close()
		return nil, err
	}
	return t, nil
}

// Rendezvous connects rank `rank` of a job of `world` ranks through rank 0:
// rank 0 listens on master and serves the rendezvous; every other rank
// listens on WithListenAddr (default "127.0.0.1:0"), connects to master,
// authenticates, registers the address it listens on, receives every rank's
// address and then connects to the others as New does. The connection to
// rank 0 stays up as the link between the two. Dials are retried until ctx
// ends. Rendezvous returns once every link is up.
func Rendezvous(ctx context.Context, rank, world int, master string, opts ...Option) (*Transport, error) {
	cfg, err := apply(opts)
	if err != nil {
		return nil, err
	}
	if err := checkArgs(rank, world, &cfg); err != nil {
		return nil, err
	}
	addr := cfg.listenAddr
	if rank == 0 {
		addr = master
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("tcp: rank %d: listen: %w", rank, err)
	}
	t := newTransport(rank, world, ln, cfg)
	t.addrs = make([]string, world)
	t.addrs[0] = master
	if rank == 0 {
		t.accept = func(r int) bool { return r > 0 }
		t.acceptMode = wire.ModeRendezvous
	} else {
		t.accept = func(r int) bool { return r > rank }
		t.acceptMode = wire.ModeMesh
		t.joining = true
	}
	t.startAccepting()
	sctx, cancel := t.setupContext(ctx)
	defer cancel()
	if rank > 0 {
		err = t.joinRendezvous(sctx, master)
	}
	if err == nil {
		err = t.waitLinked(sctx)
	}
	if err != nil {
		err = t.setupError(sctx, err)
		cancel()
		t.Close()
		return nil, err
	}
	return t, nil
}

func checkArgs(rank, world int, cfg *config) error {
	if world < 1 {
		return fmt.Errorf("tcp: %w: world size %d", ErrInvalidArgument, world)
	}
	if rank < 0 || rank >= world {
		return fmt.Errorf("tcp: %w: rank %d not in [0, %d)", ErrInvalidArgument, rank, world)
	}
	if int64(world) > 1<<31 {
		return fmt.Errorf("tcp: %w: world size %d", ErrInvalidArgument, world)
	}
	return cfg.validate(world)
}

// errInitTimeout is the cause of a setup context that ran out of init time.
var errInitTimeout = errors.New("tcp: init timeout")

// setupContext is ctx, also cancelled when the transport stops and when
// the init timeout expires (with cause errInitTimeout).
func (t *Transport) setupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	sctx, cancel := context.WithCancel(ctx)
	tctx, tcancel := context.WithTimeoutCause(sctx, t.cfg.initTimeout, errInitTimeout)
	stop := context.AfterFunc(t.ctx, cancel)
	return tctx, func() { stop(); tcancel(); cancel() }
}

// setupError turns err, which ended the setup, into an *InitTimeoutError
// if the init timeout is what ended it.
func (t *Transport) setupError(sctx context.Context, err error) error {
	if !errors.Is(context.Cause(sctx), errInitTimeout) {
		return err
	}
	e := &InitTimeoutError{Rank: t.rank, Timeout: t.cfg.initTimeout, Refused: t.refused.list()}
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, os.ErrDeadlineExceeded) {
		e.Last = err
	} else if last := t.lastDialErr(); last != nil {
		e.Last = last
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.joining && t.waiting != "" {
		e.Waiting = t.waiting
		return e
	}
	if t.joining {
		e.Missing = []int{0}
		return e
	}
	registered := make([]bool, t.world)
	for _, r := range t.regs {
		registered[r.l.rank] = true
	}
	for j := range t.world {
		if j != t.rank && t.peers[j].Load() == nil && !registered[j] {
			e.Missing = append(e.Missing, j)
		}
	}
	return e
}

// noteDialErr records the latest error of a dial that is being retried.
func (t *Transport) noteDialErr(err error) {
	t.mu.Lock()
	t.dialErr = err
	t.mu.Unlock()
}

func (t *Transport) lastDialErr() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.dialErr
}

// joinRendezvous registers with rank 0, receives the table and dials the
// ranks below this one.
func (t *Transport) joinRendezvous(ctx context.Context, master string) error {
	l, err := t.dial(ctx, 0, master, wire.ModeRendezvous)
	if err != nil {
		return err
	}
	t.mu.Lock()
	t.waiting = "registered with rank 0, waiting for the table: rank 0 names the ranks it waits for"
	t.mu.Unlock()
	addrs, err := t.register(ctx, l)
	if err != nil {
		l.raw.Close()
		return err
	}
	addrs[0] = master
	t.mu.Lock()
	t.addrs = addrs
	t.joining, t.waiting = false, ""
	t.mu.Unlock()
	if err := t.addPeer(l); err != nil {
		return err
	}
	for j := 1; j < t.rank; j++ {
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			l, err := t.dial(ctx, j, addrs[j], wire.ModeMesh)
			if err == nil {
				err = t.addPeer(l)
			}
			if err != nil {
				t.setupFailed(err)
			}
		}()
	}
	return nil
}

// advertised is the address other ranks should dial to reach this one: the
// listener's, with an unspecified IP replaced by the local IP of the
// connection to rank 0.
func (t *Transport) advertised(toMaster net.Conn) string {
	la, ok := t.ln.Addr().(*net.TCPAddr)
	if !ok {
		return t.ln.Addr().String()
	}
	ip := la.IP
	if ip == nil || ip.IsUnspecified() {
		if ca, ok := toMaster.LocalAddr().(*net.TCPAddr); ok {
			ip = ca.IP
		}
	}
	return net.JoinHostPort(ip.String(), strconv.Itoa(la.Port))
}

// register sends this rank's address to rank 0 and waits for the table.
func (t *Transport) register(ctx context.Context, l link) ([]string, error) {
	me := t.advertised(l.conn)
	if len(me) > wire.MaxAddrLen {
		return nil, fmt.Errorf("tcp: %w: address %q too long", ErrInvalidArgument, me)
	}
	defer bindDeadline(ctx, l.conn, time.Time{})()
	if err := writeFrame(l.conn, wire.Header{Kind: wire.Register, Src: uint32(t.rank)}, []byte(me)); err != nil {
		return nil, fmt.Errorf("tcp: rank %d: register with rank 0: %w", t.rank, err)
	}
	h, p, err := readFrame(l.br, wire.MaxHandshakePayload(t.world))
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, fmt.Errorf("tcp: rank %d: rank 0 ended the rendezvous before sending the table (it failed or timed out; its error names the ranks it waited for): %w", t.rank, err)
	}
	if err != nil {
		return nil, fmt.Errorf("tcp: rank %d: waiting for the rendezvous table: %w", t.rank, err)
	}
	if h.Kind != wire.Table || h.Src != 0 {
		return nil, fmt.Errorf("%w: expected the table from rank 0, got %v from %d", ErrProtocol, h.Kind, h.Src)
	}
	addrs, err := wire.ParseTable(p, t.world)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	return addrs, nil
}

// dial connects and authenticates to rank `to` at addr, retrying until ctx
// ends or the failure is one retrying cannot fix.
func (t *Transport) dial(ctx context.Context, to int, addr string, mode uint8) (link, error) {
	var d net.Dialer
	backoff := 10 * time.Millisecond
	var last error
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil && selfConnected(c) {
			// Nobody listens at addr yet and the kernel picked addr's port
			// as our ephemeral port: TCP simultaneous open connected the
			// socket to itself. It would also keep the port from the rank
			// about to listen there. Drop it and retry.
			c.Close()
			c, err = nil, errSelfConnect
		}
		if err == nil {
			var l link
			l, err = t.connect(ctx, c.(*net.TCPConn), to, addr, mode)
			if err == nil {
				t.mu.Lock()
				t.claimed[to] = true
				t.joinedFrom[to] = addr
				t.mu.Unlock()
				return l, nil
			}
			if errors.Is(err, errSelfDial) { // connect closed conn
				return link{}, &SelfDialError{Rank: t.rank, To: to, Addr: addr, Master: mode == wire.ModeRendezvous}
			}
			if errFatal(err) {
				return link{}, fmt.Errorf("tcp: rank %d: connect to rank %d at %s: %w", t.rank, to, addr, err)
			}
		}
		last = err
		t.noteDialErr(fmt.Errorf("connect to rank %d at %s: %w", to, addr, err))
		t.log.Debug("tcp: dial failed; retrying", "peer", to, "addr", addr, "err", err)
		select {
		case <-ctx.Done():
			return link{}, fmt.Errorf("tcp: rank %d: connect to rank %d at %s: %w (last error: %v)",
				t.rank, to, addr, ctx.Err(), last)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// connect runs TLS (WithTLS) and the client side of the handshake over
// conn, just dialed to rank `to` at addr. On failure conn is closed.
func (t *Transport) connect(ctx context.Context, conn *net.TCPConn, to int, addr string, mode uint8) (link, error) {
	t.tune(conn)
	s, err := t.secure(ctx, conn, addr, false)
	if err != nil {
		conn.Close()
		return link{}, err
	}
	br := newFrameReader(s, readBuf)
	info, err := t.clientHandshake(ctx, s, br, to, mode)
	if err != nil {
		conn.Close()
		if tlsAlert(err) {
			err = &tlsError{err}
		}
		return link{}, err
	}
	return link{rank: to, conn: s, raw: conn, br: br, info: info}, nil
}

// errSelfConnect is the retryable error of a dial that connected to itself.
var errSelfConnect = errors.New("connected to itself (nothing listening yet)")

// selfConnected reports whether c's two ends are the same address.
func selfConnected(c net.Conn) bool {
	l, lok := c.LocalAddr().(*net.TCPAddr)
	r, rok := c.RemoteAddr().(*net.TCPAddr)
	return lok && rok && l.Port == r.Port && l.IP.Equal(r.IP)
}

func (t *Transport) tune(c *net.TCPConn) {
	c.SetNoDelay(true)
	if n := t.cfg.sockBuf; n > 0 {
		c.SetReadBuffer(n)
		c.SetWriteBuffer(n)
	}
}

// addPeer turns an authenticated link into a live peer with its reader.
func (t *Transport) addPeer(l link) error {
	p := newPeer(t, l.rank, l)
	t.mu.Lock()
	if t.closing.Load() {
		t.mu.Unlock()
		l.raw.Close()
		return errClosed("connect")
	}
	t.claimed[l.rank] = true
	t.peers[l.rank].Store(p)
	t.linked++
	t.wg.Add(2)
	t.mu.Unlock()
	go p.readLoop()
	go p.ctlLoop()
	signal(t.linkCh)
	return nil
}

func (t *Transport) setupFailed(err error) {
	t.mu.Lock()
	if t.setupErr == nil {
		t.setupErr = err
	}
	t.mu.Unlock()
	signal(t.linkCh)
}

// waitLinked waits until every peer is linked.
func (t *Transport) waitLinked(ctx context.Context) error {
	for {
		t.mu.Lock()
		n, err := t.linked, t.setupErr
		t.mu.Unlock()
		if err != nil {
			return err
		}
		if n == t.world-1 {
			return nil
		}
		select {
		case <-t.linkCh:
		case <-t.stop:
			return errClosed("connect")
		case <-ctx.Done():
			return fmt.Errorf("tcp: rank %d: %d of %d peers connected: %w", t.rank, n, t.world-1, ctx.Err())
		}
	}
}

func (t *Transport) startAccepting() {
	if t.ln == nil {
		return
	}
	t.wg.Add(1)
	go t.acceptLoop()
}

// acceptLoop accepts connections until the listener closes; each is
// authenticated on its own goroutine so a slow or hostile client cannot hold
// up the others.
func (t *Transport) acceptLoop() {
	defer t.wg.Done()
	for {
		c, err := t.ln.Accept()
		if err != nil {
			select {
			case <-t.stop:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			t.log.Warn("tcp: accept failed", "err", err)
			select {
			case <-t.stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		conn, ok := c.(*net.TCPConn)
		if !ok {
			c.Close()
			continue
		}
		slot := t.takeSlot(conn)
		t.wg.Add(1)
		go t.serve(conn, slot)
	}
}

// hsSlot is an incoming connection that has not authenticated yet.
type hsSlot struct {
	conn    *net.TCPConn
	evicted bool // guarded by Transport.hsMu
}

// takeSlot gives conn one of the handshake slots. When all are taken, the
// connection that has held its slot longest is dropped: a connection with
// the token authenticates in a few round trips, so a flood of connections
// that do not cannot keep a rank from joining, and none holds a slot for
// longer than the handshake timeout.
func (t *Transport) takeSlot(conn *net.TCPConn) *hsSlot {
	s := &hsSlot{conn: conn}
	t.hsMu.Lock()
	var old *hsSlot
	if len(t.hsSlots) >= t.cfg.maxPendingHS {
		old = t.hsSlots[0]
		old.evicted = true
		t.hsSlots = slices.Delete(t.hsSlots, 0, 1)
	}
	t.hsSlots = append(t.hsSlots, s)
	t.hsMu.Unlock()
	if old != nil {
		old.conn.Close() // its serve goroutine records the refusal
	}
	return s
}

// freeSlot releases s; it reports whether s had been evicted.
func (t *Transport) freeSlot(s *hsSlot) bool {
	t.hsMu.Lock()
	defer t.hsMu.Unlock()
	if i := slices.Index(t.hsSlots, s); i >= 0 {
		t.hsSlots = slices.Delete(t.hsSlots, i, i+1)
	}
	return s.evicted
}

// serve authenticates one incoming connection and makes it a peer.
func (t *Transport) serve(conn *net.TCPConn, slot *hsSlot) {
	defer t.wg.Done()
	t.tune(conn)
	l, claimed, err := link{}, -1, error(nil)
	s, err := t.secure(t.ctx, conn, "", true)
	if err == nil {
		br := newFrameReader(s, readBuf)
		l, claimed, err = t.serverHandshake(s, br)
		l.raw = conn
	}
	if t.freeSlot(slot) && err != nil { // authenticated (or refused): the slot is free
		err = fmt.Errorf("%w (%v)", errEvicted, err)
	}
	if err == nil && t.acceptMode == wire.ModeRendezvous {
		err = t.acceptRegistration(l)
	}
	if err != nil {
		select {
		case <-t.stop: // closing: not worth a warning
		default:
			// Recorded before the close, which for a failed TLS handshake
			// lingers until the peer has read the alert.
			t.refused.add(conn.RemoteAddr().String(), claimed, err)
		}
		if errors.Is(err, ErrTLS) {
			lingerClose(conn)
		} else {
			conn.Close()
		}
		return
	}
	if t.acceptMode == wire.ModeRendezvous {
		return // acceptRegistration hands the link on
	}
	if t.handOff != nil {
		t.handOff(l)
		return
	}
	if err := t.addPeer(l); err != nil {
		return
	}
}

// errEvicted is the refusal of a connection that lost its handshake slot to
// a newer one.
var errEvicted = fmt.Errorf("dropped: all %d handshake slots were taken", defaultMaxPendingHS)

// registrant is a rank registered with rank 0, waiting for the table.
type registrant struct {
	l    link
	addr string
}

// acceptRegistration (rank 0 of a rendezvous) reads a registered rank's
// address. When every rank has registered, it sends each the table and
// makes them peers.
func (t *Transport) acceptRegistration(l link) error {
	undo := bindDeadline(t.ctx, l.conn, time.Now().Add(t.cfg.hsTimeout))
	h, p, err := readFrame(l.br, wire.MaxAddrLen)
	undo()
	if err == nil && (h.Kind != wire.Register || h.Src != uint32(l.rank)) {
		err = fmt.Errorf("%w: expected register from rank %d, got %v from %d", ErrProtocol, l.rank, h.Kind, h.Src)
	}
	if err == nil {
		if _, _, serr := net.SplitHostPort(string(p)); serr != nil {
			err = fmt.Errorf("%w: rank %d registered a bad address %q: %w", ErrProtocol, l.rank, p, serr)
		}
	}
	if err != nil {
		t.unclaim(l.rank)
		return err
	}
	t.mu.Lock()
	if t.closing.Load() {
		t.mu.Unlock()
		return errClosed("connect")
	}
	t.regs = append(t.regs, registrant{l: l, addr: string(p)})
	t.addrs[l.rank] = string(p)
	var all []registrant
	if len(t.regs) == t.world-1 {
		all, t.regs = t.regs, nil
	}
	table := append([]string(nil), t.addrs...)
	t.mu.Unlock()
	if all == nil {
		return nil
	}
	payload, err := wire.AppendTable(nil, table)
	if err == nil {
		for _, r := range all {
			r.l.conn.SetWriteDeadline(time.Now().Add(t.cfg.hsTimeout))
			if werr := writeFrame(r.l.conn, wire.Header{Kind: wire.Table}, payload); werr != nil && err == nil {
				err = fmt.Errorf("tcp: rank 0: send the table to rank %d: %w", r.l.rank, werr)
			}
			r.l.conn.SetWriteDeadline(time.Time{})
		}
	}
	for _, r := range all {
		if err != nil {
			r.l.raw.Close()
			continue
		}
		t.addPeer(r.l)
	}
	if err != nil {
		t.setupFailed(err)
	}
	return nil
}
