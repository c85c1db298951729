package data_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/train/data"
)

// oldSampler is internal/mnist's Sampler as it was before this package
// replaced it (drop-last only), kept verbatim as the reference that
// examples/mnist's index sequence must not change against.
type oldSampler struct {
	n, rank, world int
	seed           int64
	shuffle        bool
}

func (s *oldSampler) Len() int { return s.n / s.world }

func (s *oldSampler) Indices(epoch int) []int {
	out := make([]int, s.Len())
	if !s.shuffle {
		for i := range out {
			out[i] = s.rank + i*s.world
		}
		return out
	}
	perm := rand.New(rand.NewPCG(uint64(s.seed), uint64(epoch))).Perm(s.n)
	for i := range out {
		out[i] = perm[s.rank+i*s.world]
	}
	return out
}

func TestDropLastMatchesOldMNISTSampler(t *testing.T) {
	cases := []struct{ n, world int }{{60000, 1}, {60000, 2}, {60000, 3}, {60000, 4}, {10, 3}, {7, 4}, {3, 4}, {0, 2}, {1001, 5}}
	for _, tc := range cases {
		for _, shuffle := range []bool{true, false} {
			for _, seed := range []int64{0, 1, 42, -7} {
				for rank := range tc.world {
					old := &oldSampler{n: tc.n, rank: rank, world: tc.world, seed: seed, shuffle: shuffle}
					s, err := data.New(tc.n, rank, tc.world, data.WithSeed(seed), data.WithShuffle(shuffle), data.WithDropLast(true))
					require.NoError(t, err)
					require.Equal(t, old.Len(), s.Len())
					for _, epoch := range []int{0, 1, 2, 9} {
						require.Equal(t, old.Indices(epoch), s.Indices(epoch),
							"n=%d world=%d rank=%d seed=%d shuffle=%v epoch=%d", tc.n, tc.world, rank, seed, shuffle, epoch)
					}
				}
			}
		}
	}
}

// torchReference computes rank's indices exactly as torch's
// DistributedSampler.__iter__ does, from the same base ordering.
func torchReference(order []int, rank, world int, dropLast bool) []int {
	n := len(order)
	indices := append([]int(nil), order...)
	var numSamples int
	switch {
	case dropLast && n%world != 0:
		numSamples = (n - world + world - 1) / world // ceil((n-world)/world), n >= world
		if n < world {
			numSamples = 0
		}
	default:
		numSamples = (n + world - 1) / world
	}
	total := numSamples * world
	if !dropLast {
		pad := total - n
		if pad <= n {
			indices = append(indices, indices[:pad]...)
		} else if n > 0 {
			var rep []int
			for range (pad + n - 1) / n {
				rep = append(rep, indices...)
			}
			indices = append(indices, rep[:pad]...)
		}
	} else {
		indices = indices[:total]
	}
	var out []int
	for i := rank; i < total; i += world {
		out = append(out, indices[i])
	}
	return out
}

// TestShardsProperty checks, over many data set and world sizes, that the
// shards match torch's rule, are disjoint (drop-last) or repeat only the
// padding, have the same length on every rank, and cover the data set.
func TestShardsProperty(t *testing.T) {
	for n := 0; n <= 40; n++ {
		for world := 1; world <= 9; world++ {
			for _, dropLast := range []bool{true, false} {
				for _, shuffle := range []bool{true, false} {
					name := fmt.Sprintf("n=%d world=%d drop=%v shuffle=%v", n, world, dropLast, shuffle)
					checkShards(t, name, n, world, dropLast, shuffle)
				}
			}
		}
	}
	for _, n := range []int{997, 1024, 60000} {
		for _, world := range []int{2, 3, 7, 16} {
			checkShards(t, fmt.Sprint(n, world), n, world, false, true)
			checkShards(t, fmt.Sprint(n, world), n, world, true, true)
		}
	}
}

