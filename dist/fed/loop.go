package fed

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"
)

// loop is the leader's state, owned by one goroutine (run): the members,
// the clients waiting for admission, the round in progress. Everything
// else talks to it through Leader.events and Leader.calls.
type loop struct {
	l       *Leader
	gen     uint64          // the last link generation given out
	members map[int]*member // admitted, by rank
	pending map[int]*member // joined during a round, admitted after it
	wait    *call           // Lead's wait or a Round waiting for members
	cur     *roundState     // the round in progress
	timer   *time.Timer     // the round's deadline, or Lead's wait's
	updates map[int]*update // the round's updates, by rank
	gone    map[int]bool    // members lost or refused during the round
	joined  []int           // admitted or queued since the last round's result
	left    []int           // lost since the last round's result
	prev    map[int]uint64  // the incarnation of each rank's last link, to tell reconnects apart in the log
	snap    []byte          // the current model as sent, shared by the messages that carry it
	control []float64       // SCAFFOLD's control variate c
}

type roundState struct {
	c       *call
	k       uint64
	start   time.Time
	sampled map[int]uint64 // rank -> the generation of the link it was sampled on
	sec     *secRound      // with secure aggregation
}

type update struct {
	samples uint32
	delta   []byte // float32 little-endian, the model's length
}

func (lp *loop) run() {
	l := lp.l
	defer close(l.done)
	lp.prev = map[int]uint64{}
	for {
		var deadline <-chan time.Time
		if lp.timer != nil {
			deadline = lp.timer.C
		}
		var stage <-chan time.Time
		if lp.cur != nil && lp.cur.sec != nil && lp.cur.sec.timer != nil {
			stage = lp.cur.sec.timer.C
		}
		var callCtx <-chan struct{}
		calls := l.calls
		switch {
		case lp.cur != nil:
			callCtx, calls = lp.cur.c.ctx.Done(), nil
		case lp.wait != nil:
			callCtx, calls = lp.wait.ctx.Done(), nil
		}
		select {
		case ev := <-l.events:
			lp.handle(ev)
		case c := <-calls:
			lp.begin(c)
		case <-deadline:
			lp.timer = nil
			lp.expired()
		case <-stage:
			lp.secStageExpired()
		case <-callCtx:
			lp.cancelled()
		case <-l.stop:
			lp.shutdown()
			return
		}
	}
}

// begin starts a call: Lead's wait for the job's clients, or a round.
func (lp *loop) begin(c *call) {
	lp.wait = c
	if c.kind == callWait {
		lp.timer = time.NewTimer(time.Until(c.deadline))
	}
	lp.check()
}

// check starts the round or ends the wait the members now allow.
func (lp *loop) check() {
	c := lp.wait
	if c == nil {
		return
	}
	switch c.kind {
	case callWait:
		if len(lp.members) >= c.need {
			lp.stopTimer()
			lp.wait = nil
			c.reply <- reply{}
		}
	case callRound:
		if len(lp.members) >= lp.l.cfg.minAvailable {
			lp.wait = nil
			lp.startRound(c)
		}
	}
}

func (lp *loop) stopTimer() {
	if lp.timer != nil {
		lp.timer.Stop()
		lp.timer = nil
	}
}

// expired handles the end of the wait's or the round's time.
func (lp *loop) expired() {
	if lp.cur != nil && lp.cur.sec != nil {
		lp.secDeadline()
		return
	}
	if lp.cur != nil {
		lp.finishRound()
		return
	}
	c := lp.wait
	if c == nil || c.kind != callWait {
		return
	}
	lp.wait = nil
	joined := lp.ranks()
	var missing []int
	for r := 1; r < lp.l.world; r++ {
		if _, ok := lp.members[r]; !ok {
			missing = append(missing, r)
		}
	}
	if len(joined) < lp.l.cfg.minAvailable {
		c.reply <- reply{err: &JoinTimeoutError{Timeout: lp.l.cfg.joinTimeout, Joined: joined, Missing: missing, Need: lp.l.cfg.minAvailable}}
		return
	}
	lp.l.log.Warn("fed: starting without every client", "joined", len(joined), "missing", ranks(missing),
		"join_timeout", lp.l.cfg.joinTimeout)
	c.reply <- reply{}
}

