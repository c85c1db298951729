package hybrid

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/tcp"
)

// The tags of the setup messages on the TCP transport (spec in doc.go).
// They are at the top of the tag space, inside dist's reserved range but
// far from the tags dist uses, and only used before Rendezvous returns:
// every setup message is received before it does.
const (
	tagHello  uint32 = 0xFFFFFF00
	tagStatus uint32 = 0xFFFFFF01
)

const (
	helloHeader = 48
	sessionSize = 32
	maxReason   = 512
)

var helloMagic = [8]byte{'g', 'd', 's', 't', 'h', 'y', 'b', '1'}

// hello is what each rank tells every other after the TCP rendezvous.
type hello struct {
	mode    Mode
	shm     bool // this build has the shared-memory transport
	session [sessionSize]byte
	hostID  string
}

func (h *hello) marshal() []byte {
	b := make([]byte, helloHeader+len(h.hostID))
	copy(b, helloMagic[:])
	b[8] = byte(h.mode)
	if h.shm {
		b[9] = 1
	}
	binary.LittleEndian.PutUint32(b[12:], uint32(len(h.hostID)))
	copy(b[16:], h.session[:])
	copy(b[helloHeader:], h.hostID)
	return b
}

func parseHello(b []byte) (hello, error) {
	if len(b) < helloHeader || [8]byte(b[:8]) != helloMagic {
		return hello{}, fmt.Errorf("%w: not a hybrid hello (or another version)", ErrProtocol)
	}
	n := binary.LittleEndian.Uint32(b[12:])
	switch {
	case b[8] > byte(SHM) || b[9] > 1 || b[10] != 0 || b[11] != 0:
		return hello{}, fmt.Errorf("%w: hello with mode %d, flags %#x", ErrProtocol, b[8], b[9:12])
	case n == 0 || n > MaxHostID || int(n) != len(b)-helloHeader:
		return hello{}, fmt.Errorf("%w: hello with a host id of %d bytes in %d", ErrProtocol, n, len(b))
	}
	h := hello{mode: Mode(b[8]), shm: b[9] == 1, hostID: string(b[helloHeader:])}
	copy(h.session[:], b[16:helloHeader])
	return h, nil
}

// Setup statuses a host's ranks tell each other.
const (
	statusOK      = 0 // this rank's shared memory is up
	statusFailed  = 1 // this rank's setup failed (the reason follows)
	statusAborted = 2 // this rank stopped because another one failed
)

// Rendezvous connects rank `rank` of a job of `world` ranks. First the
// ranks meet over TCP through rank 0, which listens on master, exactly as
// tcp.Rendezvous does (WithTCP configures it). Then every rank tells every
// other its mode and host identity (WithHostID, default DefaultHostID)
// over TCP, and rank 0 a fresh random session value. The ranks of each
// host with several ranks then set up shared memory among themselves
// (unless the mode is TCP), over Unix sockets in the abstract namespace
// named after the session and the host, authenticated with the job token
// (WithToken) or else the session value; they tell each other over TCP
// whether it worked, so they all agree on the outcome. In mode Auto a host
// where it failed (or took longer than WithSetupTimeout) uses TCP, and a
// warning is logged; in mode SHM every rank of that host fails with an
// *SHMError naming the rank that failed.
//
// Rendezvous returns once every link is up, or when ctx ends. The ranks
// must agree on the mode (else an error matching ErrMismatch).
func Rendezvous(ctx context.Context, rank, world int, master string, opts ...Option) (*Transport, error) {
	cfg, err := apply(opts)
	if err != nil {
		return nil, err
	}
	if cfg.hostID == "" {
		cfg.hostID = DefaultHostID()
	}
	topts := []tcp.Option{tcp.WithLogger(cfg.logger)}
	if cfg.token != nil {
		topts = append(topts, tcp.WithToken(cfg.token))
	}
	if cfg.insecure {
		topts = append(topts, tcp.WithInsecure())
	}
	tt, err := tcp.Rendezvous(ctx, rank, world, master, append(topts, cfg.tcpOpts...)...)
	if err != nil {
		return nil, err
	}
	t, err := setup(ctx, tt, &cfg)
	if err != nil {
		tt.Close()
		return nil, err
	}
	return t, nil
}

