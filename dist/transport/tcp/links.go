package tcp

import (
	"context"
	"fmt"
	"net"

	"github.com/gdist/gdist/dist/transport/tcp/internal/wire"
)

// Listener accepts links: connections that processes make with Dial, each
// authenticated like a link of a mesh (the job token's handshake, over TLS
// with WithTLS) and made a Transport of two ranks of its own — rank 0 on the
// accepting side, rank 1 on the dialing side. The dialing process proves
// which rank of a star of `world` ranks it is (1 to world-1; the listener is
// rank 0): the handshake's MACs cover that rank, so only a holder of the
// job token can claim it.
//
// It is the star a leader serves its clients over (package dist/fed).
// Unlike a mesh, links come and go: a link that breaks fails only its own
// Transport, and the same rank may dial again. The Listener does not
// refuse a second link for a rank that has one; the layer above decides.
// Connections that fail the handshake are refused and logged as New's are.
type Listener struct {
	t     *Transport // accepting side only: listener, handshake slots, refusals
	cfg   config     // each link's configuration
	links chan accepted
}

type accepted struct {
	t    *Transport
	rank int
}

// Listen listens on addr for links of a star of world ranks (at least 2)
// and authenticates them in the background; Accept returns them. opts are
// those of New, applied to each link (WithListenAddr is refused: addr is
// the address).
func Listen(ctx context.Context, addr string, world int, opts ...Option) (*Listener, error) {
	cfg, err := apply(opts)
	if err != nil {
		return nil, err
	}
	if err := checkArgs(0, world, &cfg); err != nil {
		return nil, err
	}
	if world < 2 {
		return nil, fmt.Errorf("tcp: %w: a star of %d ranks has no links", ErrInvalidArgument, world)
	}
	if cfg.listenSet {
		return nil, fmt.Errorf("tcp: %w: WithListenAddr is for Rendezvous; Listen listens on its address", ErrInvalidArgument)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("tcp: listen for links: %w", err)
	}
	hub := cfg
	hub.hbInterval = -1 // the accepting side has no peers of its own to watch
	l := &Listener{cfg: cfg, links: make(chan accepted)}
	l.t = newTransport(0, world, ln, hub)
	l.t.accept = func(r int) bool { return r > 0 }
	l.t.acceptMode = wire.ModeLink
	l.t.handOff = l.handOff
	l.t.startAccepting()
	return l, nil
}

// Addr returns the address the listener listens on.
func (l *Listener) Addr() net.Addr { return l.t.Addr() }

// Accept returns the next authenticated link: a Transport of two ranks on
// which this side is rank 0 and the dialer rank 1, and the rank the dialer
// proved it is in the star. The caller owns the Transport and closes it. A
// link that is authenticated while nobody calls Accept waits for it (the
// dialer's Dial has returned: it may already send). Accept returns an
// error matching ErrClosed after Close, or ctx's error.
func (l *Listener) Accept(ctx context.Context) (*Transport, int, error) {
	select {
	case a := <-l.links:
		return a.t, a.rank, nil
	case <-ctx.Done():
		return nil, -1, fmt.Errorf("tcp: accept: %w", ctx.Err())
	case <-l.t.stop:
		return nil, -1, errClosed("accept")
	}
}

// Close stops listening, closes the links authenticated but not accepted
// yet and waits for the goroutines it started. The links Accept returned
// stay open. It is idempotent and returns nil.
func (l *Listener) Close() error { return l.t.Close() }

// handOff makes an authenticated link a two-rank Transport and waits for
// Accept to take it.
func (l *Listener) handOff(lk link) {
	t := newTransport(0, 2, nil, l.cfg)
	t.log = l.cfg.logger.With("rank", 0, "link_rank", lk.rank)
	t.quietLoss = true
	star := lk.rank
	lk.rank = 1
	if err := t.addPeer(lk); err != nil {
		return
	}
	select {
	case l.links <- accepted{t: t, rank: star}:
	case <-l.t.stop:
		t.Close()
	}
}

// Dial makes a link to the Listener at addr as rank `rank` of a star of
// world ranks (1 <= rank < world): one connection, authenticated with the
// job token (and TLS with WithTLS), which becomes a Transport of two ranks
// on which this side is rank 1 and the listener rank 0. Dial tries once,
// bounded by ctx and the handshake timeout, and leaves retrying to the
// caller: the error of a dial nobody answers matches syscall.ECONNREFUSED,
// one the listener refused is a *RejectedError (matching ErrAuth for a
// wrong token), a TLS refusal matches ErrTLS. opts are those of New
// (WithListenAddr is refused).
func Dial(ctx context.Context, addr string, rank, world int, opts ...Option) (*Transport, error) {
	cfg, err := apply(opts)
	if err != nil {
		return nil, err
	}
	if err := checkArgs(rank, world, &cfg); err != nil {
		return nil, err
	}
	if rank == 0 {
		return nil, fmt.Errorf("tcp: %w: rank 0 of a star is the listener; Dial as rank 1 to %d", ErrInvalidArgument, world-1)
	}
	if cfg.listenSet {
		return nil, fmt.Errorf("tcp: %w: WithListenAddr is for Rendezvous", ErrInvalidArgument)
	}
	t := newTransport(1, 2, nil, cfg)
	t.log = cfg.logger.With("rank", rank, "link_rank", 0)
	t.idRank, t.idWorld = rank, world
	t.quietLoss = true
	hctx, cancel := context.WithTimeout(ctx, cfg.hsTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(hctx, "tcp", addr)
	if err == nil && selfConnected(c) {
		c.Close()
		err = errSelfConnect
	}
	var lk link
	if err == nil {
		lk, err = t.connect(hctx, c.(*net.TCPConn), 0, addr, wire.ModeLink)
	}
	if err == nil {
		err = t.addPeer(lk)
	}
	if err != nil {
		t.Close()
		if timedOut(err) && ctx.Err() == nil {
			err = fmt.Errorf("no answer within the handshake timeout %v: %w (%w)", cfg.hsTimeout, context.DeadlineExceeded, err)
		}
		return nil, fmt.Errorf("tcp: rank %d: link to %s: %w", rank, addr, err)
	}
	return t, nil
}
