package fed

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/gdist/gdist/dist/fed/secagg"
	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/tcp"
)

// Client is a member of a federation: a rank other than 0. Create it with
// Join; take tasks with Next and answer them with Report. Its methods are
// safe for concurrent use.
//
// A client keeps itself in the federation. When its link to the leader
// breaks (a network that drops, a leader that dropped it for being silent
// too long), it dials the leader again in the background, waiting a random
// time below an exponentially growing bound between attempts (WithReconnect),
// and joins again at the leader's next round boundary, with the model of
// that moment; meanwhile Next waits. It gives up on the leader — Next then
// returns a *transport.PeerError (dist.PeerError) naming rank 0 and
// matching ErrLeaderLost — when the reconnect timeout passes, or at once
// when a dial is refused outright (connection refused: no process listens
// at the leader's address, so the leader has died). A killed leader is
// therefore named within moments of its death; a frozen one, or one cut off
// by the network, after the heartbeat timeout plus the reconnect timeout.
type Client struct {
	cfg         config
	log         *slog.Logger
	addr        string
	rank, world int
	inc         uint64 // this process's incarnation, sent in every Join

	mu     sync.Mutex
	link   *link // nil while (re)connecting
	gen    uint64
	task   *Task      // the latest task Next has not returned
	model  []float32  // the latest global model received
	round  uint64     // the round of that model (welcome: the last round done; task: its round)
	last   uint64     // the last round this client reported for
	ci     []float32  // SCAFFOLD: this client's control variate
	sec    *secClient // the secure aggregation of the latest task's round, if any
	err    error      // why the client stopped (ErrFinished, a lost leader, ...)
	notify chan struct{}

	ctx        context.Context // ends at Close
	cancel     context.CancelFunc
	done       chan struct{} // closed when run has returned
	joined     chan struct{} // closed at the first Welcome
	joinedOnce sync.Once
	closeOnce  sync.Once

	dropAt func(secagg.Stage) bool // tests: drop the link on this stage's message instead of answering
}

// Task is a round's work for a client: train from Model and Report.
type Task struct {
	Round int       // the round's number
	Model []float32 // the global model to train from: a copy, the caller's to use and change
	// Correction is SCAFFOLD's drift correction c - cᵢ, in Model's layout,
	// to add to every local gradient before the optimizer's step (see
	// WithScaffold and Trained); nil when the leader does not use SCAFFOLD.
	Correction []float32

	base []float32  // the model the update is computed against
	gen  uint64     // the link the task came on
	sec  *secClient // with secure aggregation

	control []float32 // SCAFFOLD: the leader's control variate c
	steps   int       // Trained
	lr      float64
}

// Join makes this process rank `rank` of the federation of world ranks led
// from addr: it dials the leader (retrying, while nobody listens there
// yet, until the join timeout), authenticates, and returns once the leader
// has admitted it, at a round boundary, with the current model (Model).
// ctx bounds only Join itself; the client then lives until Close, or until
// the federation ends or the leader is lost (Next says which).
func Join(ctx context.Context, addr string, rank, world int, opts ...Option) (*Client, error) {
	cfg, err := apply(opts, roleClient)
	if err != nil {
		return nil, err
	}
	if world < 2 || rank < 1 || rank >= world {
		return nil, fmt.Errorf("fed: %w: rank %d of a federation of %d: clients are ranks 1 to %d", ErrInvalidArgument, rank, world, world-1)
	}
	var b [8]byte
	rand.Read(b[:])
	c := &Client{
		cfg:    cfg,
		log:    cfg.logger.With("rank", rank),
		addr:   addr,
		rank:   rank,
		world:  world,
		inc:    binary.LittleEndian.Uint64(b[:]),
		notify: make(chan struct{}, 1),
		done:   make(chan struct{}),
		joined: make(chan struct{}),
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	go c.run()
	select {
	case <-c.joined:
		return c, nil
	case <-c.done:
		c.Close()
		return nil, c.failure("join")
	case <-ctx.Done():
		c.Close()
		return nil, fmt.Errorf("fed: rank %d: join %s: %w", rank, addr, ctx.Err())
	}
}

// Rank returns the client's rank.
func (c *Client) Rank() int { return c.rank }

// Model returns a copy of the latest global model the client received
// (at Join, or with its latest task) and the round it is the start of.
func (c *Client) Model() ([]float32, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.model), int(c.round)
}

