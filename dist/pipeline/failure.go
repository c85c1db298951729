package pipeline

// Failure: a pipeline fails through its group (dist's one failure domain),
// and other stages' causes are turned back into pipeline errors.

import (
	"errors"

	"github.com/gdist/gdist/dist"
)

// Operations under which a pipeline fails its group (dist's Abort); the
// other stages tell from the encoded cause what happened.
const (
	opPipeline     = "pipeline"
	opSetup        = "pipeline setup"
	opCallMismatch = "pipeline call"
)

// fail records the pipeline's first failure: err, which this stage met,
// fails the group (dist's one failure domain: every peer is told, encoded)
// unless the group has failed already, in which case the group's first
// failure wins. It returns the error the call reports.
func (p *Pipeline) fail(err error) error {
	p.mu.Lock()
	if c := p.cause; c != nil {
		p.mu.Unlock()
		return c
	}
	p.mu.Unlock()
	op := opPipeline
	if errors.Is(err, ErrCallMismatch) {
		op = opCallMismatch
	}
	e := p.stageErr(p.g.Abort(op, err))
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cause == nil {
		p.cause = e
	}
	return p.cause
}

// stageErr adds the pipeline's sentinel to the error of a group that
// another rank failed for a reason of its own: ErrCallMismatch if it found
// the stages in different calls, ErrStageFailed for anything else (a
// callback's error, a cancelled context, a timeout, a failed setup). A
// lost, frozen or closed peer, a desync and this stage's own failures are
// reported as they are.
func (p *Pipeline) stageErr(err error) error {
	var (
		a  *dist.AbortError
		pe *dist.PeerError
	)
	if !errors.As(err, &a) || a.Reporter == p.g.Rank() || !errors.As(err, &pe) {
		return err
	}
	var sentinel error
	switch {
	case a.Op == opCallMismatch:
		sentinel = ErrCallMismatch
	case a.Kind == dist.KindUser || a.Kind == dist.KindCancelled || a.Kind == dist.KindTimeout:
		sentinel = ErrStageFailed
	default:
		return err
	}
	return &dist.PeerError{Rank: pe.Rank, Op: opPipeline, Err: &stageError{sentinel: sentinel, err: pe.Err}}
}

// stageError is the Err of a *dist.PeerError reporting another stage's
// failure: it matches the pipeline's sentinel and the group's cause.
type stageError struct {
	sentinel, err error
}

func (e *stageError) Error() string   { return e.sentinel.Error() + ": " + e.err.Error() }
func (e *stageError) Unwrap() []error { return []error{e.sentinel, e.err} }

func (p *Pipeline) causeErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cause
}