// Over builds a hybrid transport over tt, a TCP transport the caller has
// already made (for example a link of tcp.Listen and tcp.Dial): every rank
// of tt tells the others its host identity over it and the ranks of each
// host set up shared memory among themselves, exactly as Rendezvous does
// after its TCP rendezvous. Every rank of tt must call Over (a rank that
// does not is named after WithSetupTimeout). Over takes ownership of tt:
// the Transport it returns closes tt, and so does a failed Over.
// WithTCP is refused: tt is already made.
func Over(ctx context.Context, tt *tcp.Transport, opts ...Option) (*Transport, error) {
	cfg, err := apply(opts)
	if err == nil && len(cfg.tcpOpts) > 0 {
		err = fmt.Errorf("hybrid: %w: WithTCP is for Rendezvous; Over's TCP transport is already made", ErrInvalidArgument)
	}
	if err != nil {
		tt.Close()
		return nil, err
	}
	if cfg.hostID == "" {
		cfg.hostID = DefaultHostID()
	}
	t, err := setup(ctx, tt, &cfg)
	if err != nil {
		tt.Close()
		return nil, err
	}
	return t, nil
}

// setup runs the hybrid's own part of the rendezvous over tt.
func setup(ctx context.Context, tt *tcp.Transport, cfg *config) (*Transport, error) {
	rank, world := tt.Rank(), tt.WorldSize()
	hellos, err := exchange(ctx, tt, cfg)
	if err != nil {
		return nil, err
	}
	for r, h := range hellos {
		if h.mode != cfg.mode {
			return nil, fmt.Errorf("hybrid: rank %d: %w: rank %d uses %v, this rank %v", rank, ErrMismatch, r, h.mode, cfg.mode)
		}
	}
	t := &Transport{
		rank:   rank,
		world:  world,
		tcp:    tt,
		routes: make([]transport.Transport, world),
		via:    make([]string, world),
		hosts:  make([]int, world),
	}
	index := map[string]int{}
	for r, h := range hellos {
		i, ok := index[h.hostID]
		if !ok {
			i = len(index)
			index[h.hostID] = i
		}
		t.hosts[r] = i
	}
	host := t.hosts[rank]
	peers := make([]bool, world) // the ranks of this host
	n := 0
	for r := range world {
		if t.hosts[r] == host {
			peers[r] = true
			n++
		}
	}
	for r := range world {
		t.routes[r], t.via[r] = tt, ViaTCP
	}
	t.via[rank] = ViaSelf
	if cfg.mode == TCP || n < 2 {
		return t, nil
	}
	for r := range world {
		if peers[r] && !hellos[r].shm {
			if cfg.mode == SHM {
				return nil, &SHMError{Rank: r, Host: host, Err: errors.New("the system has no shared-memory transport")}
			}
			return t, nil // the host's ranks all see this and use TCP
		}
	}
	sl, err := setupSHM(ctx, tt, cfg, peers, host, hellos[0].session)
	if err != nil {
		return nil, err
	}
	if sl != nil {
		t.shm = sl
		for r := range world {
			if r != rank && peers[r] {
				t.routes[r], t.via[r] = sl, ViaSHM
			}
		}
	}
	cfg.logger.Debug("hybrid: routes", "rank", rank, "host", host, "hosts", t.hosts, "via", t.via)
	return t, nil
}

// exchange sends this rank's hello to every other rank and returns
// everyone's, by rank.
func exchange(ctx context.Context, tt *tcp.Transport, cfg *config) ([]hello, error) {
	rank, world := tt.Rank(), tt.WorldSize()
	mine := hello{mode: cfg.mode, shm: shmSupported, hostID: cfg.hostID}
	if rank == 0 {
		if _, err := rand.Read(mine.session[:]); err != nil {
			return nil, err
		}
	}
	b := mine.marshal()
	for r := range world {
		if r != rank {
			if err := tt.Send(ctx, r, tagHello, transport.Header{}, b); err != nil {
				return nil, fmt.Errorf("hybrid: rank %d: send the host identity: %w", rank, err)
			}
		}
	}
	hellos := make([]hello, world)
	hellos[rank] = mine
	// Every rank sends its hello as soon as its TCP rendezvous is done, so
	// a missing one means a peer that does not speak this protocol.
	ectx, cancel := context.WithTimeout(ctx, cfg.setupTimeout)
	defer cancel()
	for r := range world {
		if r == rank {
			continue
		}
		m, err := tt.Recv(ectx, r, tagHello)
		if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			return nil, &transport.PeerError{Rank: r, Op: "hybrid setup", Err: fmt.Errorf(
				"%w: no host identity within %v (does every rank run gdist with the hybrid transport?): %w", ErrProtocol, cfg.setupTimeout, err)}
		}
		if err != nil {
			return nil, fmt.Errorf("hybrid: rank %d: receive the host identity: %w", rank, err)
		}
		h, err := parseHello(m.Payload)
		tt.Release(m.Payload)
		if err != nil {
			return nil, &transport.PeerError{Rank: r, Op: "hybrid setup", Err: err}
		}
		hellos[r] = h
	}
	return hellos, nil
}

