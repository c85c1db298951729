package fed

import (
	"math"
	"math/rand/v2"
	"slices"
)

// sampleSize is how many of n members a round samples: Flower's
// max(int(n·fraction), min_fit_clients), but never more than n.
func sampleSize(n int, fraction float64, minFit int) int {
	k := max(int(math.Floor(float64(n)*fraction)), minFit)
	return min(k, n)
}

// sample returns, in increasing order, the members round samples: a
// function of seed, round and the members only (a PCG seeded with seed and
// round drives a partial Fisher-Yates shuffle of the sorted members), so a
// run with the same members samples the same clients whatever happened in
// earlier rounds.
func sample(members []int, round, seed uint64, fraction float64, minFit int) []int {
	pool := slices.Clone(members)
	slices.Sort(pool)
	k := sampleSize(len(pool), fraction, minFit)
	if k == len(pool) {
		return pool
	}
	rng := rand.New(rand.NewPCG(seed, round))
	for i := range k {
		j := i + rng.IntN(len(pool)-i)
		pool[i], pool[j] = pool[j], pool[i]
	}
	out := pool[:k]
	slices.Sort(out)
	return out
}
