package pipeline

// Training schedules as data: each rank's ordered list of passes, made by
// pure functions of (schedule, stages p, chunks per rank v, rank d,
// micro-batches m), and a simulator that runs every rank's list against
// pass costs — to check that a schedule cannot deadlock, to size each
// chunk's graphs, to build the zero-bubble schedule, and to predict the
// bubble a schedule leaves (bench/pipeline compares it with what a stage
// measures).

import (
	"fmt"
	"slices"
	"time"
)

// passKind is what a pass computes.
type passKind uint8

const (
	// passF: the forward pass of a virtual stage other than the last.
	passF passKind = iota
	// passB: the backward pass (input and weight gradients), or with the
	// zero-bubble schedule the input-gradient pass only.
	passB
	// passW: the weight-gradient pass (zero-bubble schedule only).
	passW
	// passFB: the last virtual stage's forward, loss and backward (its
	// input-gradient pass only with the zero-bubble schedule).
	passFB
)

func (k passKind) String() string {
	switch k {
	case passF:
		return "F"
	case passB:
		return "B"
	case passW:
		return "W"
	case passFB:
		return "FB"
	}
	return fmt.Sprintf("passKind(%d)", uint8(k))
}

// pass is one step of a rank's training schedule: a pass of local chunk
// chunk (virtual stage chunk*p + rank) over micro-batch mb.
type pass struct {
	kind  passKind
	chunk int
	mb    int
}

func (s pass) String() string { return fmt.Sprintf("%v%d/%d", s.kind, s.mb, s.chunk) }

// layout is the shape of a pipeline: p ranks holding v chunks each (virtual
// stage k*p + d is chunk k of rank d, as in Megatron-LM), m micro-batches.
type layout struct{ p, v, m int }

// stages is the number of virtual stages.
func (l layout) stages() int { return l.p * l.v }

// vstage returns the virtual stage of chunk k on rank d.
func (l layout) vstage(d, k int) int { return k*l.p + d }

// at returns the rank and chunk of virtual stage vs.
func (l layout) at(vs int) (d, k int) { return vs % l.p, vs / l.p }

// plan returns rank d's training passes under schedule s. With split (the
// zero-bubble schedule) backward passes compute input gradients only and
// each micro-batch has a later weight-gradient pass.
func plan(s Schedule, l layout, d int) ([]pass, error) {
	switch s {
	case GPipe:
		return planGPipe(l, d), nil
	case OneFOneB:
		return plan1F1B(l, d), nil
	case Interleaved:
		return planInterleaved(l, d)
	case ZeroBubble:
		plans, err := planZB(l)
		if err != nil {
			return nil, err
		}
		return plans[d], nil
	}
	return nil, fmt.Errorf("pipeline: %w: schedule %v", ErrInvalidArgument, s)
}