// cancelled handles the end of the waiting call's context.
func (lp *loop) cancelled() {
	if lp.cur != nil {
		c := lp.cur.c
		lp.l.log.Warn("fed: round abandoned", "round", lp.cur.k, "err", c.ctx.Err())
		lp.endRound()
		c.reply <- reply{err: fmt.Errorf("fed: round %d: %w", lp.round(), c.ctx.Err())}
		return
	}
	c := lp.wait
	lp.wait = nil
	lp.stopTimer()
	what := "waiting for clients"
	if c.kind == callRound {
		what = fmt.Sprintf("round %d: waiting for %d clients, %d are members", lp.round()+1, lp.l.cfg.minAvailable, len(lp.members))
	}
	c.reply <- reply{err: fmt.Errorf("fed: %s: %w", what, c.ctx.Err())}
}

func (lp *loop) round() uint64 {
	lp.l.mu.Lock()
	defer lp.l.mu.Unlock()
	return lp.l.round
}

// ranks returns the members' ranks in increasing order.
func (lp *loop) ranks() []int {
	return slices.Sorted(maps.Keys(lp.members))
}

// publish makes the members and the round visible to Leader's methods.
func (lp *loop) publish() {
	rs := lp.ranks()
	lp.l.mu.Lock()
	lp.l.members = rs
	lp.l.mu.Unlock()
}

func (lp *loop) handle(ev event) {
	switch ev.kind {
	case evJoin:
		lp.join(ev.m)
	case evMessage:
		lp.message(ev.m, ev.h, ev.payload)
	case evLost:
		lp.lost(ev.m, ev.err)
	}
}

// join handles a process that authenticated and asked to be a member.
func (lp *loop) join(m *member) {
	if old, ok := lp.members[m.rank]; ok {
		// One link per rank. The old one may be dead and not known to be
		// yet (its heartbeat timeout will tell); the newcomer retries.
		lp.l.log.Info("fed: refused a second link", "client", m.rank, "member_since_link", old.gen)
		lp.refuse(m, refuseBusy, fmt.Sprintf("rank %d is a member on another link; retry", m.rank))
		return
	}
	lp.gen++
	m.gen = lp.gen
	if old, ok := lp.pending[m.rank]; ok {
		lp.drop(old) // a newer link of a process waiting for admission
	}
	lp.l.serve(m)
	lp.joined = append(lp.joined, m.rank)
	if lp.cur != nil {
		lp.pending[m.rank] = m
		return
	}
	lp.admit(m)
	lp.check()
}

// admit makes m a member: it gets the current model.
func (lp *loop) admit(m *member) {
	lp.members[m.rank] = m
	lp.publish()
	how := "joined"
	if inc, ok := lp.prev[m.rank]; ok {
		how = "rejoined (a new process)"
		if inc == m.inc {
			how = "rejoined (reconnected)"
		}
	}
	lp.prev[m.rank] = m.inc
	round := lp.round()
	lp.l.log.Info("fed: client "+how, "client", m.rank, "via", m.link.via, "after_round", round,
		"members", len(lp.members))
	lp.send(m, header{kind: kWelcome, round: round}, lp.model())
}

// model returns the current model as it is sent (cached until it changes).
func (lp *loop) model() []byte {
	if lp.snap == nil {
		lp.l.mu.Lock()
		lp.snap = vecBytes(lp.l.model)
		lp.l.mu.Unlock()
	}
	return lp.snap
}

// send queues a message for m; a member that lets its queue fill up is
// dropped.
func (lp *loop) send(m *member, h header, payload []byte) {
	select {
	case m.out <- outMsg{h: h, payload: payload}:
	default:
		lp.leave(m, fmt.Errorf("not reading: %d messages waiting", outboxSize))
	}
}

// refuse turns away a process that is not made a member.
func (lp *loop) refuse(m *member, code uint32, why string) {
	lp.l.wg.Add(1)
	go func() {
		defer lp.l.wg.Done()
		ctx, cancel := context.WithTimeout(lp.l.ctx, greetTimeout)
		defer cancel()
		m.link.refuse(ctx, code, why)
	}()
}

// drop stops serving m (its sender closes the link).
func (lp *loop) drop(m *member) {
	if lp.members[m.rank] == m {
		delete(lp.members, m.rank)
		lp.publish()
	}
	if lp.pending[m.rank] == m {
		delete(lp.pending, m.rank)
	}
	close(m.out)
}