func checkShards(t *testing.T, name string, n, world int, dropLast, shuffle bool) {
	t.Helper()
	const seed, epoch = 5, 3
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	if shuffle {
		order = rand.New(rand.NewPCG(seed, epoch)).Perm(n)
	}
	count := map[int]int{}
	per := -1
	for rank := range world {
		s, err := data.New(n, rank, world, data.WithSeed(seed), data.WithShuffle(shuffle), data.WithDropLast(dropLast))
		require.NoError(t, err, name)
		idx := s.Indices(epoch)
		require.Equal(t, s.Len(), len(idx), name)
		if per >= 0 {
			require.Equal(t, per, len(idx), "%s: every rank gets the same count", name)
		}
		per = len(idx)
		want := torchReference(order, rank, world, dropLast)
		if len(want) == 0 {
			want = []int{}
		}
		require.Equal(t, want, idx, "%s rank %d: torch's rule", name, rank)
		for _, i := range idx {
			require.True(t, i >= 0 && i < n, name)
			count[i]++
		}
	}
	if dropLast {
		require.Equal(t, n/world, per, name)
		require.Len(t, count, world*(n/world), "%s: disjoint", name)
		for i, c := range count {
			require.Equal(t, 1, c, "%s: index %d", name, i)
		}
		return
	}
	require.Equal(t, (n+world-1)/world, per, name)
	require.Len(t, count, n, "%s: every index is visited", name)
	extra := 0
	for _, c := range count {
		extra += c - 1
	}
	require.Equal(t, per*world-n, extra, "%s: only the padding repeats", name)
}

func TestEpochsAndSeeds(t *testing.T) {
	s, err := data.New(100, 1, 2, data.WithSeed(7))
	require.NoError(t, err)
	assert.NotEqual(t, s.Indices(0), s.Indices(1), "reshuffled per epoch")
	assert.Equal(t, s.Indices(0), s.Indices(0), "deterministic")
	other, _ := data.New(100, 1, 2, data.WithSeed(8))
	assert.NotEqual(t, s.Indices(0), other.Indices(0), "the seed matters")
	plain, _ := data.New(100, 1, 2, data.WithShuffle(false))
	assert.Equal(t, plain.Indices(0), plain.Indices(5))
	assert.Equal(t, []int{1, 3, 5}, plain.Indices(0)[:3])
	assert.Equal(t, 100, s.N())
	assert.Equal(t, 1, s.Rank())
	assert.Equal(t, 2, s.World())
}

func TestInvalid(t *testing.T) {
	for _, a := range [][3]int{{-1, 0, 1}, {10, 0, 0}, {10, 2, 2}, {10, -1, 2}} {
		_, err := data.New(a[0], a[1], a[2])
		assert.ErrorIs(t, err, data.ErrInvalidArgument, "%v", a)
	}
	_, err := data.New(10, 0, 1, nil)
	assert.ErrorIs(t, err, data.ErrInvalidArgument)
	s, _ := data.New(10, 0, 2)
	assert.ErrorIs(t, s.Seek(0, 6), data.ErrInvalidArgument)
	assert.ErrorIs(t, s.Seek(0, -1), data.ErrInvalidArgument)
	require.NoError(t, s.Seek(4, 5))
	assert.Empty(t, s.Next(3))
}

// TestResumeVisitsExactlyTheRest interrupts a run of several epochs at
// seeded random points (mid-batch, at epoch ends, at the very start),
// restores the saved position into a fresh sampler (of another rank, as
// rank 0's checkpoint restores every rank) and checks that the two halves
// together are exactly the uninterrupted sequence.
func TestResumeVisitsExactlyTheRest(t *testing.T) {
	const epochs, batch = 3, 4
	run := func(s *data.DistributedSampler, stopAfter int) (visited []int, saved []byte) {
		steps := 0
		for epoch := s.Epoch(); epoch < epochs; epoch++ {
			s.SetEpoch(epoch)
			for {
				if steps == stopAfter {
					b, err := s.MarshalBinary()
					require.NoError(t, err)
					return visited, b
				}
				idx := s.Next(batch)
				if len(idx) == 0 {
					break
				}
				visited = append(visited, idx...)
				steps++
			}
		}
		return visited, nil
	}
	r := rand.New(rand.NewPCG(1, 1))
	for _, n := range []int{0, 1, 7, 23, 64, 101} {
		for _, world := range []int{1, 2, 3} {
			for _, dropLast := range []bool{true, false} {
				opts := []data.Option{data.WithSeed(99), data.WithDropLast(dropLast)}
				for rank := range world {
					full, _ := data.New(n, rank, world, opts...)
					want, _ := run(full, -1)
					totalSteps := epochs * ((full.Len() + batch - 1) / batch)
					for range 8 {
						stop := r.IntN(totalSteps + 1)
						a, _ := data.New(n, (rank+1)%world, world, opts...) // another rank saved it
						_, saved := run(a, stop)
						b, _ := data.New(n, rank, world, opts...)
						first, _ := run(b, stop)
						if saved != nil {
							c, _ := data.New(n, rank, world, opts...)
							require.NoError(t, c.UnmarshalBinary(saved))
							rest, _ := run(c, -1)
							first = append(first, rest...)
						}
						if len(want) == 0 {
							require.Empty(t, first)
							continue
						}
						require.Equal(t, want, first, "n=%d world=%d rank=%d drop=%v stop=%d", n, world, rank, dropLast, stop)
					}
				}
			}
		}
	}
}

