package pipeline

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// layouts returns the layouts a schedule supports, up to the given sizes.
func layouts(s Schedule) []layout {
	var ls []layout
	for p := 1; p <= 5; p++ {
		vs := []int{1}
		if s == Interleaved {
			vs = []int{2, 3}
		}
		for _, v := range vs {
			for m := 1; m <= 12; m++ {
				if s == Interleaved && m%p != 0 {
					continue
				}
				ls = append(ls, layout{p: p, v: v, m: m})
			}
		}
	}
	return ls
}

var allSchedules = []Schedule{GPipe, OneFOneB, ZeroBubble, Interleaved}

// TestPlansComplete: every rank's plan runs every pass of every chunk and
// micro-batch exactly once, and the ranks' plans run to the end under
// unit and random costs (no deadlock).
func TestPlansComplete(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, s := range allSchedules {
		for _, l := range layouts(s) {
			name := fmt.Sprintf("%v/p%d/v%d/m%d", s, l.p, l.v, l.m)
			ps, err := plans(s, l)
			require.NoError(t, err, name)
			require.Len(t, ps, l.p, name)
			for d, list := range ps {
				seen := map[pass]int{}
				for _, x := range list {
					seen[x]++
				}
				for k := range l.v {
					last := l.vstage(d, k) == l.stages()-1
					for mb := range l.m {
						var want []passKind
						switch {
						case last:
							want = []passKind{passFB}
						default:
							want = []passKind{passF, passB}
						}
						if s.split() {
							want = append(want, passW)
						}
						for _, kind := range want {
							assert.Equal(t, 1, seen[pass{kind: kind, chunk: k, mb: mb}], "%s rank %d: %v%d/%d", name, d, kind, mb, k)
						}
					}
				}
				assert.Len(t, list, len(seen), "%s rank %d: no pass twice", name, d)
			}
			_, err = simulate(l, ps, costs{F: 1, B: 1, W: 1})
			require.NoError(t, err, name)
			for range 5 {
				c := costs{F: rng.Float64(), B: rng.Float64(), W: rng.Float64(), Comm: rng.Float64() / 2}
				_, err = simulate(l, ps, c)
				require.NoError(t, err, "%s costs %+v", name, c)
			}
		}
	}
}

// TestPlanBubbles: with passes of equal cost and free messages, each
// schedule leaves the bubble of its formula: GPipe and 1F1B
// (p-1)/(m+p-1), interleaved 1F1B (p-1)/(vm+p-1), ZB-H1 (F = B = W = T)
// (p-1)T in a step of 3mT, (p-1)/(3m+p-1), once m >= p, and less than
// 1F1B's (p-1)3T always.
func TestPlanBubbles(t *testing.T) {
	for _, s := range allSchedules {
		for _, l := range layouts(s) {
			name := fmt.Sprintf("%v/p%d/v%d/m%d", s, l.p, l.v, l.m)
			ps, err := plans(s, l)
			require.NoError(t, err, name)
			p, v, m := float64(l.p), float64(l.v), float64(l.m)
			var c costs
			var formula float64
			switch s {
			case GPipe, OneFOneB:
				c, formula = costs{F: 1, B: 1}, (p-1)/(m+p-1)
			case Interleaved:
				c, formula = costs{F: 1 / v, B: 1 / v}, (p-1)/(v*m+p-1)
			case ZeroBubble:
				c, formula = costs{F: 1, B: 1, W: 1}, (p-1)/(3*m+p-1)
			}
			r, err := simulate(l, ps, c)
			require.NoError(t, err, name)
			// Every rank computes the same: the bubble is the makespan's excess.
			work := r.Busy[0]
			got := (r.Makespan - work) / r.Makespan
			if s == ZeroBubble {
				if l.p > 1 {
					one, err := simulate(l, mustPlans(t, OneFOneB, l), costs{F: 1, B: 2})
					require.NoError(t, err)
					assert.Less(t, r.Makespan, one.Makespan, "%s: ZB-H1 beats 1F1B", name)
				}
				if l.m < l.p {
					continue
				}
			}
			assert.InDelta(t, formula, got, 1e-9, name)
			assert.InDelta(t, formula, r.Bubble(), 1e-9, name)
		}
	}
}

func mustPlans(t *testing.T, s Schedule, l layout) [][]pass {
	ps, err := plans(s, l)
	require.NoError(t, err)
	return ps
}

