package coll

import (
	"math/bits"
	"time"
)

// pairChoice chooses, for each size of all-reduce between 2 members on
// shared memory (allReducePair), whether its segments are sent streamed —
// written into shared memory past the sender's caches (StreamExchange) —
// or plainly. Which is faster depends on where the two processes run, and
// can change while they do: where their cores share a cache, a plain copy
// hands the lines over through it and streaming would send them to memory
// and back; where they share none (two dies of one chip, or vCPUs that a
// hypervisor places so), a plain copy into the ring first fetches each of
// its lines from the other core's cache, and streaming avoided that. On
// one 2-vCPU VM whose vCPUs moved between the two cases minute by minute,
// streaming took the 1 MiB all-reduce from 5.0 to 11.1 GB/s of bus
// bandwidth in one case and from 14.6 down to 9.1 in the other.
//
// So it measures both. Sizes fall in classes of powers of two; in each,
// the first four calls alternate, plain first, and later calls take
// whichever has the lower estimated time per byte, but every
// probeEvery-th, which takes the other to follow a change. Both members
// make the same calls in the same order, so they probe together. A
// pairChoice is used by one collective at a time (its Net's).
type pairChoice struct {
	cost  [pairClasses][2]float64 // smoothed ns per byte, plain and streamed; 0 until measured
	calls [pairClasses]uint32
}

const (
	// pairClasses is the number of size classes: powers of two from 16 KiB
	// (class 0), the larger all in the last.
	pairClasses = 16
	// probeEvery is how often a class tries the way it does not choose.
	probeEvery = 32
)

// class returns the size class of an n-byte all-reduce.
func pairClass(n int) int {
	return min(max(bits.Len(uint(n))-15, 0), pairClasses-1)
}

// pick returns n bytes' class and whether to stream them.
func (p *pairChoice) pick(n int) (class int, stream bool) {
	c := pairClass(n)
	k := p.calls[c]
	p.calls[c]++
	if k < 4 {
		return c, k%2 == 1
	}
	best := p.cost[c][1] < p.cost[c][0]
	if k%probeEvery == 0 {
		return c, !best
	}
	return c, best
}

// record adds the time d an n-byte all-reduce of class c took, streamed or
// not. The estimate falls to a faster time at once and rises a quarter of
// the way to a slower one, counted at most twice the estimate: the first
// calls (which fault pages in) and a call that waited for something else
// (a descheduled process) move it little, while a lasting slowdown of the
// way chosen, measured at every call, turns the choice within a few, and
// a probe that finds the other way faster turns it at once.
func (p *pairChoice) record(c int, stream bool, d time.Duration, n int) {
	if n <= 0 {
		return
	}
	i := 0
	if stream {
		i = 1
	}
	v := float64(d.Nanoseconds()) / float64(n)
	switch old := p.cost[c][i]; {
	case old == 0 || v < old:
		p.cost[c][i] = v
	default:
		p.cost[c][i] = old + (min(v, 2*old)-old)/4
	}
}
