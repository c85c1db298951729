package fed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/gdist/gdist/dist/transport/tcp"
)

// Leader is rank 0 of a federation: it holds the global model, admits
// clients, runs the rounds and averages the updates. Create it with Lead.
// Its methods are safe for concurrent use; rounds run one at a time.
type Leader struct {
	cfg   config
	log   *slog.Logger
	world int
	ln    *tcp.Listener

	events  chan event    // from the acceptor and the members' goroutines
	calls   chan *call    // from Round and Lead's wait
	stop    chan struct{} // closed by Close: the loop finishes the federation
	done    chan struct{} // closed when the loop has returned
	once    sync.Once
	wg      sync.WaitGroup // the acceptor, the greeters and the members' readers
	senders sync.WaitGroup // the members' senders

	// actx ends when Close starts: no more links are accepted. ctx ends
	// once the senders have delivered the leader's last words (Finish).
	actx, ctx       context.Context
	acancel, cancel context.CancelFunc

	mu      sync.Mutex // guards the fields below, which the loop writes
	model   []float32
	round   uint64 // rounds run (the last round's number)
	members []int  // ranks admitted, in increasing order
}

// member is a client admitted, or waiting for admission, on one link.
type member struct {
	rank int
	gen  uint64 // unique per link: messages of an older link of the rank are not this one's
	link *link
	inc  uint64 // the process's incarnation (its Join)
	last uint64 // the last round it took part in, as it said (its Join)
	out  chan outMsg
}

type outMsg struct {
	h       header
	payload []byte // read-only: shared by the members a message goes to
}

// outboxSize bounds the messages waiting to go to one member; a member
// that lets it fill up is not reading and is dropped.
const outboxSize = 8

type eventKind uint8

const (
	evJoin    eventKind = iota + 1 // a process authenticated and sent Join
	evMessage                      // a member sent a message
	evLost                         // a member's link ended
)

type event struct {
	kind    eventKind
	m       *member
	h       header
	payload []byte
	err     error
}

// Lead starts a federation of world ranks (rank 0, the leader, and clients
// 1 to world-1) around the global model init, which it copies, and returns
// once it listens on addr (tcp.Listen; "host:0" picks a port, see Addr).
// Clients are admitted as they join: at once between rounds, at the end of
// the round in progress otherwise; each gets the current model. Await
// waits for the job's clients, as a rendezvous does.
//
// A token (WithToken) or WithInsecure is required; with WithTLS the links
// run over TLS with mutual authentication.
func Lead(ctx context.Context, addr string, world int, init []float32, opts ...Option) (*Leader, error) {
	cfg, err := apply(opts, roleLeader)
	if err != nil {
		return nil, err
	}
	if world < 2 {
		return nil, fmt.Errorf("fed: %w: a federation of %d ranks has no client", ErrInvalidArgument, world)
	}
	if cfg.minAvailable > world-1 {
		return nil, fmt.Errorf("fed: %w: a round needs %d clients, the job has %d", ErrInvalidArgument, cfg.minAvailable, world-1)
	}
	if cfg.optimizer == nil {
		cfg.optimizer = &FedAvg{}
	}
	ln, err := tcp.Listen(ctx, addr, world, cfg.tcpOptions()...)
	if err != nil {
		return nil, fmt.Errorf("fed: lead: %w", err)
	}
	l := &Leader{
		cfg:    cfg,
		log:    cfg.logger.With("rank", 0),
		world:  world,
		ln:     ln,
		events: make(chan event),
		calls:  make(chan *call),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
		model:  slices.Clone(init),
	}
	l.actx, l.acancel = context.WithCancel(context.Background())
	l.ctx, l.cancel = context.WithCancel(context.Background())
	lp := &loop{l: l, members: map[int]*member{}, pending: map[int]*member{}}
	go lp.run()
	l.wg.Add(1)
	go l.accept()
	return l, nil
}

// Await waits until every client of the job (ranks 1 to world-1) has
// joined. If the join timeout (WithJoinTimeout, from Lead) passes first, it
// returns nil when at least WithMinAvailable clients have joined — the
// federation starts with them, the missing ones are logged and are
// admitted whenever they come — and a *JoinTimeoutError naming the
// missing ranks otherwise. Lead followed by Await is what a job started by
// a launcher wants; without Await, the first round starts as soon as
// WithMinAvailable clients are members.
func (l *Leader) Await(ctx context.Context) error {
	c := &call{kind: callWait, ctx: ctx, need: l.world - 1, deadline: time.Now().Add(l.cfg.joinTimeout), reply: make(chan reply, 1)}
	r, err := l.do(c)
	if err != nil {
		return err
	}
	return r.err
}

// Addr returns the address the leader listens on.
func (l *Leader) Addr() net.Addr { return l.ln.Addr() }

// Model returns a copy of the global model.
func (l *Leader) Model() []float32 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.model)
}

// Members returns the ranks of the clients admitted, in increasing order.
func (l *Leader) Members() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.members)
}

// Result is what a round did.
type Result struct {
	Round    int   // the round's number, from 1
	Sampled  []int // the clients asked to train, in increasing order
	Reported []int // those whose updates were averaged: the round's participants
	Missing  []int // sampled but not averaged: late, lost, or an update refused
	Joined   []int // clients that joined since the previous round's result, in order (admitted at once between rounds, after the round during one)
	Left     []int // members lost since the previous round's result, in order
	Members  int   // members after the round
	Samples  int64 // the sample count of the averaged updates
	Elapsed  time.Duration
}

