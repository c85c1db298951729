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
	conn *net.TCPConn
	br   *frameReader
	info wire.HelloInfo // what the other side said about itself
}

// hsError is a handshake failure the server reports to the client.
type hsError struct {
	reason wire.RejectReason
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
	i := wire.HelloInfo{
		World:      uint32(t.world),
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
func (t *Transport) clientHandshake(ctx context.Context, conn *net.TCPConn, br *frameReader, server int, mode uint8) (wire.HelloInfo, error) {
	defer bindDeadline(ctx, conn, time.Now().Add(t.cfg.hsTimeout))()
	mine, err := t.helloInfo(server, mode)
	if err != nil {
		return wire.HelloInfo{}, err
	}
	hello := make([]byte, wire.HelloSize)
	mine.Put(hello)
	if err := writeFrame(conn, wire.Header{Kind: wire.Hello, Src: uint32(t.rank)}, hello); err != nil {
		return wire.HelloInfo{}, err
	}
	h, ack, err := readExpected(br, wire.HelloAckSize, wire.HelloAck, wire.HelloAckSize)
	if err != nil {
		return wire.HelloInfo{}, err
	}
	if h.Kind == wire.Reject {
		return wire.HelloInfo{}, &RejectedError{Rank: server, Reason: wire.RejectReason(h.Tag)}
	}
	if h.Kind != wire.HelloAck || len(ack) != wire.HelloAckSize || h.Src != uint32(server) {
		return wire.HelloInfo{}, fmt.Errorf("%w: expected hello-ack from rank %d, got %v from %d (%d bytes)",
			ErrProtocol, server, h.Kind, h.Src, len(ack))
	}
	theirs, err := wire.ParseHello(ack[:wire.HelloSize])
	if err != nil {
		return wire.HelloInfo{}, fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	smac := wire.ServerMAC(t.cfg.token, hello, ack, uint32(t.rank), uint32(server))
	if !hmac.Equal(smac[:], ack[wire.HelloSize:]) {
		return wire.HelloInfo{}, fmt.Errorf("%w: rank %d at %v did not prove the job token", ErrAuth, server, conn.RemoteAddr())
	}
	if theirs.World != uint32(t.world) || theirs.Peer != uint32(t.rank) || theirs.Mode != mode {
		return wire.HelloInfo{}, fmt.Errorf("%w: rank %d answered for world %d, rank %d, mode %d",
			ErrProtocol, server, theirs.World, theirs.Peer, theirs.Mode)
	}
	if theirs.MaxFrame == 0 {
		return wire.HelloInfo{}, fmt.Errorf("%w: rank %d accepts no payload", ErrProtocol, server)
	}
	cmac := wire.ClientMAC(t.cfg.token, hello, ack, uint32(t.rank), uint32(server))
	if err := writeFrame(conn, wire.Header{Kind: wire.Auth, Src: uint32(t.rank)}, cmac[:]); err != nil {
		return wire.HelloInfo{}, err
	}
	h, _, err = readExpected(br, 0, wire.Welcome, 0)
	if err != nil {
		return wire.HelloInfo{}, err
	}
	switch h.Kind {
	case wire.Welcome:
		return theirs, nil
	case wire.Reject:
		return wire.HelloInfo{}, &RejectedError{Rank: server, Reason: wire.RejectReason(h.Tag)}
	}
	return wire.HelloInfo{}, fmt.Errorf("%w: expected welcome, got %v", ErrProtocol, h.Kind)
}

// errFatal reports whether a dial-side handshake error should end setup
// rather than be retried.
func errFatal(err error) bool {
	var rj *RejectedError
	return errors.As(err, &rj) || errors.Is(err, ErrAuth) || errors.Is(err, ErrProtocol)
}

// serverHandshake authenticates an incoming connection. On failure it has
// sent Reject where it could; the caller closes conn.
func (t *Transport) serverHandshake(conn *net.TCPConn, br *frameReader) (link, error) {
	defer bindDeadline(t.ctx, conn, time.Now().Add(t.cfg.hsTimeout))()
	l, err := t.serverExchange(conn, br)
	if err != nil {
		var he *hsError
		if errors.As(err, &he) {
			writeFrame(conn, wire.Header{Kind: wire.Reject, Src: uint32(t.rank), Tag: uint32(he.reason)}, nil)
		}
		return link{}, err
	}
	return l, nil
}

func (t *Transport) serverExchange(conn *net.TCPConn, br *frameReader) (link, error) {
	h, hello, err := readExpected(br, wire.HelloSize, wire.Hello, wire.HelloSize)
	if err != nil {
		if errors.Is(err, ErrProtocol) {
			return link{}, &hsError{wire.RejectProtocol, err}
		}
		return link{}, err
	}
	if h.Kind != wire.Hello {
		return link{}, reject(wire.RejectProtocol, "expected hello, got %v", h.Kind)
	}
	theirs, err := wire.ParseHello(hello)
	if err != nil {
		return link{}, &hsError{wire.RejectProtocol, err}
	}
	c := int64(h.Src)
	switch {
	case theirs.World != uint32(t.world):
		return link{}, reject(wire.RejectWorld, "client rank %d says world %d, this job has %d", c, theirs.World, t.world)
	case theirs.Peer != uint32(t.rank):
		return link{}, reject(wire.RejectRank, "client rank %d wants rank %d, this is rank %d", c, theirs.Peer, t.rank)
	case c >= int64(t.world) || !t.accept(int(c)):
		return link{}, reject(wire.RejectRank, "rank %d may not connect to rank %d here", c, t.rank)
	case theirs.Mode != t.acceptMode:
		return link{}, reject(wire.RejectMode, "client rank %d uses mode %d, this listener expects %d", c, theirs.Mode, t.acceptMode)
	case theirs.MaxFrame == 0:
		return link{}, reject(wire.RejectProtocol, "client rank %d accepts no payload", c)
	}
	mine, err := t.helloInfo(int(c), t.acceptMode)
	if err != nil {
		return link{}, err
	}
	ack := make([]byte, wire.HelloAckSize)
	mine.Put(ack)
	smac := wire.ServerMAC(t.cfg.token, hello, ack, uint32(c), uint32(t.rank))
	copy(ack[wire.HelloSize:], smac[:])
	if err := writeFrame(conn, wire.Header{Kind: wire.HelloAck, Src: uint32(t.rank)}, ack); err != nil {
		return link{}, err
	}
	h, auth, err := readExpected(br, wire.AuthSize, wire.Auth, wire.AuthSize)
	if err != nil {
		if errors.Is(err, ErrProtocol) {
			return link{}, &hsError{wire.RejectProtocol, err}
		}
		return link{}, err
	}
	if h.Kind != wire.Auth || h.Src != uint32(c) || len(auth) != wire.AuthSize {
		return link{}, reject(wire.RejectProtocol, "expected auth from rank %d, got %v from %d", c, h.Kind, h.Src)
	}
	cmac := wire.ClientMAC(t.cfg.token, hello, ack, uint32(c), uint32(t.rank))
	if !hmac.Equal(cmac[:], auth) {
		return link{}, &hsError{wire.RejectAuth, fmt.Errorf("%w: client claiming rank %d did not prove the job token", ErrAuth, c)}
	}
	if !t.claim(int(c)) {
		return link{}, reject(wire.RejectDuplicate, "rank %d is already connected", c)
	}
	if err := writeFrame(conn, wire.Header{Kind: wire.Welcome, Src: uint32(t.rank)}, nil); err != nil {
		t.unclaim(int(c))
		return link{}, err
	}
	return link{rank: int(c), conn: conn, br: br, info: theirs}, nil
}

// claim reserves rank r for an authenticated link; false if it is taken.
func (t *Transport) claim(r int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.claimed[r] || t.closing.Load() {
		return false
	}
	t.claimed[r] = true
	return true
}

func (t *Transport) unclaim(r int) {
	t.mu.Lock()
	t.claimed[r] = false
	t.mu.Unlock()
}