// socketName is the abstract Unix socket name prefix of a host's
// shared-memory rendezvous: unique to the session and the host, so that
// simulated hosts on one machine do not meet each other.
func socketName(session [sessionSize]byte, host int) string {
	h := sha256.New()
	h.Write([]byte("gdist/hybrid/1 socket\x00"))
	h.Write(session[:])
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], uint32(host))
	h.Write(b[:])
	return "@gdist-" + hex.EncodeToString(h.Sum(nil)[:16])
}

type peerStatus struct {
	rank   int
	status byte
	reason string
	err    error // receiving it failed
}

// setupSHM sets up shared memory among the ranks of this host (peers) and
// agrees with them on the outcome: the transport if every one of them
// succeeded; nil, nil if one failed in mode Auto; an error if one failed
// in mode SHM, or if the TCP links failed.
func setupSHM(ctx context.Context, tt *tcp.Transport, cfg *config, peers []bool, host int, session [sessionSize]byte) (shmLink, error) {
	rank, world := tt.Rank(), tt.WorldSize()
	token := cfg.token
	if token == nil {
		token = session[:]
	}
	var others []int
	for r := range world {
		if peers[r] && r != rank {
			others = append(others, r)
		}
	}

	sctx, cancel := context.WithTimeout(ctx, cfg.setupTimeout)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	type result struct {
		sl  shmLink
		err error
	}
	local := make(chan result, 1)
	wg.Go(func() {
		sl, err := startSHM(sctx, rank, world, socketName(session, host), peers, token, cfg)
		local <- result{sl, err}
	})
	// The statuses of the others, received over TCP while the setup runs.
	rctx, rcancel := context.WithCancel(ctx)
	defer rcancel()
	statuses := make(chan peerStatus, len(others))
	for _, r := range others {
		wg.Go(func() {
			m, err := tt.Recv(rctx, r, tagStatus)
			if err != nil {
				statuses <- peerStatus{rank: r, err: err}
				return
			}
			s := peerStatus{rank: r}
			if len(m.Payload) < 1 || m.Payload[0] > statusAborted || len(m.Payload) > 1+maxReason {
				s.err = &transport.PeerError{Rank: r, Op: "hybrid setup", Err: fmt.Errorf("%w: a setup status of %d bytes", ErrProtocol, len(m.Payload))}
			} else {
				s.status, s.reason = m.Payload[0], string(m.Payload[1:])
			}
			tt.Release(m.Payload)
			statuses <- s
		})
	}

	var (
		mine    *result
		status  byte
		aborted bool // another rank failed: this one stops its setup
		got     = make([]peerStatus, 0, len(others))
		fatal   error
	)
	for (mine == nil || len(got) < len(others)) && fatal == nil {
		select {
		case r := <-local:
			mine = &r
			msg := []byte{statusOK}
			switch {
			case r.err != nil && aborted && errors.Is(r.err, context.Canceled):
				status, msg = statusAborted, []byte{statusAborted}
			case r.err != nil:
				status = statusFailed
				reason := r.err.Error()
				if len(reason) > maxReason {
					reason = reason[:maxReason]
				}
				msg = append([]byte{statusFailed}, reason...)
			}
			for _, p := range others {
				if err := tt.Send(ctx, p, tagStatus, transport.Header{}, msg); err != nil {
					fatal = fmt.Errorf("hybrid: rank %d: send the shared-memory status: %w", rank, err)
					break
				}
			}
		case s := <-statuses:
			if s.err != nil {
				fatal = fmt.Errorf("hybrid: rank %d: receive the shared-memory status: %w", rank, s.err)
				break
			}
			got = append(got, s)
			if s.status != statusOK && !aborted {
				aborted = true
				cancel()
			}
		}
	}
	if fatal != nil {
		cancel()
		rcancel()
		if mine == nil {
			r := <-local
			mine = &r
		}
		if mine.sl != nil {
			mine.sl.Close()
		}
		return nil, fatal
	}
	if status == statusOK && !aborted {
		return mine.sl, nil
	}
	if mine.sl != nil {
		mine.sl.Close()
	}
	// The culprit: the lowest rank whose own setup failed.
	culprit, cause := -1, error(nil)
	if status == statusFailed {
		culprit, cause = rank, mine.err
	}
	for _, s := range got {
		if s.status == statusFailed && (culprit < 0 || s.rank < culprit) {
			culprit, cause = s.rank, errors.New(s.reason)
		}
	}
	if culprit < 0 { // cannot happen: an abort follows a failure
		culprit, cause = rank, mine.err
	}
	e := &SHMError{Rank: culprit, Host: host, Err: cause}
	if cfg.mode == SHM {
		return nil, e
	}
	cfg.logger.Warn("hybrid: shared memory could not be set up on this host; its ranks use TCP",
		"rank", rank, "host", host, "failed_rank", culprit, "err", cause)
	return nil, nil
}
