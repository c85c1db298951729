package tcp

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/gdist/gdist/dist/transport/tcp/internal/wire"
)

// link is an authenticated connection on its way to becoming a peer.
type link struct {
	rank int
	conn stream       // the connection, or TLS over it
	raw  *net.TCPConn // the connection itself: what closing closes
	br   *frameReader
	info wire.HelloInfo // what the other side said about itself
}

// hsError is a handshake failure the server reports to the client.
type hsError struct {
	reason wire.RejectReason
	detail uint64 // Reject's detail (RejectWorld: this job's world size)
	err    error
}

func (e *hsError) Error() string { return fmt.Sprintf("%v: %v", e.reason, e.err) }
func (e *hsError) Unwrap() error { return e.err }

func reject(reason wire.RejectReason, format string, args ...any) error {
	return &hsError{reason: reason, err: fmt.Errorf(format, args...)}
}

// writeFrame writes a handshake frame in one write.
func writeFrame(w io.Writer, h wire.Header, payload []byte) error {
	h.Len = uint64(len(payload))
	b := make([]byte, wire.HeaderSize+len(payload))
	h.Put(b)
	copy(b[wire.HeaderSize:], payload)
	_, err := w.Write(b)
	return err
}

// readFrame reads one frame whose payload is at most max bytes; the header
// is checked before the payload is allocated.
func readFrame(r io.Reader, max uint64) (wire.Header, []byte, error) {
	return readExpected(r, max, 0, 0)
}