func TestStateErrors(t *testing.T) {
	s, _ := data.New(50, 1, 2, data.WithSeed(3))
	s.SetEpoch(2)
	s.Next(7)
	b, err := s.MarshalBinary()
	require.NoError(t, err)
	require.Len(t, b, 45)

	// Into a zero sampler: everything is restored, rank included.
	var z data.DistributedSampler
	require.NoError(t, z.UnmarshalBinary(b))
	assert.Equal(t, 1, z.Rank())
	e, i := z.Pos()
	assert.Equal(t, [2]int{2, 7}, [2]int{e, i})
	assert.Equal(t, s.Next(100), z.Next(100))

	for name, opts := range map[string][]data.Option{
		"seed":      {data.WithSeed(4)},
		"shuffle":   {data.WithSeed(3), data.WithShuffle(false)},
		"drop-last": {data.WithSeed(3), data.WithDropLast(true)},
	} {
		o, _ := data.New(50, 0, 2, opts...)
		assert.ErrorIs(t, o.UnmarshalBinary(b), data.ErrMismatch, name)
		assert.Equal(t, 0, o.Epoch(), "%s: unchanged on error", name)
	}
	o, _ := data.New(51, 0, 2, data.WithSeed(3))
	assert.ErrorIs(t, o.UnmarshalBinary(b), data.ErrMismatch, "n")
	o, _ = data.New(50, 0, 5, data.WithSeed(3))
	assert.ErrorIs(t, o.UnmarshalBinary(b), data.ErrMismatch, "world")

	good, _ := data.New(50, 0, 2, data.WithSeed(3))
	for name, bad := range map[string][]byte{
		"empty":    nil,
		"short":    b[:44],
		"long":     append(append([]byte(nil), b...), 0),
		"magic":    append([]byte{'X'}, b[1:]...),
		"version":  append(append([]byte(nil), b[:3]...), append([]byte{2}, b[4:]...)...),
		"position": withByte(b, 37, 26), // next 26 > Len 25
		"rank":     withByte(b, 16, 2),
		"flags":    withByte(b, 28, 4),
	} {
		assert.ErrorIs(t, good.UnmarshalBinary(bad), data.ErrBadState, name)
	}
}

func withByte(b []byte, i int, v byte) []byte {
	c := append([]byte(nil), b...)
	c[i] = v
	return c
}

// FuzzUnmarshal: arbitrary bytes never panic, a state that restores
// marshals back to the same bytes, and Next stays within the epoch.
func FuzzUnmarshal(f *testing.F) {
	s, _ := data.New(50, 1, 2, data.WithSeed(3))
	s.Next(5)
	b, _ := s.MarshalBinary()
	f.Add(b)
	r, _ := data.New(50, 0, 3, data.WithSeed(3))
	_, _ = r.Resume(b)
	b2, _ := r.MarshalBinary()
	f.Add(b2)
	f.Fuzz(func(t *testing.T, b []byte) {
		var z data.DistributedSampler
		if err := z.UnmarshalBinary(b); err != nil {
			return
		}
		again, _ := z.MarshalBinary()
		if string(again) != string(b) {
			t.Fatalf("round trip changed the state")
		}
		if z.N() <= 1<<16 { // a restored n is trusted: Next allocates n ints
			got := z.Next(3)
			if len(got) > 3 || z.Remaining() < 0 {
				t.Fatalf("Next(3) gave %d indices, %d remaining", len(got), z.Remaining())
			}
		}
	})
}