// lost handles the end of a member's link.
func (lp *loop) lost(m *member, err error) {
	if lp.members[m.rank] != m && lp.pending[m.rank] != m {
		return // dropped already
	}
	lp.leave(m, err)
}

// leave drops m, logs why once and, during a round, counts it.
func (lp *loop) leave(m *member, cause error) {
	wasMember := lp.members[m.rank] == m
	lp.drop(m)
	if !wasMember {
		lp.l.log.Info("fed: client left before admission", "client", m.rank, "cause", cause)
		if i := slices.Index(lp.joined, m.rank); i >= 0 {
			lp.joined = slices.Delete(lp.joined, i, i+1)
		}
		return
	}
	lp.l.log.Warn("fed: client left", "client", m.rank, "round", lp.round()+boolInt(lp.cur != nil),
		"cause", cause, "members", len(lp.members))
	lp.left = append(lp.left, m.rank)
	if lp.cur != nil {
		lp.gone[m.rank] = true
		lp.maybeDone()
	}
}

func boolInt(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// message handles a member's message.
func (lp *loop) message(m *member, h header, p []byte) {
	defer m.link.release(p)
	if lp.members[m.rank] != m {
		return // pending (it has nothing to say yet) or dropped
	}
	secure := lp.l.cfg.secure != nil
	switch {
	case h.kind == kSecure && secure:
		lp.secMessage(m, h, p)
		return
	case h.kind != kUpdate || secure:
		lp.leave(m, fmt.Errorf("%w: unexpected %v from a client", ErrProtocol, h.kind))
		return
	}
	r := lp.cur
	if r == nil || h.round != r.k || r.sampled[m.rank] != m.gen || lp.updates[m.rank] != nil {
		lp.l.log.Debug("fed: late update discarded", "client", m.rank, "update_round", h.round, "round", lp.round())
		return
	}
	n := lp.l.updateLen()
	if err := checkVec(p, n, "update"); err != nil {
		lp.leave(m, err) // Client.Report checks the length: not a gdist client
		return
	}
	if h.aux == 0 {
		lp.leave(m, fmt.Errorf("%w: an update of 0 samples", ErrProtocol))
		return
	}
	d := make([]float32, n)
	vecInto(d, p)
	if !finite(d) {
		lp.l.log.Warn("fed: update refused", "client", m.rank, "round", r.k, "err", "NaN or infinite values")
		lp.gone[m.rank] = true
		lp.maybeDone()
		return
	}
	lp.updates[m.rank] = &update{samples: h.aux, delta: append([]byte(nil), p...)}
	lp.maybeDone()
}

// startRound samples the clients and sends them the model.
func (lp *loop) startRound(c *call) {
	l := lp.l
	k := lp.round() + 1
	members := lp.ranks()
	chosen := sample(members, k, l.cfg.seed, l.cfg.fraction, l.cfg.minFit)
	lp.cur = &roundState{c: c, k: k, start: time.Now(), sampled: map[int]uint64{}}
	lp.updates, lp.gone = map[int]*update{}, map[int]bool{}
	lp.timer = time.NewTimer(l.cfg.roundTimeout)
	if l.cfg.scaffold && lp.control == nil {
		lp.control = make([]float64, len(l.model))
	}
	task := lp.taskPayload()
	var flags uint32
	if l.cfg.secure != nil {
		flags |= taskSecure
	}
	if l.cfg.scaffold {
		flags |= taskScaffold
	}
	for _, r := range chosen {
		lp.cur.sampled[r] = lp.members[r].gen
	}
	for _, r := range chosen {
		if m := lp.members[r]; m != nil && lp.cur != nil {
			lp.send(m, header{kind: kTask, round: k, aux: flags}, task)
		}
	}
	if l.cfg.secure != nil && lp.cur != nil {
		if err := lp.secStart(chosen); err != nil {
			lp.conclude(nil, 0, nil, err)
			return
		}
	}
	l.log.Debug("fed: round started", "round", k, "sampled", ranks(chosen), "members", len(members))
}

// maybeDone ends the round once every sampled client has reported or is
// gone.
func (lp *loop) maybeDone() {
	if lp.cur == nil {
		return
	}
	if lp.cur.sec != nil {
		lp.secCheck()
		return
	}
	for r := range lp.cur.sampled {
		if lp.updates[r] == nil && !lp.gone[r] {
			return
		}
	}
	lp.finishRound()
}

// finishRound averages the updates and concludes the round.
func (lp *loop) finishRound() {
	r := lp.cur
	n := lp.l.updateLen()
	sum := make([]float64, n)
	var total int64
	var reported []int
	d := make([]float32, n)
	dim := len(lp.l.model)
	for _, rank := range slices.Sorted(maps.Keys(r.sampled)) { // in rank order: the sum does not depend on arrival order
		u := lp.updates[rank]
		if u == nil {
			continue
		}
		reported = append(reported, rank)
		vecInto(d, u.delta)
		w := float64(u.samples)
		for i, x := range d[:dim] {
			sum[i] += w * float64(x)
		}
		for i, x := range d[dim:] { // SCAFFOLD: the control variates' changes, summed plain
			sum[dim+i] += float64(x)
		}
		total += int64(u.samples)
	}
	if total == 0 {
		sum = nil
	} else {
		for i := range sum[:dim] {
			sum[i] /= float64(total)
		}
	}
	lp.conclude(reported, total, sum, nil)
}

// conclude ends the round: the model moves by delta (the weighted mean of
// the updates of reported, total samples; nil when none; with SCAFFOLD
// followed by the sum of the control variates' changes), the round's
// number is used up, the clients that joined meanwhile are admitted, and
// the Round call gets its Result (and fail, if the round failed).
func (lp *loop) conclude(reported []int, total int64, delta []float64, fail error) {
	l := lp.l
	r := lp.cur
	res := Result{Round: int(r.k), Sampled: slices.Sorted(maps.Keys(r.sampled)), Reported: reported, Samples: total}
	for _, rank := range res.Sampled {
		if !slices.Contains(reported, rank) {
			res.Missing = append(res.Missing, rank)
		}
	}
	l.mu.Lock()
	if delta != nil {
		dim := len(l.model)
		l.cfg.optimizer.Step(l.model, delta[:dim])
		lp.snap = nil
		if l.cfg.scaffold {
			lp.stepControl(delta[dim:])
		}
	}
	l.round = r.k
	l.mu.Unlock()
	lp.endRound()
	res.Joined, res.Left = lp.joined, lp.left
	lp.joined, lp.left = nil, nil
	res.Members = len(lp.members)
	res.Elapsed = time.Since(r.start)
	l.log.Debug("fed: round done", "round", r.k, "reported", ranks(res.Reported), "missing", ranks(res.Missing))
	r.c.reply <- reply{res: res, err: fail}
}

// endRound clears the round and admits the clients that joined during it.
func (lp *loop) endRound() {
	k := lp.cur.k
	lp.stopTimer()
	if sec := lp.cur.sec; sec != nil && sec.timer != nil {
		sec.timer.Stop()
	}
	lp.cur = nil
	lp.updates = nil
	lp.l.mu.Lock()
	if lp.l.round < k {
		lp.l.round = k // an abandoned round still uses up its number
	}
	lp.l.mu.Unlock()
	for _, r := range slices.Sorted(maps.Keys(lp.pending)) {
		m := lp.pending[r]
		delete(lp.pending, r)
		lp.admit(m)
	}
}

// shutdown ends the federation: a waiting call gets ErrClosed, every
// member and pending client is told, and their links are closed.
func (lp *loop) shutdown() {
	closed := fmt.Errorf("fed: leader: %w", ErrClosed)
	if lp.cur != nil {
		c := lp.cur.c
		if sec := lp.cur.sec; sec != nil && sec.timer != nil {
			sec.timer.Stop()
		}
		lp.cur = nil
		c.reply <- reply{err: closed}
	}
	if lp.wait != nil {
		lp.wait.reply <- reply{err: closed}
		lp.wait = nil
	}
	lp.stopTimer()
	for _, set := range []map[int]*member{lp.members, lp.pending} {
		for _, m := range set {
			select {
			case m.out <- outMsg{h: header{kind: kFinish, round: lp.round()}}:
			default:
			}
			close(m.out)
		}
	}
	lp.members, lp.pending = nil, nil
	lp.publish()
}