// Next waits for the client's next task: a round the leader sampled it
// for, with the model to train from. If several came while the caller was
// busy, only the latest is returned (the older rounds are over). Next
// returns ErrFinished once the leader has ended the federation, a
// *transport.PeerError naming rank 0 and matching ErrLeaderLost once the
// leader is lost, an error matching ErrClosed after Close, or ctx's error.
func (c *Client) Next(ctx context.Context) (*Task, error) {
	for {
		c.mu.Lock()
		t := c.task
		c.task = nil
		err := c.err
		c.mu.Unlock()
		if t != nil {
			return t, nil
		}
		if err != nil {
			return nil, err
		}
		select {
		case <-c.notify:
		case <-c.done:
		case <-ctx.Done():
			return nil, fmt.Errorf("fed: rank %d: next: %w", c.rank, ctx.Err())
		}
	}
}

// Report sends the leader the client's result for task: its new weights
// (after training from task.Model; the same length) and the number of
// samples it trained on, at least 1, which weights its update in the
// average. The leader receives weights minus the model the task started
// from. weights stays the caller's.
//
// An update for a round the leader has already closed is discarded there,
// as is one sent on a link that has since broken (the client rejoins and
// is sampled again); Report returns nil for those, as for an update that
// was sent: the leader's Result tells who took part. Report returns an error
// for invalid arguments, once the client has stopped (as Next), or with
// ctx's.
func (c *Client) Report(ctx context.Context, task *Task, weights []float32, samples int) error {
	switch {
	case task == nil:
		return fmt.Errorf("fed: %w: Report(nil task)", ErrInvalidArgument)
	case len(weights) != len(task.base):
		return fmt.Errorf("fed: %w: %d weights, the model has %d", ErrInvalidArgument, len(weights), len(task.base))
	case samples < 1 || samples > maxSamples:
		return fmt.Errorf("fed: %w: sample count %d not in [1, %d]", ErrInvalidArgument, samples, uint64(maxSamples))
	}
	delta := make([]float32, len(weights))
	for i, w := range weights {
		delta[i] = w - task.base[i]
	}
	if task.control != nil {
		c.mu.Lock()
		var err error
		delta, err = scaffoldUpdate(c.ci, task.control, delta, task.steps, task.lr, samples, task.sec != nil)
		c.mu.Unlock()
		if err != nil {
			return err
		}
	}
	msg, h, err := c.update(ctx, task, delta, samples)
	if msg == nil || err != nil {
		return err
	}
	c.mu.Lock()
	lk, gen, err := c.link, c.gen, c.err
	c.mu.Unlock()
	if err != nil {
		return err
	}
	if lk == nil || gen != task.gen {
		c.log.Debug("fed: update of a link that broke not sent", "round", task.Round)
		return nil
	}
	err = lk.send(ctx, h, msg)
	if ctx.Err() != nil {
		return fmt.Errorf("fed: rank %d: report round %d: %w", c.rank, task.Round, ctx.Err())
	}
	if err != nil {
		c.log.Debug("fed: update not sent: the link broke", "round", task.Round, "err", err)
		return nil // the link's reader sees the loss and reconnects
	}
	c.mu.Lock()
	c.last = max(c.last, uint64(task.Round))
	c.mu.Unlock()
	return nil
}

// update returns the message that carries an update: Update, or the masked
// input of a secure round (once the key exchange has given the client the
// shares it masks with). It returns a nil message, and no error, when the
// update cannot be sent: the client is no longer in the round.
func (c *Client) update(ctx context.Context, task *Task, delta []float32, samples int) ([]byte, header, error) {
	h := header{kind: kUpdate, round: uint64(task.Round), aux: uint32(samples)}
	sc := task.sec
	if sc == nil {
		return vecBytes(delta), h, nil
	}
	select {
	case <-sc.ready:
	case <-c.done:
		return nil, h, c.failure("report")
	case <-ctx.Done():
		return nil, h, fmt.Errorf("fed: rank %d: report round %d: waiting for the key exchange: %w", c.rank, task.Round, ctx.Err())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if sc.err != nil {
		c.log.Debug("fed: update not sent", "round", task.Round, "err", sc.err)
		return nil, h, nil
	}
	if err := secSamples(sc, samples); err != nil {
		return nil, h, err
	}
	msg, err := sc.sa.MaskInput32(sc.forwarded, delta, uint64(samples))
	if err != nil {
		return nil, h, fmt.Errorf("fed: rank %d: report round %d: %w", c.rank, task.Round, err)
	}
	return msg, header{kind: kSecure, round: uint64(task.Round), aux: uint32(secagg.StageMask)}, nil
}

// Close leaves the federation: the link is closed (the leader sees this
// client leave) and Next and Report return an error matching ErrClosed. It
// waits for the client's goroutine and is idempotent; it returns nil.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.cancel()
		<-c.done
	})
	return nil
}

// failure is the error of a client that stopped.
func (c *Client) failure(op string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		return fmt.Errorf("fed: rank %d: %s: %w", c.rank, op, ErrClosed)
	}
	return c.err
}

