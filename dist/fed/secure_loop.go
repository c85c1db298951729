package fed

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/gdist/gdist/dist/fed/secagg"
)

// secRound is the leader's part of a round with secure aggregation.
type secRound struct {
	srv   *secagg.Server
	timer *time.Timer // the key exchange's or the unmasking's deadline
}

// secStart starts secure aggregation for the round lp.cur, whose tasks
// have gone out: each sampled client gets the round's configuration and
// answers with its keys.
func (lp *loop) secStart(chosen []int) error {
	r := lp.cur
	cfg := lp.l.cfg.secure.roundConfig(r.k, chosen, lp.l.updateLen())
	srv, err := secagg.NewServer(cfg)
	if err != nil {
		return fmt.Errorf("fed: round %d: secure aggregation: %w", r.k, err)
	}
	r.sec = &secRound{srv: srv, timer: time.NewTimer(lp.l.cfg.secure.StageTimeout)}
	msg := marshalSecConfig(cfg)
	for _, rank := range chosen {
		if m := lp.members[rank]; m != nil && lp.cur != nil {
			lp.send(m, header{kind: kSecure, round: r.k, aux: uint32(secagg.StageAdvertise)}, msg)
		}
	}
	return nil
}

// secMessage hands a sampled member's stage message to the server.
func (lp *loop) secMessage(m *member, h header, p []byte) {
	r := lp.cur
	if r == nil || r.sec == nil || h.round != r.k || r.sampled[m.rank] != m.gen {
		lp.l.log.Debug("fed: late secure aggregation message discarded", "client", m.rank, "message_round", h.round)
		return
	}
	if err := r.sec.srv.Receive(m.rank, p); err != nil {
		// A late client's message (ErrStage) or a bad one: the client is
		// out of this round, as secagg says; the round goes on.
		lp.l.log.Info("fed: secure aggregation message refused", "client", m.rank, "round", r.k, "err", err)
		return
	}
	lp.secCheck()
}

// secCheck closes the stage once no client it waits for can still answer.
func (lp *loop) secCheck() {
	r := lp.cur
	if r == nil || r.sec == nil {
		return
	}
	for _, rank := range r.sec.srv.Pending() {
		if !lp.gone[rank] {
			return
		}
	}
	lp.secAdvance()
}

// secAdvance closes the current stage: it sends the next stage's messages,
// or, after the unmasking, ends the round with the sum.
func (lp *loop) secAdvance() {
	r := lp.cur
	s := r.sec
	stage := s.srv.Stage()
	out, err := s.srv.Advance()
	if err != nil {
		lp.secFinish(fmt.Errorf("fed: round %d: secure aggregation (%v stage): %w", r.k, stageName(stage), err))
		return
	}
	if stage == secagg.StageUnmask {
		lp.secFinish(nil)
		return
	}
	next := s.srv.Stage()
	for rank, msg := range out {
		if m := lp.members[rank]; m != nil && r.sampled[rank] == m.gen {
			lp.send(m, header{kind: kSecure, round: r.k, aux: uint32(next)}, msg)
		}
	}
	if lp.cur != r { // a send dropped the last client and finished the round
		return
	}
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	if next != secagg.StageMask { // the masked updates have the round's deadline
		s.timer = time.NewTimer(lp.l.cfg.secure.StageTimeout)
	}
	lp.secCheck()
}

// secStageExpired closes a stage whose time is up.
func (lp *loop) secStageExpired() {
	lp.cur.sec.timer = nil
	lp.secAdvance()
}

// secDeadline is the round's deadline in a secure round: the stages up to
// the masked updates close now, with the clients that answered; the
// unmasking still gets its stage timeout.
func (lp *loop) secDeadline() {
	for lp.cur != nil && lp.cur.sec != nil && lp.cur.sec.srv.Stage() < secagg.StageUnmask {
		lp.secAdvance()
	}
}

// secFinish ends a secure round: with the sum, or with the round's error.
func (lp *loop) secFinish(fail error) {
	r := lp.cur
	if r.sec.timer != nil {
		r.sec.timer.Stop()
	}
	var sum *secagg.Result
	if fail == nil {
		var err error
		if sum, err = r.sec.srv.Sum(); err != nil {
			fail = fmt.Errorf("fed: round %d: secure aggregation: %w", r.k, err)
		}
	}
	var delta []float64
	var reported []int
	var weight uint64
	if fail == nil {
		reported, weight = sum.Clients, sum.Weight
		if weight > 0 {
			// The weighted mean of the updates; with SCAFFOLD, the control
			// variates' changes, which the clients divided by their sample
			// counts, summed plain.
			delta = sum.Mean()
			dim := len(lp.l.model)
			copy(delta[dim:], sum.Sum[dim:])
		}
	} else {
		lp.l.log.Warn("fed: round failed", "round", r.k, "err", fail)
	}
	lp.conclude(reported, int64(min(weight, math.MaxInt64)), delta, fail)
}

// secSamples checks a client's sample count against the round's bound.
func secSamples(sc *secClient, samples int) error {
	if sc == nil || sc.sa == nil {
		return nil
	}
	if max := sc.sa.Config().MaxWeight; uint64(samples) > max {
		return fmt.Errorf("fed: %w: sample count %d above the leader's SecureAggregation.MaxSamples %d", ErrInvalidArgument, samples, max)
	}
	return nil
}

func stageName(s secagg.Stage) string {
	switch s {
	case secagg.StageAdvertise:
		return "advertise keys"
	case secagg.StageShare:
		return "share keys"
	case secagg.StageMask:
		return "masked input"
	case secagg.StageUnmask:
		return "unmask"
	}
	return fmt.Sprintf("stage %d", s)
}

// errNotInRound is why a client's secure round ended without it.
var errNotInRound = errors.New("fed: this client is not in the round's secure aggregation any more")

// sortedCopy returns a sorted copy of ids.
func sortedCopy(ids []int) []int {
	out := slices.Clone(ids)
	slices.Sort(out)
	return out
}