// TestResumeOtherWorld: a job of 2 ranks that stops mid-epoch and resumes on
// 3 (and then on 4) visits every index of the epoch: the entries the first
// job visited and those the next ones visit are the epoch's ordering, each
// once, padding aside.
func TestResumeOtherWorld(t *testing.T) {
	for _, n := range []int{60, 61, 67} {
		for _, dropLast := range []bool{false, true} {
			for _, shuffle := range []bool{true, false} {
				opts := []data.Option{data.WithSeed(9), data.WithDropLast(dropLast), data.WithShuffle(shuffle)}
				name := fmt.Sprintf("n=%d drop-last=%t shuffle=%t", n, dropLast, shuffle)
				seen := make(map[int]int)
				// Job 1: 2 ranks, 4 steps of 3 in epoch 1.
				var state []byte
				for r := range 2 {
					s, _ := data.New(n, r, 2, opts...)
					s.SetEpoch(1)
					for range 4 {
						for _, i := range s.Next(3) {
							seen[i]++
						}
					}
					state, _ = s.MarshalBinary()
				}
				// Job 2: 3 ranks resume, 2 steps of 3.
				for r := range 3 {
					s, _ := data.New(n, r, 3, opts...)
					w, err := s.Resume(state)
					require.NoError(t, err, name)
					require.Equal(t, 2, w, name)
					s.SetEpoch(1) // a training loop's call keeps the position
					for range 2 {
						for _, i := range s.Next(3) {
							seen[i]++
						}
					}
					if r == 2 {
						state, _ = s.MarshalBinary()
					}
				}
				// Job 3: 4 ranks finish the epoch.
				total := 0
				for r := range 4 {
					s, _ := data.New(n, r, 4, opts...)
					w, err := s.Resume(state)
					require.NoError(t, err, name)
					require.Equal(t, 3, w, name)
					e, next := s.Pos()
					require.Equal(t, [2]int{1, 0}, [2]int{e, next}, name)
					rest := s.Next(n)
					total += len(rest)
					for _, i := range rest {
						seen[i]++
					}
					assert.Zero(t, s.Remaining(), name)
					// The next epoch is a whole one of 4 ranks.
					s.SetEpoch(2)
					whole, _ := data.New(n, r, 4, opts...)
					assert.Equal(t, whole.Indices(2), s.Next(n), name)
				}
				visited := 12 + 18 + total
				missing := 0
				for i := range n {
					if seen[i] == 0 {
						missing++
					}
				}
				if dropLast {
					assert.Less(t, missing, 4, "%s: at most what the last world drops", name)
					for i, c := range seen {
						assert.Equal(t, 1, c, "%s: index %d visited %d times", name, i, c)
					}
				} else {
					assert.Zero(t, missing, name)
					assert.Less(t, visited-n, 4, "%s: padding of at most world-1", name)
				}
			}
		}
	}
}

// TestResumeSameWorld: Resume from the same world size is UnmarshalBinary,
// and a resharded position survives a save and restore.
func TestResumeSameWorld(t *testing.T) {
	s, _ := data.New(50, 1, 2, data.WithSeed(3))
	s.SetEpoch(2)
	s.Next(7)
	b, _ := s.MarshalBinary()
	o, _ := data.New(50, 0, 2, data.WithSeed(3))
	w, err := o.Resume(b)
	require.NoError(t, err)
	assert.Equal(t, 2, w)
	u, _ := data.New(50, 0, 2, data.WithSeed(3))
	require.NoError(t, u.UnmarshalBinary(b))
	assert.Equal(t, u.Next(100), o.Next(100))

	r, _ := data.New(50, 2, 3, data.WithSeed(3))
	_, err = r.Resume(b)
	require.NoError(t, err)
	r.Next(2)
	b2, _ := r.MarshalBinary()
	require.Len(t, b2, 53)
	q, _ := data.New(50, 2, 3, data.WithSeed(3))
	require.NoError(t, q.UnmarshalBinary(b2))
	assert.Equal(t, r.Next(100), q.Next(100))

	bad, _ := data.New(51, 0, 3, data.WithSeed(3))
	_, err = bad.Resume(b)
	assert.ErrorIs(t, err, data.ErrMismatch)
	var z data.DistributedSampler
	_, err = z.Resume(b)
	assert.ErrorIs(t, err, data.ErrInvalidArgument)
}
