//go:build linux

package shm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// maxPendingHS bounds the handshakes a listener runs at once.
const maxPendingHS = 64

// SocketName returns the Unix socket address rank r listens on in a
// Rendezvous under name: name + "." + r. A name starting with '@' is in
// Linux's abstract namespace (nothing on disk); any other name is a path.
func SocketName(name string, r int) string { return name + "." + strconv.Itoa(r) }

// Rendezvous connects rank `rank` of a job of `world` ranks on one host.
// Every rank but the last listens on the Unix socket SocketName(name,
// rank); every rank dials the ranks below it (retrying until ctx ends, so
// ranks may start in any order), authenticates and sets up the pair's
// shared memory. Rendezvous returns once every link is up, and closes its
// listener then: nothing more can connect, and a path socket is removed.
//
// name must be unique to the job. Prefer an abstract name ("@gdist-" and
// something random, such as a hash of the job token and the master port):
// it leaves nothing behind even if a rank is killed during setup. A path
// should be in a directory only the job's user can enter (mode 0700).
func Rendezvous(ctx context.Context, rank, world int, name string, opts ...Option) (*Transport, error) {
	if world < 1 || int64(world) > 1<<20 {
		return nil, fmt.Errorf("shm: %w: world size %d", ErrInvalidArgument, world)
	}
	peers := make([]bool, world)
	for r := range peers {
		peers[r] = true
	}
	return RendezvousPeers(ctx, rank, world, name, peers, opts...)
}

// RendezvousPeers is Rendezvous among a subset of the job's ranks: those
// r with peers[r] true (the ranks of one host in a job that spans hosts),
// which must include rank itself. Every rank of the subset but the highest
// listens on SocketName(name, rank) and dials the subset's ranks below
// it; a connection from a rank outside the subset is refused. The ranks
// outside the subset have no link: calls involving them return an error
// matching ErrNoLink, and HasLink reports false for them. Every rank of
// the subset must pass the same peers. peers is not retained.
func RendezvousPeers(ctx context.Context, rank, world int, name string, peers []bool, opts ...Option) (*Transport, error) {
	cfg, err := apply(opts)
	if err != nil {
		return nil, err
	}
	if err := cfg.validate(rank, world); err != nil {
		return nil, err
	}
	if len(peers) != world || !peers[rank] {
		return nil, fmt.Errorf("shm: %w: peers (%d entries for a world of %d) must include rank %d", ErrInvalidArgument, len(peers), world, rank)
	}
	if name == "" || name == "@" || len(SocketName(name, world)) > 107 {
		return nil, fmt.Errorf("shm: %w: socket name %q (empty, or too long for a Unix socket)", ErrInvalidArgument, name)
	}
	t := newTransport(rank, world, cfg)
	want, highest := 0, rank
	for r := range world {
		t.linkedTo[r] = r != rank && peers[r]
		if t.linkedTo[r] {
			want++
			highest = max(highest, r)
		}
	}
	if want == 0 {
		return t, nil
	}
	sctx, cancel := t.setupContext(ctx)
	defer cancel()
	if rank < highest {
		addr := &net.UnixAddr{Name: SocketName(name, rank), Net: "unix"}
		ln, err := net.ListenUnix("unix", addr)
		if err != nil {
			t.Close()
			return nil, fmt.Errorf("shm: rank %d: listen on %s: %w", rank, addr.Name, err)
		}
		if !abstractName(addr.Name) {
			// Only this user may connect (the handshake checks that too).
			if err := os.Chmod(addr.Name, 0o600); err != nil {
				ln.Close()
				t.Close()
				return nil, fmt.Errorf("shm: rank %d: %w", rank, err)
			}
		}
		t.mu.Lock()
		t.ln = ln
		t.mu.Unlock()
		t.wg.Add(1)
		go t.acceptLoop(ln)
	}
	for j := range rank {
		if !t.linkedTo[j] {
			continue
		}
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			if err := t.dial(sctx, j, SocketName(name, j)); err != nil {
				t.setupFailed(err)
			}
		}()
	}
	if err := t.waitLinked(sctx, want); err != nil {
		cancel()
		t.Close()
		return nil, err
	}
	t.mu.Lock()
	ln := t.ln
	t.ln = nil
	t.mu.Unlock()
	if ln != nil {
		ln.Close()
	}
	return t, nil
}

