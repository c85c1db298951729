package fed

import (
	"context"

	"github.com/gdist/gdist/dist/transport/hybrid"
	"github.com/gdist/gdist/dist/transport/tcp"
)

// link is one connection between the leader and a client: a transport of
// two ranks (a tcp link, moved to shared memory by hybrid.Over when both
// ends are on one host) on which the leader is rank 0 and the client rank 1.
type link struct {
	tr   *hybrid.Transport
	peer int    // the other end's rank on tr
	via  string // "tcp" or "shm"
}

// tcpOptions are the options of the TCP link: the token, the logger, then
// the caller's.
func (c *config) tcpOptions() []tcp.Option {
	opts := []tcp.Option{tcp.WithLogger(c.logger)}
	if c.token != nil {
		opts = append(opts, tcp.WithToken(c.token))
	}
	if c.insecure {
		opts = append(opts, tcp.WithInsecure())
	}
	return append(opts, c.tcpOpts...)
}

func (c *config) hybridOptions() []hybrid.Option {
	opts := append([]hybrid.Option{hybrid.WithLogger(c.logger)}, shmQuiet()...)
	if c.token != nil {
		opts = append(opts, hybrid.WithToken(c.token))
	}
	if c.insecure {
		opts = append(opts, hybrid.WithInsecure())
	}
	return append(opts, c.hybridOpts...)
}

// upgrade makes an accepted or dialed TCP link a link of the federation:
// shared memory if both ends are on one host and the mode allows it. Both
// ends call it. It takes ownership of tt.
func upgrade(ctx context.Context, tt *tcp.Transport, cfg *config) (*link, error) {
	ht, err := hybrid.Over(ctx, tt, cfg.hybridOptions()...)
	if err != nil {
		return nil, err
	}
	peer := 1 - ht.Rank()
	return &link{tr: ht, peer: peer, via: ht.Via(peer)}, nil
}

// dial makes a link to the leader at addr as rank `rank` of a federation of
// world ranks: one attempt (see tcp.Dial).
func dial(ctx context.Context, addr string, rank, world int, cfg *config) (*link, error) {
	tt, err := tcp.Dial(ctx, addr, rank, world, cfg.tcpOptions()...)
	if err != nil {
		return nil, err
	}
	return upgrade(ctx, tt, cfg)
}

func (l *link) send(ctx context.Context, h header, payload []byte) error {
	return l.tr.Send(ctx, l.peer, tagFed, h.put(), payload)
}

// recv returns the next message. Its payload is the caller's (it may hand
// it back with release).
func (l *link) recv(ctx context.Context) (header, []byte, error) {
	m, err := l.tr.Recv(ctx, l.peer, tagFed)
	if err != nil {
		return header{}, nil, err
	}
	h, err := parseHeader(m.Header)
	if err != nil {
		l.tr.Release(m.Payload)
		return header{}, nil, err
	}
	return h, m.Payload, nil
}

func (l *link) release(p []byte) { l.tr.Release(p) }

// close says goodbye and closes the link: the other end sees it closed,
// not lost.
func (l *link) close() { l.tr.Close() }

// refuse tells a process why it is not admitted and closes the link.
func (l *link) refuse(ctx context.Context, code uint32, why string) {
	l.send(ctx, header{kind: kRefuse, aux: code}, []byte(why))
	l.close()
}