// Round runs one round of federated averaging and returns what it did:
//
//  1. it waits (bounded by ctx) until at least WithMinAvailable clients are
//     members, then samples max(⌊fraction·n⌋, WithMinClients) of the n
//     members (WithFraction, WithSeed);
//  2. it sends each sampled client the global model;
//  3. it waits for their updates (Client.Report: new weights and a sample
//     count) until every sampled client has reported or left, or the round
//     timeout passes (WithRoundTimeout);
//  4. it averages the updates it got, weighted by their sample counts
//     (McMahan et al. 2017), and moves the model by that average with the
//     server optimizer (WithServerOptimizer; default FedAvg: the model
//     becomes the average). A round no update reached leaves the model as
//     it was.
//
// An update for another round is never averaged into this one, nor one
// from a link of the rank other than the one sampled. Clients that joined
// or came back during the round are admitted after it, with the new model.
// If ctx ends first, Round returns its error and the model is unchanged.
// After Close, Round returns an error matching ErrClosed.
func (l *Leader) Round(ctx context.Context) (Result, error) {
	r, err := l.do(&call{kind: callRound, ctx: ctx, reply: make(chan reply, 1)})
	if err != nil {
		return Result{}, err
	}
	return r.res, r.err
}

// Close ends the federation: a round in progress ends with an error
// matching ErrClosed, every client is told the federation has ended (its
// Next returns ErrFinished) and its link closed, and the leader stops
// listening. Close waits for everything it started and is idempotent; it
// returns nil.
func (l *Leader) Close() error {
	l.once.Do(func() {
		l.acancel()
		close(l.stop)
		<-l.done // the loop has queued Finish for every member
		l.ln.Close()
		l.senders.Wait()
		l.cancel()
		l.wg.Wait()
	})
	return nil
}

type callKind uint8

const (
	callWait  callKind = iota + 1 // Lead: wait for `need` members until deadline
	callRound                     // Round
)

type call struct {
	kind     callKind
	ctx      context.Context
	need     int
	deadline time.Time
	reply    chan reply
}

type reply struct {
	res Result
	err error
}

// do hands c to the loop and waits for its reply.
func (l *Leader) do(c *call) (reply, error) {
	select {
	case l.calls <- c:
	case <-l.done:
		return reply{}, fmt.Errorf("fed: leader: %w", ErrClosed)
	case <-c.ctx.Done():
		return reply{}, fmt.Errorf("fed: leader: %w", c.ctx.Err())
	}
	return <-c.reply, nil // the loop always replies, also when it stops
}

// post hands ev to the loop; it reports false when the loop is gone.
func (l *Leader) post(ev event) bool {
	select {
	case l.events <- ev:
		return true
	case <-l.done:
		return false
	}
}

// accept takes each authenticated link, makes it a link of the federation
// and reads its Join, on a goroutine of its own.
func (l *Leader) accept() {
	defer l.wg.Done()
	ctx := l.actx
	for {
		tt, rank, err := l.ln.Accept(ctx)
		if err != nil {
			return
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			l.greet(ctx, tt, rank)
		}()
	}
}

// greetTimeout bounds the shared-memory setup and the Join of a new link.
const greetTimeout = 30 * time.Second

// greet finishes setting up a new link and reads its Join.
func (l *Leader) greet(ctx context.Context, tt *tcp.Transport, rank int) {
	gctx, cancel := context.WithTimeout(ctx, greetTimeout)
	defer cancel()
	lk, err := upgrade(gctx, tt, &l.cfg)
	if err != nil {
		l.log.Warn("fed: link setup failed", "client", rank, "err", err)
		return
	}
	h, p, err := lk.recv(gctx)
	if err == nil && h.kind != kJoin {
		err = fmt.Errorf("%w: expected join, got %v", ErrProtocol, h.kind)
	}
	var j join
	if err == nil {
		j, err = parseJoin(p)
		lk.release(p)
	}
	if err != nil {
		l.log.Warn("fed: refused a client", "client", rank, "err", err)
		if errors.Is(err, ErrProtocol) {
			lk.refuse(gctx, refuseVersion, err.Error())
		} else {
			lk.close()
		}
		return
	}
	m := &member{rank: rank, link: lk, inc: j.incarnation, last: j.lastRound, out: make(chan outMsg, outboxSize)}
	if !l.post(event{kind: evJoin, m: m}) {
		lk.refuse(gctx, refuseFinished, "the federation has ended")
	}
}

// serve runs a member's reader and sender until its link ends.
func (l *Leader) serve(m *member) {
	l.senders.Add(1)
	l.wg.Add(1)
	go func() { // sender: owns the link's end
		defer l.senders.Done()
		ctx := l.ctx
		failed := false
		for msg := range m.out {
			if failed {
				continue
			}
			if err := m.link.send(ctx, msg.h, msg.payload); err != nil {
				failed = true
				m.link.tr.Kill() // the reader reports the loss
			}
		}
		m.link.close()
	}()
	go func() { // reader
		defer l.wg.Done()
		ctx := l.ctx
		for {
			h, p, err := m.link.recv(ctx)
			if err != nil {
				l.post(event{kind: evLost, m: m, err: err})
				return
			}
			if !l.post(event{kind: evMessage, m: m, h: h, payload: p}) {
				m.link.release(p)
				return
			}
		}
	}()
}

// finite reports whether every value of x is finite.
func finite(x []float32) bool {
	for _, v := range x {
		if math.IsInf(float64(v), 0) || math.IsNaN(float64(v)) {
			return false
		}
	}
	return true
}