// plans returns every rank's passes.
func plans(s Schedule, l layout) ([][]pass, error) {
	if s == ZeroBubble {
		return planZB(l)
	}
	out := make([][]pass, l.p)
	for d := range l.p {
		var err error
		if out[d], err = plan(s, l, d); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// planGPipe: all forwards, then all backwards (v = 1). The last stage runs
// each micro-batch's forward and backward back to back.
func planGPipe(l layout, d int) []pass {
	var ps []pass
	if d == l.p-1 {
		for mb := range l.m {
			ps = append(ps, pass{kind: passFB, mb: mb})
		}
		return ps
	}
	for mb := range l.m {
		ps = append(ps, pass{kind: passF, mb: mb})
	}
	for mb := range l.m {
		ps = append(ps, pass{kind: passB, mb: mb})
	}
	return ps
}

// plan1F1B: p-d-1 warm-up forwards, then one forward and one backward in
// turn, then the remaining backwards (v = 1).
func plan1F1B(l layout, d int) []pass {
	var ps []pass
	if d == l.p-1 {
		return planGPipe(l, d)
	}
	w := min(l.p-d-1, l.m)
	for mb := range w {
		ps = append(ps, pass{kind: passF, mb: mb})
	}
	for mb := w; mb < l.m; mb++ {
		ps = append(ps, pass{kind: passF, mb: mb}, pass{kind: passB, mb: mb - w})
	}
	for mb := l.m - w; mb < l.m; mb++ {
		ps = append(ps, pass{kind: passB, mb: mb})
	}
	return ps
}

// planInterleaved is Megatron-LM's interleaved 1F1B (Narayanan et al.
// 2021): micro-batches enter in groups of p, each group going through
// chunk 0 of every rank, then chunk 1, and so on; rank d runs
// 2(p-d-1) + (v-1)p warm-up forwards, then one forward and one backward in
// turn, then the remaining backwards. m must be a multiple of p. The last
// virtual stage's forward is its forward and backward (passFB), and its
// backward is dropped.
func planInterleaved(l layout, d int) ([]pass, error) {
	if l.m%l.p != 0 {
		return nil, fmt.Errorf("pipeline: %w: the interleaved schedule needs a number of micro-batches divisible by the %d stages, got %d",
			ErrInvalidArgument, l.p, l.m)
	}
	total := l.m * l.v
	warm := min((l.p-d-1)*2+(l.v-1)*l.p, total)
	mbOf := func(k int) int { return k/(l.p*l.v)*l.p + k%l.p }
	fwd := func(k int) pass { return pass{kind: passF, chunk: k / l.p % l.v, mb: mbOf(k)} }
	bwd := func(k int) pass { return pass{kind: passB, chunk: l.v - 1 - k/l.p%l.v, mb: mbOf(k)} }
	last := func(ps pass) bool { return l.vstage(d, ps.chunk) == l.stages()-1 }
	var ps []pass
	add := func(x pass) {
		if last(x) {
			if x.kind == passB {
				return
			}
			x.kind = passFB
		}
		ps = append(ps, x)
	}
	for k := range warm {
		add(fwd(k))
	}
	for i := range total - warm {
		add(fwd(warm + i))
		add(bwd(i))
	}
	for k := total - warm; k < total; k++ {
		add(bwd(k))
	}
	return ps, nil
}

// planZB is the zero-bubble schedule ZB-H1 (Qi et al. 2023) for v = 1:
// the backward pass is split into an input-gradient pass (B), which the
// previous stage waits for, and a weight-gradient pass (W), which nobody
// waits for. Stage d of p runs p-d-1 warm-up forwards (as 1F1B), then d
// rounds of a forward and a B whose W it postpones, then a forward, a B
// and a W in turn, then the remaining Bs with their Ws, and last the d
// postponed Ws: the Ws fill the time a stage would wait at the end of the
// step, and the later stages, whose Bs the earlier ones wait for, run
// their Bs sooner. The last stage's forward and B are one pass (passFB).
// Stage d holds up to p-d micro-batches from forward to B, as in 1F1B,
// and the d whose Ws it postponed: p graphs' worth of activations at most.
func planZB(l layout) ([][]pass, error) {
	if l.v != 1 {
		return nil, fmt.Errorf("pipeline: %w: the zero-bubble schedule runs one stage per rank", ErrInvalidArgument)
	}
	out := make([][]pass, l.p)
	for d := range l.p {
		m, last := l.m, d == l.p-1
		var ps []pass
		f, b, w := 0, 0, 0
		fwd := func() {
			k := passF
			if last {
				k = passFB
				b++
			}
			ps = append(ps, pass{kind: k, mb: f})
			f++
		}
		bwd := func() {
			if !last {
				ps = append(ps, pass{kind: passB, mb: b})
				b++
			}
		}
		wgt := func() {
			ps = append(ps, pass{kind: passW, mb: w})
			w++
		}
		for range l.p - d - 1 {
			if f < m {
				fwd()
			}
		}
		for range d {
			if f < m {
				fwd()
				bwd()
			}
		}
		for f < m {
			fwd()
			bwd()
			wgt()
		}
		for b < m {
			bwd()
			wgt()
		}
		for w < m {
			wgt()
		}
		out[d] = ps
	}
	return out, nil
}

// costs are the times of one pass of each kind on one virtual stage (any
// unit), for the simulator. With split false, B includes the weight
// gradients and W is unused.
type costs struct {
	F, B, W float64
	// FB is the last virtual stage's pass; 0 means F + B.
	FB float64
	// Comm is the time a message takes between ranks.
	Comm float64
}

// PassCosts are the durations of one pass of each kind on one (virtual)
// stage, for Predict. Stats.Costs measures them.
type PassCosts struct {
	// Forward is a forward pass.
	Forward time.Duration
	// Backward is a backward pass: with the ZeroBubble schedule its
	// input-gradient part, otherwise with the weight gradients.
	Backward time.Duration
	// Weights is a weight-gradient pass (ZeroBubble only).
	Weights time.Duration
	// ForwardBackward is the last stage's forward, loss and backward; 0
	// means Forward + Backward.
	ForwardBackward time.Duration
	// Message is the time an activation or gradient takes from one rank to
	// the next.
	Message time.Duration
}

// Prediction is what Predict expects of one training step.
type Prediction struct {
	// Step is the time from the first pass's start to the last one's end.
	Step time.Duration
	// Bubble is the mean over ranks of the fraction of Step a rank waits.
	Bubble float64
}

// Predict simulates one training step of schedule s on the given number
// of stages (ranks), chunks per rank (1 unless Interleaved) and
// micro-batches, with passes and messages taking the times c gives, and
// returns the step's duration and bubble. Comparing it with a stage's
// Stats shows how much of the waiting the schedule explains; calling it
// for several numbers of micro-batches, with the costs measured at each,
// picks one (as bench/pipeline does).
//
// Experimental: the model ignores everything but the passes' order and
// durations.
func Predict(s Schedule, stages, chunks, micro int, c PassCosts) (Prediction, error) {
	if stages < 1 || chunks < 1 || micro < 1 || (s != Interleaved && chunks != 1) {
		return Prediction{}, fmt.Errorf("pipeline: %w: Predict(%v, %d stages, %d chunks, %d micro-batches)", ErrInvalidArgument, s, stages, chunks, micro)
	}
	l := layout{p: stages, v: chunks, m: micro}
	ps, err := plans(s, l)
	if err != nil {
		return Prediction{}, err
	}
	r, err := simulate(l, ps, costs{F: c.Forward.Seconds(), B: c.Backward.Seconds(), W: c.Weights.Seconds(),
		FB: c.ForwardBackward.Seconds(), Comm: c.Message.Seconds()})
	if err != nil {
		return Prediction{}, err
	}
	return Prediction{Step: time.Duration(r.Makespan * 1e9), Bubble: r.Bubble()}, nil
}

// sim is the result of a simulation.
type sim struct {
	Makespan float64
	Busy     []float64 // per rank
}

// Bubble returns the mean over ranks of the idle fraction of the makespan.
func (s sim) Bubble() float64 {
	if s.Makespan <= 0 {
		return 0
	}
	var idle float64
	for _, b := range s.Busy {
		idle += (s.Makespan - b) / s.Makespan
	}
	return idle / float64(len(s.Busy))
}

// simulate runs every rank's passes in order against c: a pass starts when
// its rank is free and its input has arrived (a forward's activation, a
// backward's gradient, a weight pass's own backward). It fails if the
// ranks deadlock — a pass waits for one that can never run.
func simulate(l layout, ps [][]pass, c costs) (sim, error) {
	type key struct {
		vs, mb int
		kind   passKind
	}
	done := map[key]float64{} // when a pass ended
	pos := make([]int, l.p)
	free := make([]float64, l.p)
	busy := make([]float64, l.p)
	last := l.stages() - 1
	for {
		progressed, finished := false, true
		for d := range l.p {
			for pos[d] < len(ps[d]) {
				x := ps[d][pos[d]]
				vs := l.vstage(d, x.chunk)
				ready, ok := 0.0, true
				need := func(k key, delay float64) {
					t, have := done[k]
					if !have {
						ok = false
						return
					}
					ready = max(ready, t+delay)
				}
				cost := 0.0
				switch x.kind {
				case passF, passFB:
					if vs > 0 {
						pd, _ := l.at(vs - 1)
						delay := c.Comm
						if pd == d {
							delay = 0
						}
						prev := passF
						if vs-1 == last {
							prev = passFB
						}
						need(key{vs - 1, x.mb, prev}, delay)
					}
					cost = c.F
					if x.kind == passFB {
						cost = c.F + c.B
						if c.FB > 0 {
							cost = c.FB
						}
					}
				case passB:
					nd, _ := l.at(vs + 1)
					delay := c.Comm
					if nd == d {
						delay = 0
					}
					next := passB
					if vs+1 == last {
						next = passFB
					}
					need(key{vs + 1, x.mb, next}, delay)
					need(key{vs, x.mb, passF}, 0)
					cost = c.B
				case passW:
					k := passB
					if vs == last {
						k = passFB
					}
					need(key{vs, x.mb, k}, 0)
					cost = c.W
				}
				if !ok {
					break
				}
				start := max(ready, free[d])
				free[d] = start + cost
				busy[d] += cost
				done[key{vs, x.mb, x.kind}] = free[d]
				pos[d]++
				progressed = true
			}
			if pos[d] < len(ps[d]) {
				finished = false
			}
		}
		if finished {
			break
		}
		if !progressed {
			var stuck []string
			for d := range l.p {
				if pos[d] < len(ps[d]) {
					stuck = append(stuck, fmt.Sprintf("rank %d at %v", d, ps[d][pos[d]]))
				}
			}
			return sim{}, fmt.Errorf("pipeline: schedule deadlocks: %v", stuck)
		}
	}
	return sim{Makespan: slices.Max(free), Busy: busy}, nil
}

// slotsNeeded returns, for each chunk of rank d, the most micro-batches the
// rank holds at once under ps: from the pass that takes a graph (a forward,
// or the backward that recomputes it) to the one that frees it (the
// backward, or the weight pass with split).
func slotsNeeded(ps []pass, v int, split, recompute bool) []int {
	held := make([]int, v)
	most := make([]int, v)
	take := func(k int) {
		held[k]++
		most[k] = max(most[k], held[k])
	}
	for _, x := range ps {
		switch x.kind {
		case passF:
			take(x.chunk)
			if recompute {
				held[x.chunk]-- // the graph is free again once the input is saved
			}
		case passFB:
			take(x.chunk)
			if !split {
				held[x.chunk]--
			}
		case passB:
			if recompute {
				take(x.chunk)
			}
			if !split {
				held[x.chunk]--
			}
		case passW:
			held[x.chunk]--
		}
	}
	for k := range most {
		most[k] = max(most[k], 1)
	}
	return most
}
