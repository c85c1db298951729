package pipeline

// What a stage did during its last call: its passes (Events) and their
// times (Stats).

import (
	"fmt"
	"slices"
	"time"
)

// EventKind says what a stage computed during an Event.
type EventKind uint8

// Kinds of Event.
const (
	// Forward is a training forward pass (up to the output).
	Forward EventKind = iota
	// Backward is a training backward pass (with the ZeroBubble schedule
	// its input-gradient part); with WithRecompute it is preceded by a
	// Recompute event for the same micro-batch.
	Backward
	// ForwardBackward is the last stage's forward and backward of one
	// micro-batch, run back to back.
	ForwardBackward
	// Recompute is the forward pass a recomputing stage repeats before a
	// backward pass.
	Recompute
	// ForwardOnly is a forward pass of Infer.
	ForwardOnly
	// WeightGrad is the weight-gradient pass of the ZeroBubble schedule.
	WeightGrad
)

// String returns "F", "B", "FB", "R", "I" or "W".
func (k EventKind) String() string {
	switch k {
	case Forward:
		return "F"
	case Backward:
		return "B"
	case ForwardBackward:
		return "FB"
	case Recompute:
		return "R"
	case ForwardOnly:
		return "I"
	case WeightGrad:
		return "W"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Event is one interval a stage spent computing.
type Event struct {
	Kind       EventKind
	MicroBatch int
	// Stage is the virtual stage computed: the stage itself unless
	// NewInterleaved.
	Stage      int
	Start, End time.Time
}

// Stats describes the last call (Infer or TrainStep) of a stage: when it
// started and ended, how long the stage computed, and each compute interval.
// Idle time — the stage's share of the pipeline bubble, plus time spent
// waiting for messages — is Wall - Busy.
type Stats struct {
	Start, End time.Time
	Busy       time.Duration
	Events     []Event
}

// Wall returns End - Start.
func (s Stats) Wall() time.Duration { return s.End.Sub(s.Start) }

// IdleFraction returns (Wall - Busy) / Wall, or 0 for an empty call.
func (s Stats) IdleFraction() float64 {
	w := s.Wall()
	if w <= 0 {
		return 0
	}
	return float64(w-s.Busy) / float64(w)
}

// Stats returns the statistics of the last call. The caller owns the
// returned Events.
func (p *Pipeline) Stats() Stats {
	s := p.stats
	s.Events = slices.Clone(s.Events)
	return s
}

// Costs returns the mean duration of the call's passes of each kind, for
// Predict (a recomputing stage's Backward includes its Recompute).
func (s Stats) Costs() PassCosts {
	var sum [WeightGrad + 1]time.Duration
	var n [WeightGrad + 1]int
	for _, e := range s.Events {
		if e.Kind <= WeightGrad {
			sum[e.Kind] += e.End.Sub(e.Start)
			n[e.Kind]++
		}
	}
	mean := func(k EventKind) time.Duration {
		if n[k] == 0 {
			return 0
		}
		return sum[k] / time.Duration(n[k])
	}
	c := PassCosts{Forward: mean(Forward), Backward: mean(Backward), Weights: mean(WeightGrad), ForwardBackward: mean(ForwardBackward)}
	if c.Forward == 0 {
		c.Forward = mean(ForwardOnly)
	}
	if n[Recompute] > 0 && n[Backward] > 0 {
		c.Backward += sum[Recompute] / time.Duration(n[Backward])
	}
	return c
}