// TestSlotsNeeded: GPipe holds every micro-batch on every stage but the
// last, 1F1B at most p-s, ZB-H1 at most p (p-s in flight and s postponed
// weight passes), recomputing stages one.
func TestSlotsNeeded(t *testing.T) {
	for _, l := range []layout{{4, 1, 8}, {3, 1, 2}, {2, 1, 16}} {
		for d := range l.p {
			g := slotsNeeded(mustPlans(t, GPipe, l)[d], 1, false, false)[0]
			o := slotsNeeded(mustPlans(t, OneFOneB, l)[d], 1, false, false)[0]
			z := slotsNeeded(mustPlans(t, ZeroBubble, l)[d], 1, true, false)[0]
			r := slotsNeeded(mustPlans(t, OneFOneB, l)[d], 1, false, true)[0]
			if d == l.p-1 {
				assert.Equal(t, 1, g)
			} else {
				assert.Equal(t, l.m, g)
			}
			assert.Equal(t, min(l.m, l.p-d), o, "1f1b p%d m%d stage %d", l.p, l.m, d)
			assert.LessOrEqual(t, z, min(l.p, l.m), "zb p%d m%d stage %d", l.p, l.m, d)
			assert.Equal(t, 1, r)
		}
	}
}

// TestInterleavedNeedsMultiple: the interleaved schedule refuses a number
// of micro-batches that is not a multiple of the stages.
func TestInterleavedNeedsMultiple(t *testing.T) {
	_, err := plan(Interleaved, layout{p: 2, v: 2, m: 3}, 0)
	require.ErrorIs(t, err, ErrInvalidArgument)
	_, err = plan(ZeroBubble, layout{p: 2, v: 2, m: 4}, 0)
	require.ErrorIs(t, err, ErrInvalidArgument)
}

// TestSimulateDeadlock: a plan whose ranks wait for each other is reported.
func TestSimulateDeadlock(t *testing.T) {
	l := layout{p: 2, v: 1, m: 1}
	ps := [][]pass{{{kind: passB}, {kind: passF}}, {{kind: passFB}}}
	_, err := simulate(l, ps, costs{F: 1, B: 1})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "deadlocks")
	assert.False(t, math.IsNaN(sim{}.Bubble()))
}

// TestPredict: GPipe on 2 stages of 8 micro-batches with 1 ms passes takes
// (8+1) x 2 ms with a bubble of 1/9; a message delay lengthens it; bad
// arguments are refused.
func TestPredict(t *testing.T) {
	ms := time.Millisecond
	r, err := Predict(GPipe, 2, 1, 8, PassCosts{Forward: ms, Backward: ms})
	require.NoError(t, err)
	assert.Equal(t, 18*ms, r.Step.Round(time.Microsecond))
	assert.InDelta(t, 1.0/9, r.Bubble, 1e-9)
	slow, err := Predict(GPipe, 2, 1, 8, PassCosts{Forward: ms, Backward: ms, Message: ms / 2})
	require.NoError(t, err)
	assert.Equal(t, 19*ms, slow.Step.Round(time.Microsecond), "two message delays on the critical path")
	zb, err := Predict(ZeroBubble, 2, 1, 8, PassCosts{Forward: ms, Backward: ms, Weights: ms})
	require.NoError(t, err)
	assert.Equal(t, 25*ms, zb.Step.Round(time.Microsecond), "3m + p - 1 passes")
	il, err := Predict(Interleaved, 2, 2, 8, PassCosts{Forward: ms / 2, Backward: ms / 2})
	require.NoError(t, err)
	assert.Equal(t, 17*ms, il.Step.Round(time.Microsecond), "2m + (p-1)/v x 2 passes")
	for _, bad := range []func() error{
		func() error { _, err := Predict(GPipe, 2, 2, 8, PassCosts{}); return err },
		func() error { _, err := Predict(OneFOneB, 0, 1, 8, PassCosts{}); return err },
		func() error { _, err := Predict(Interleaved, 2, 2, 3, PassCosts{}); return err },
	} {
		require.ErrorIs(t, bad(), ErrInvalidArgument)
	}
}

// TestStatsCosts: Costs averages each kind of pass.
func TestStatsCosts(t *testing.T) {
	t0 := time.Unix(0, 0)
	ev := func(k EventKind, d time.Duration) Event { return Event{Kind: k, Start: t0, End: t0.Add(d)} }
	st := Stats{Events: []Event{ev(Forward, 2), ev(Forward, 4), ev(Backward, 6), ev(Recompute, 2), ev(WeightGrad, 5), ev(ForwardBackward, 9)}}
	c := st.Costs()
	assert.Equal(t, PassCosts{Forward: 3, Backward: 8, Weights: 5, ForwardBackward: 9}, c)
	assert.Equal(t, time.Duration(7), Stats{Events: []Event{ev(ForwardOnly, 7)}}.Costs().Forward)
}