// New connects rank `rank` of a job of `world` ranks over Unix socket
// connections the caller already has: conns[r] is connected to rank r (the
// same connection rank r passes as its conns[rank]), or nil for a rank
// this transport has no link to (another host, say: calls involving it
// return an error matching ErrNoLink, and HasLink reports false). It is
// the building block of a hybrid transport: a control channel (for
// example an authenticated TCP rendezvous) exchanges socket addresses,
// and New authenticates each connection itself with the job token and
// sets up the pair's memory. The pairs are set up concurrently; New
// returns once every link is up. The transport takes ownership of every
// connection in conns and closes it; conns is not retained.
func New(ctx context.Context, rank, world int, conns []*net.UnixConn, opts ...Option) (*Transport, error) {
	cfg, err := apply(opts)
	if err != nil {
		return nil, err
	}
	if err := cfg.validate(rank, world); err != nil {
		return nil, err
	}
	if len(conns) != world {
		return nil, fmt.Errorf("shm: %w: %d connections for a world of %d", ErrInvalidArgument, len(conns), world)
	}
	if conns[rank] != nil {
		return nil, fmt.Errorf("shm: %w: a connection to this rank itself", ErrInvalidArgument)
	}
	t := newTransport(rank, world, cfg)
	want := 0
	for r, c := range conns {
		t.linkedTo[r] = c != nil
		if c != nil {
			want++
		}
	}
	sctx, cancel := t.setupContext(ctx)
	defer cancel()
	for r, c := range conns {
		if c == nil {
			continue
		}
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			var l link
			var err error
			if rank < r {
				l, err = t.serverHandshake(sctx, c, r)
			} else {
				l, err = t.clientHandshake(sctx, c, r)
			}
			if err == nil {
				err = t.addPeer(l)
			} else {
				c.Close()
				err = fmt.Errorf("shm: rank %d: set up the link to rank %d: %w", rank, r, err)
			}
			if err != nil {
				t.setupFailed(err)
			}
		}()
	}
	if err := t.waitLinked(sctx, want); err != nil {
		cancel()
		t.Close()
		return nil, err
	}
	return t, nil
}

// setupContext is ctx, also cancelled when the transport stops.
func (t *Transport) setupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	sctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(t.ctx, cancel)
	return sctx, func() { stop(); cancel() }
}

// dial connects and authenticates to rank `to` at addr, retrying until ctx
// ends or the failure is one retrying cannot fix.
func (t *Transport) dial(ctx context.Context, to int, addr string) error {
	var d net.Dialer
	backoff := 2 * time.Millisecond
	var last error
	for {
		c, err := d.DialContext(ctx, "unix", addr)
		if err == nil {
			conn := c.(*net.UnixConn)
			var l link
			l, err = t.clientHandshake(ctx, conn, to)
			if err == nil {
				t.mu.Lock()
				t.claimed[to] = true
				t.mu.Unlock()
				return t.addPeer(l)
			}
			conn.Close()
			if errors.Is(err, ErrAuth) || errors.Is(err, ErrProtocol) {
				return fmt.Errorf("shm: rank %d: connect to rank %d at %s: %w", t.rank, to, addr, err)
			}
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("shm: rank %d: connect to rank %d at %s: %w (last error: %v)", t.rank, to, addr, ctx.Err(), last)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 200*time.Millisecond)
	}
}

// acceptLoop accepts connections until the listener closes; each is
// authenticated on its own goroutine.
func (t *Transport) acceptLoop(ln *net.UnixListener) {
	defer t.wg.Done()
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || t.closing.Load() {
				return
			}
			select {
			case <-t.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			continue
		}
		if t.pendHS.Add(1) > maxPendingHS {
			t.pendHS.Add(-1)
			t.log.Warn("shm: refused connection: too many handshakes in progress")
			c.Close()
			continue
		}
		t.wg.Add(1)
		go t.serve(c)
	}
}

// serve authenticates one incoming connection and makes it a peer.
func (t *Transport) serve(conn *net.UnixConn) {
	defer t.wg.Done()
	l, err := t.serverHandshake(t.ctx, conn, -1)
	t.pendHS.Add(-1)
	if err != nil {
		conn.Close()
		if t.closing.Load() {
			return
		}
		reason := "i/o"
		var re *rejectError
		if errors.As(err, &re) {
			reason = reasonString(re.reason)
		}
		t.log.Warn("shm: refused connection", "reason", reason, "err", err)
		return
	}
	t.addPeer(l)
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

// addPeer turns a set-up link into a live peer with its goroutines.
func (t *Transport) addPeer(l link) error {
	p, err := newPeer(t, l)
	if err != nil {
		l.drop()
		return err
	}
	t.mu.Lock()
	if t.closing.Load() {
		t.mu.Unlock()
		l.drop()
		return errClosed("connect")
	}
	t.peers[l.rank].Store(p)
	t.linked++
	t.wg.Add(2)
	t.mu.Unlock()
	go p.readLoop()
	go p.ctlLoop()
	signal(t.linkCh)
	t.log.Debug("shm: linked", "peer", l.rank, "pid", l.pid, "ring", l.ringSize)
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

// waitLinked waits until want peers are linked.
func (t *Transport) waitLinked(ctx context.Context, want int) error {
	for {
		t.mu.Lock()
		n, err := t.linked, t.setupErr
		t.mu.Unlock()
		if err != nil {
			return err
		}
		if n >= want {
			return nil
		}
		select {
		case <-t.linkCh:
		case <-t.stop:
			return errClosed("connect")
		case <-ctx.Done():
			return fmt.Errorf("shm: rank %d: %d of %d peers linked: %w", t.rank, n, want, ctx.Err())
		}
	}
}

// abstractName reports whether name is in the abstract namespace.
func abstractName(name string) bool { return strings.HasPrefix(name, "@") }