// readExpected is readFrame that also refuses, before reading the payload,
// a frame other than want with exactly wantLen bytes (want 0: any frame).
// A Reject is always accepted so the caller can report it.
func readExpected(r io.Reader, max uint64, want wire.Kind, wantLen uint64) (wire.Header, []byte, error) {
	var hb [wire.HeaderSize]byte
	if _, err := io.ReadFull(r, hb[:]); err != nil {
		return wire.Header{}, nil, err
	}
	h, err := wire.Parse(hb[:], max)
	if err != nil {
		return wire.Header{}, nil, fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	if want != 0 && h.Kind != wire.Reject && (h.Kind != want || h.Len != wantLen) {
		return wire.Header{}, nil, fmt.Errorf("%w: expected %v frame of %d bytes, got %v of %d",
			ErrProtocol, want, wantLen, h.Kind, h.Len)
	}
	p := make([]byte, h.Len)
	if _, err := io.ReadFull(r, p); err != nil {
		return wire.Header{}, nil, err
	}
	return h, p, nil
}

// bindDeadline applies the earlier of d and ctx's deadline to conn and
// interrupts conn's I/O when ctx ends. The returned function undoes both.
func bindDeadline(ctx context.Context, conn net.Conn, d time.Time) func() {
	if cd, ok := ctx.Deadline(); ok && cd.Before(d) {
		d = cd
	}
	conn.SetDeadline(d)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	return func() {
		stop()
		conn.SetDeadline(time.Time{})
	}
}

func (t *Transport) helloInfo(peer int, mode uint8) (wire.HelloInfo, error) {
	_, world := t.ident()
	i := wire.HelloInfo{
		World:      world,
		Peer:       uint32(peer),
		QueueLimit: uint64(max(t.cfg.queueLimit, 0)),
		MaxFrame:   uint64(t.cfg.maxFrame),
		Mode:       mode,
	}
	_, err := rand.Read(i.Nonce[:])
	return i, err
}

// clientHandshake authenticates conn to rank server. It returns the
// server's HelloInfo. Errors matching errFatal mean retrying is pointless.
//
// The client proves the token first (Auth, over both nonces), and the
// server proves it in Welcome only after checking that proof: a connector
// that does not know the token gets nothing from the server that depends on
// the token.
func (t *Transport) clientHandshake(ctx context.Context, conn stream, br *frameReader, server int, mode uint8) (info wire.HelloInfo, err error) {
	defer bindDeadline(ctx, conn, time.Now().Add(t.cfg.hsTimeout))()
	me, world := t.ident()
	mine, err := t.helloInfo(server, mode)
	if err != nil {
		return wire.HelloInfo{}, err
	}
	t.dialing(mine.Nonce, true)
	defer func() {
		if t.dialing(mine.Nonce, false) && err != nil {
			err = errSelfDial
		}
	}()
	hello := make([]byte, wire.HelloSize)
	mine.Put(hello)
	if err := writeFrame(conn, wire.Header{Kind: wire.Hello, Src: me}, hello); err != nil {
		return wire.HelloInfo{}, err
	}
	h, ch, err := readExpected(br, wire.ChallengeSize, wire.Challenge, wire.ChallengeSize)
	if err != nil {
		return wire.HelloInfo{}, err
	}
	if h.Kind == wire.Reject {
		return wire.HelloInfo{}, &RejectedError{Rank: server, Reason: wire.RejectReason(h.Tag), Detail: h.Stamp}
	}
	// The challenge's src is not checked: nothing the server says counts
	// before it has proved the token (in Welcome), and a server that is not
	// rank `server` refuses the client's proof with a reason.
	var nonce [wire.NonceSize]byte
	copy(nonce[:], ch)
	cmac := wire.ClientMAC(t.cfg.token, hello, nonce, me, uint32(server))
	if err := writeFrame(conn, wire.Header{Kind: wire.Auth, Src: me}, cmac[:]); err != nil {
		return wire.HelloInfo{}, err
	}
	h, wel, err := readExpected(br, wire.WelcomeSize, wire.Welcome, wire.WelcomeSize)
	if err != nil {
		return wire.HelloInfo{}, err
	}
	if h.Kind == wire.Reject {
		return wire.HelloInfo{}, &RejectedError{Rank: server, Reason: wire.RejectReason(h.Tag), Detail: h.Stamp}
	}
	if h.Src != uint32(server) {
		return wire.HelloInfo{}, fmt.Errorf("%w: expected welcome from rank %d, got one from %d", ErrProtocol, server, h.Src)
	}
	smac := wire.ServerMAC(t.cfg.token, hello, wel, me, uint32(server))
	if !hmac.Equal(smac[:], wel[wire.HelloSize:]) {
		return wire.HelloInfo{}, fmt.Errorf("%w: rank %d at %v did not prove the job token", ErrAuth, server, conn.RemoteAddr())
	}
	theirs, err := wire.ParseHello(wel[:wire.HelloSize])
	if err != nil {
		return wire.HelloInfo{}, fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	if theirs.Nonce != nonce {
		return wire.HelloInfo{}, fmt.Errorf("%w: rank %d welcomed with another nonce than its challenge", ErrProtocol, server)
	}
	if theirs.World != world || theirs.Peer != me || theirs.Mode != mode {
		return wire.HelloInfo{}, fmt.Errorf("%w: rank %d answered for world %d, rank %d, mode %d",
			ErrProtocol, server, theirs.World, theirs.Peer, theirs.Mode)
	}
	if theirs.MaxFrame == 0 {
		return wire.HelloInfo{}, fmt.Errorf("%w: rank %d accepts no payload", ErrProtocol, server)
	}
	return theirs, nil
}

// errFatal reports whether a dial-side handshake error should end setup
// rather than be retried.
func errFatal(err error) bool {
	var rj *RejectedError
	// A TLS peer that refuses our certificate says so with an alert, which
	// TLS 1.3 delivers after our side of its handshake has completed: at
	// the first read of the job token's handshake.
	return errors.As(err, &rj) || errors.Is(err, ErrAuth) || errors.Is(err, ErrProtocol) || errors.Is(err, errSelfDial) ||
		errors.Is(err, ErrTLS) || tlsAlert(err)
}

// serverHandshake authenticates an incoming connection. On failure it has
// sent Reject where it could; the caller closes conn. claimed is the rank
// the client said it is (-1 if it never said).
func (t *Transport) serverHandshake(conn stream, br *frameReader) (l link, claimed int, err error) {
	defer bindDeadline(t.ctx, conn, time.Now().Add(t.cfg.hsTimeout))()
	l, claimed, err = t.serverExchange(conn, br)
	if err != nil {
		var he *hsError
		if errors.As(err, &he) {
			writeFrame(conn, wire.Header{Kind: wire.Reject, Src: uint32(t.rank), Tag: uint32(he.reason), Stamp: he.detail}, nil)
		}
		return link{}, claimed, err
	}
	return l, claimed, nil
}

// serverExchange runs the server side of the handshake. Nothing it sends
// before the client's proof has checked out depends on the token or on this
// job (world size, limits): the Challenge is a fresh nonce, and every
// refusal before that is a protocol error.
func (t *Transport) serverExchange(conn stream, br *frameReader) (link, int, error) {
	h, hello, err := readExpected(br, wire.HelloSize, wire.Hello, wire.HelloSize)
	if err != nil {
		if errors.Is(err, ErrProtocol) {
			return link{}, -1, &hsError{reason: wire.RejectProtocol, err: err}
		}
		return link{}, -1, err
	}
	if h.Kind != wire.Hello {
		return link{}, -1, reject(wire.RejectProtocol, "expected hello, got %v", h.Kind)
	}
	theirs, err := wire.ParseHello(hello)
	if err != nil {
		return link{}, -1, &hsError{reason: wire.RejectProtocol, err: err}
	}
	c := int64(h.Src)
	claimed := -1
	if c < int64(t.world) {
		claimed = int(c)
	}
	if t.ownHello(theirs.Nonce) {
		return link{}, claimed, reject(wire.RejectRank, "rank %d dialed its own listener", c)
	}
	mine, err := t.helloInfo(0, t.acceptMode)
	if err != nil {
		return link{}, claimed, err
	}
	if err := writeFrame(conn, wire.Header{Kind: wire.Challenge, Src: uint32(t.rank)}, mine.Nonce[:]); err != nil {
		return link{}, claimed, err
	}
	h, auth, err := readExpected(br, wire.AuthSize, wire.Auth, wire.AuthSize)
	if err != nil {
		if errors.Is(err, ErrProtocol) {
			return link{}, claimed, &hsError{reason: wire.RejectProtocol, err: err}
		}
		return link{}, claimed, err
	}
	if h.Kind != wire.Auth || h.Src != uint32(c) {
		return link{}, claimed, reject(wire.RejectProtocol, "expected auth from rank %d, got %v from %d", c, h.Kind, h.Src)
	}
	// The client signed for the ranks it named (src and Hello.peer); a
	// client that reached the wrong rank is told so once it has proved the
	// token.
	cmac := wire.ClientMAC(t.cfg.token, hello, mine.Nonce, uint32(c), theirs.Peer)
	if !hmac.Equal(cmac[:], auth) {
		return link{}, claimed, &hsError{reason: wire.RejectAuth,
			err: fmt.Errorf("%w: client claiming rank %d did not prove the job token", ErrAuth, c)}
	}
	// Authenticated: from here on the client may learn why it is refused.
	switch {
	case theirs.World != uint32(t.world):
		return link{}, claimed, &hsError{reason: wire.RejectWorld, detail: uint64(t.world),
			err: fmt.Errorf("world size %d, this job has %d", theirs.World, t.world)}
	case theirs.Peer != uint32(t.rank):
		return link{}, claimed, reject(wire.RejectRank, "rank %d wants to reach rank %d, this is rank %d", c, theirs.Peer, t.rank)
	case c >= int64(t.world) || !t.accept(int(c)):
		return link{}, claimed, reject(wire.RejectRank, "rank %d may not connect to rank %d here", c, t.rank)
	case theirs.Mode != t.acceptMode:
		return link{}, claimed, reject(wire.RejectMode, "rank %d uses mode %d, this listener expects %d", c, theirs.Mode, t.acceptMode)
	case theirs.MaxFrame == 0:
		return link{}, claimed, reject(wire.RejectProtocol, "rank %d accepts no payload", c)
	}
	// A star's links come and go: whether a rank may have a second one is
	// for the layer above to say.
	if t.acceptMode != wire.ModeLink {
		if from, ok := t.claim(int(c), conn.RemoteAddr().String()); !ok {
			return link{}, claimed, reject(wire.RejectDuplicate, "rank %d already joined from %s", c, from)
		}
	}
	mine.Peer = uint32(c)
	wel := make([]byte, wire.WelcomeSize)
	mine.Put(wel)
	smac := wire.ServerMAC(t.cfg.token, hello, wel, uint32(c), uint32(t.rank))
	copy(wel[wire.HelloSize:], smac[:])
	if err := writeFrame(conn, wire.Header{Kind: wire.Welcome, Src: uint32(t.rank)}, wel); err != nil {
		if t.acceptMode != wire.ModeLink {
			t.unclaim(int(c))
		}
		return link{}, claimed, err
	}
	return link{rank: int(c), conn: conn, br: br, info: theirs}, claimed, nil
}

// errSelfDial is the handshake error of a dial that reached this very
// transport's listener (the dialer turns it into a *SelfDialError).
var errSelfDial = errors.New("reached this process's own listener")

// dialing registers (on) or unregisters (!on) the nonce of a handshake
// this transport is making as the client. Unregistering reports whether
// this transport's own listener received that very handshake: the dial
// reached itself.
func (t *Transport) dialing(nonce [wire.NonceSize]byte, on bool) (self bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if on {
		if t.ownNonces == nil {
			t.ownNonces = map[[wire.NonceSize]byte]bool{}
		}
		t.ownNonces[nonce] = false
		return false
	}
	self = t.ownNonces[nonce]
	delete(t.ownNonces, nonce)
	return self
}

// ownHello reports whether a Hello with nonce is one this transport sent
// (its dial reached its own listener), and records it for the dialer.
func (t *Transport) ownHello(nonce [wire.NonceSize]byte) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.ownNonces[nonce]; !ok {
		return false
	}
	t.ownNonces[nonce] = true
	return true
}

// claim reserves rank r for an authenticated link from remote; if r is
// taken it returns false and where r joined from.
func (t *Transport) claim(r int, remote string) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.claimed[r] || t.closing.Load() {
		return t.joinedFrom[r], false
	}
	t.claimed[r] = true
	t.joinedFrom[r] = remote
	return "", true
}

func (t *Transport) unclaim(r int) {
	t.mu.Lock()
	t.claimed[r] = false
	t.mu.Unlock()
}