// finish records why the client stopped (the first reason wins) and wakes
// Next.
func (c *Client) finish(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.task = nil
	c.mu.Unlock()
	signal(c.notify)
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// run owns the link: it connects, serves the leader's messages and
// reconnects until the federation ends, the leader is lost or Close.
func (c *Client) run() {
	defer close(c.done)
	ctx := c.ctx
	member := false // admitted at least once
	for {
		lk, err := c.connect(ctx, member)
		if err != nil {
			if ctx.Err() != nil {
				err = fmt.Errorf("fed: rank %d: %w", c.rank, ErrClosed)
			}
			c.finish(err)
			return
		}
		member = true
		err = c.serve(ctx, lk)
		c.mu.Lock()
		c.link, c.task = nil, nil
		if c.sec != nil {
			c.sec.end(errNotInRound)
		}
		c.mu.Unlock()
		switch {
		case ctx.Err() != nil:
			lk.close()
			c.finish(fmt.Errorf("fed: rank %d: %w", c.rank, ErrClosed))
			return
		case errors.Is(err, ErrFinished):
			lk.close()
			c.finish(ErrFinished)
			return
		}
		lk.tr.Kill()
		c.log.Warn("fed: link to the leader broke; reconnecting", "err", err)
	}
}

// connect makes a link to the leader and has it admit this process,
// retrying as the type's documentation says. member says whether the
// client has been admitted before (then a refused dial means the leader is
// gone, and the attempts last the reconnect timeout rather than the join
// timeout).
func (c *Client) connect(ctx context.Context, member bool) (*link, error) {
	limit := c.cfg.joinTimeout
	if member {
		limit = c.cfg.reconnect
	}
	start := time.Now()
	bound := c.cfg.backoff
	for attempt := 1; ; attempt++ {
		lk, err := c.attempt(ctx)
		if err == nil {
			if attempt > 1 {
				c.log.Info("fed: reached the leader again", "attempts", attempt, "after", time.Since(start).Round(time.Millisecond))
			}
			return lk, nil
		}
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case permanent(err):
			return nil, leaderLost("join", err)
		case member && errors.Is(err, syscall.ECONNREFUSED):
			return nil, leaderLost("reconnect", fmt.Errorf("nobody listens at %s any more: %w", c.addr, err))
		case time.Since(start) > limit && errors.Is(err, ErrRankInUse):
			return nil, fmt.Errorf("fed: rank %d: join: tried for %v: %w", c.rank, limit, err)
		case time.Since(start) > limit:
			what := "join"
			if member {
				what = "reconnect"
			}
			return nil, leaderLost(what, fmt.Errorf("no answer from %s for %v (%d attempts): %w",
				c.addr, limit, attempt, err))
		}
		c.log.Debug("fed: leader not reached; retrying", "attempt", attempt, "err", err)
		wait := time.Duration(mrand.Int64N(int64(bound)) + 1) // full jitter
		bound = min(2*bound, c.cfg.maxBackoff)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// permanent reports whether a failed attempt is one retrying cannot fix:
// the job token or TLS certificate is refused, the federation is another
// size, or the leader refused this process for good.
func permanent(err error) bool {
	var rj *tcp.RejectedError
	return errors.As(err, &rj) || errors.Is(err, tcp.ErrAuth) || errors.Is(err, tcp.ErrTLS) ||
		errors.Is(err, ErrRefused) || errors.Is(err, ErrInvalidArgument)
}

// attempt dials the leader once, sends Join and waits for the answer:
// Welcome (admitted: the link is returned), or a refusal.
func (c *Client) attempt(ctx context.Context) (*link, error) {
	lk, err := dial(ctx, c.addr, c.rank, c.world, &c.cfg)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	j := join{incarnation: c.inc, lastRound: c.last}
	c.mu.Unlock()
	if err := lk.send(ctx, header{kind: kJoin}, j.marshal()); err != nil {
		lk.tr.Kill()
		return nil, err
	}
	h, p, err := lk.recv(ctx) // the leader answers at its next round boundary
	if err != nil {
		lk.tr.Kill()
		return nil, err
	}
	defer lk.release(p)
	switch h.kind {
	case kWelcome:
		if len(p)%4 != 0 {
			lk.tr.Kill()
			return nil, fmt.Errorf("%w: a welcome of %d bytes", ErrProtocol, len(p))
		}
		model := make([]float32, len(p)/4)
		vecInto(model, p)
		c.mu.Lock()
		c.link = lk
		c.gen++
		c.model, c.round = model, h.round
		c.mu.Unlock()
		c.log.Info("fed: joined", "via", lk.via, "after_round", h.round)
		c.joinedOnce.Do(func() { close(c.joined) })
		return lk, nil
	case kRefuse:
		lk.close()
		if h.aux == refuseBusy {
			return nil, fmt.Errorf("%w: %s", ErrRankInUse, p)
		}
		return nil, fmt.Errorf("%w: %s", ErrRefused, p)
	case kFinish:
		lk.close()
		return nil, fmt.Errorf("%w: the federation has ended", ErrRefused)
	}
	lk.tr.Kill()
	return nil, fmt.Errorf("%w: expected welcome, got %v", ErrProtocol, h.kind)
}

// secure handles a stage message of a secure round: it answers the key
// exchange and the unmasking, and keeps the shares the masked update
// needs. A failure of the round's cryptography takes this client out of
// the round (logged), not off the link; a malformed message does.
func (c *Client) secure(ctx context.Context, lk *link, h header, p []byte) error {
	c.mu.Lock()
	sc := c.sec
	c.mu.Unlock()
	if sc == nil || sc.round != h.round {
		c.log.Debug("fed: secure aggregation message of another round discarded", "round", h.round)
		return nil
	}
	stage := secagg.Stage(h.aux)
	if c.dropAt != nil && c.dropAt(stage) {
		lk.tr.Kill()
		return fmt.Errorf("dropped at the %v stage (test)", stageName(stage))
	}
	var reply []byte
	var err error
	c.mu.Lock()
	switch stage {
	case secagg.StageAdvertise:
		var cfg secagg.Config
		cfg, err = parseSecConfig(p)
		if err != nil {
			c.mu.Unlock()
			return err
		}
		if cfg.Round != h.round {
			c.mu.Unlock()
			return fmt.Errorf("%w: secure aggregation configuration of round %d in round %d", ErrProtocol, cfg.Round, h.round)
		}
		if sc.sa, err = secagg.NewClient(cfg, c.rank, nil); err == nil {
			reply, err = sc.sa.AdvertiseKeys()
		}
	case secagg.StageShare:
		if sc.sa != nil {
			reply, err = sc.sa.ShareKeys(p)
		}
	case secagg.StageMask:
		if sc.sa != nil {
			sc.forwarded = slices.Clone(p)
			sc.end(nil)
		}
	case secagg.StageUnmask:
		if sc.sa != nil {
			reply, err = sc.sa.Unmask(p)
		}
	default:
		c.mu.Unlock()
		return fmt.Errorf("%w: secure aggregation stage %d", ErrProtocol, h.aux)
	}
	if sc.sa == nil && err == nil {
		err = fmt.Errorf("%w: %v before the round's configuration", ErrProtocol, stageName(stage))
	}
	if err != nil {
		sc.end(err)
	}
	c.mu.Unlock()
	if err != nil {
		c.log.Warn("fed: out of the round's secure aggregation", "round", h.round, "stage", stageName(stage), "err", err)
		return nil
	}
	if reply == nil {
		return nil
	}
	return lk.send(ctx, header{kind: kSecure, round: h.round, aux: uint32(stage)}, reply)
}

// serve handles the leader's messages on lk until it breaks (the error
// says why) or the leader ends the federation (ErrFinished).
func (c *Client) serve(ctx context.Context, lk *link) error {
	for {
		h, p, err := lk.recv(ctx)
		if err != nil {
			var pe *transport.PeerError
			if errors.As(err, &pe) && errors.Is(err, transport.ErrPeerClosed) {
				return fmt.Errorf("the leader closed the link: %w", err)
			}
			return err
		}
		switch h.kind {
		case kTask:
			n := len(c.model)
			if h.aux&taskScaffold != 0 {
				n *= 2
			}
			if err := checkVec(p, n, "task"); err != nil {
				lk.release(p)
				return err
			}
			v := make([]float32, n)
			vecInto(v, p)
			lk.release(p)
			base := v[:len(c.model):len(c.model)]
			c.mu.Lock()
			t := &Task{Round: int(h.round), Model: slices.Clone(base), base: base, gen: c.gen}
			if h.aux&taskScaffold != 0 {
				if c.ci == nil {
					c.ci = make([]float32, len(base))
				}
				t.control = v[len(base):]
				t.Correction = make([]float32, len(base))
				for i, x := range t.control {
					t.Correction[i] = x - c.ci[i]
				}
			}
			if c.sec != nil {
				c.sec.end(errNotInRound) // a newer round: the old one is over
				c.sec = nil
			}
			if h.aux&taskSecure != 0 {
				t.sec = newSecClient(h.round)
				c.sec = t.sec
			}
			c.task = t
			c.model, c.round = base, h.round
			c.mu.Unlock()
			signal(c.notify)
		case kSecure:
			err := c.secure(ctx, lk, h, p)
			lk.release(p)
			if err != nil {
				return err
			}
		case kFinish:
			lk.release(p)
			return ErrFinished
		default:
			lk.release(p)
			return fmt.Errorf("%w: unexpected %v from the leader", ErrProtocol, h.kind)
		}
	}
}
