package dist

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
)

// Subgroups over the in-process transport (and, where noted, TCP): what
// NewGroup, Split and NewMesh make, collectives on disjoint and
// overlapping groups at once, failures inside a subgroup, Close.

// subgroups runs f on every rank and returns the groups it made.
func subgroups(t *testing.T, c *cluster, f func(r int, g *ProcessGroup) (*ProcessGroup, error)) []*ProcessGroup {
	t.Helper()
	subs := make([]*ProcessGroup, len(c.gs))
	requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
		s, err := f(r, g)
		subs[r] = s
		return err
	}))
	return subs
}

func TestNewGroup(t *testing.T) {
	c := newCluster(t, 5)
	subs := subgroups(t, c, func(r int, g *ProcessGroup) (*ProcessGroup, error) {
		return g.NewGroup(bg, []int{4, 1, 3})
	})
	for r, s := range subs {
		if r != 1 && r != 3 && r != 4 {
			assert.Nil(t, s, "rank %d is not a member", r)
			continue
		}
		require.NotNil(t, s, "rank %d", r)
		assert.Equal(t, 3, s.WorldSize())
		assert.Equal(t, slices.Index([]int{4, 1, 3}, r), s.Rank(), "member order is the order of the list")
		assert.Equal(t, []int{4, 1, 3}, s.Ranks())
		assert.Equal(t, c.gs[r].LocalRank(), s.LocalRank())
	}
	// Its collectives see only the members, ordered as listed.
	requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
		s := subs[r]
		if s == nil {
			return nil
		}
		x := []float64{float64(r)}
		if err := s.AllReduce(bg, F64(x), Sum); err != nil {
			return err
		}
		assert.Equal(t, []float64{8}, x)
		all := make([]float64, 3)
		if err := s.AllGather(bg, F64(all), F64([]float64{float64(r)})); err != nil {
			return err
		}
		assert.Equal(t, []float64{4, 1, 3}, all)
		return nil
	}))
	// The parent goes on, with its own sequence of collectives.
	requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
		x := []float32{1}
		if err := g.AllReduce(bg, F32(x), Sum); err != nil {
			return err
		}
		assert.Equal(t, []float32{5}, x)
		return nil
	}))
}

func TestSplit(t *testing.T) {
	c := newCluster(t, 7)
	// Colors r%3, rank 6 in none; keys reverse the order within a color.
	subs := subgroups(t, c, func(r int, g *ProcessGroup) (*ProcessGroup, error) {
		color := r % 3
		if r == 6 {
			color = -1
		}
		return g.Split(bg, color, -r)
	})
	want := map[int][]int{0: {3, 0}, 1: {4, 1}, 2: {5, 2}}
	ids := map[uint32]bool{}
	for r, s := range subs {
		if r == 6 {
			assert.Nil(t, s)
			continue
		}
		require.NotNil(t, s)
		assert.Equal(t, want[r%3], s.Ranks(), "rank %d", r)
		assert.Equal(t, r, s.Ranks()[s.Rank()])
		ids[s.id] = true
	}
	assert.Len(t, ids, 3, "one id per color")
	requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
		if subs[r] == nil {
			return nil
		}
		x := []float32{float32(r)}
		if err := subs[r].Broadcast(bg, F32(x), 0); err != nil {
			return err
		}
		assert.Equal(t, float32(want[r%3][0]), x[0], "rank %d", r)
		return nil
	}))
	// A subgroup of a subgroup.
	nested := subgroups(t, c, func(r int, g *ProcessGroup) (*ProcessGroup, error) {
		if subs[r] == nil || r%3 != 0 {
			return nil, nil
		}
		return subs[r].NewGroup(bg, []int{1})
	})
	require.NotNil(t, nested[0])
	assert.Nil(t, nested[3])
	assert.Equal(t, []int{0}, nested[0].Ranks())
	require.NoError(t, nested[0].Barrier(bg))
}

// TestDisjointAtOnce: two disjoint pairs all-reduce different vectors at
// the same time, 1000 times, over the in-process transport and TCP; every
// result is exact.
func TestDisjointAtOnce(t *testing.T) {
	for _, tr := range []string{"local", "tcp"} {
		t.Run(tr, func(t *testing.T) {
			var c *cluster
			if tr == "tcp" {
				c, _ = newTCPCluster(t, 4)
			} else {
				c = newCluster(t, 4)
			}
			pairs := subgroups(t, c, func(r int, g *ProcessGroup) (*ProcessGroup, error) {
				return g.Split(bg, r/2, r)
			})
			iters := 1000
			if testing.Short() {
				iters = 200
			}
			requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
				p := pairs[r]
				n := 1 + 1000*(r/2) // the pairs use different lengths
				x := make([]float32, n)
				for it := range iters {
					for i := range x {
						x[i] = float32(r + it + i%7)
					}
					if err := p.AllReduce(bg, F32(x), Sum); err != nil {
						return err
					}
					base := 2 * (r / 2) // the pair's lower rank
					for i := range x {
						if want := float32(2*(it+i%7) + 2*base + 1); x[i] != want {
							return fmt.Errorf("rank %d iteration %d: [%d] = %v, want %v", r, it, i, x[i], want)
						}
					}
				}
				return nil
			}))
		})
	}
}

// TestMeshAtOnce: on a 2x2 mesh, each rank drives its "dp" and "pp"
// groups from two goroutines at once, and then in alternation from one.
func TestMeshAtOnce(t *testing.T) {
	c := newCluster(t, 4)
	meshes := make([]*Mesh, 4)
	requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
		m, err := NewMesh(bg, g, Dim{"dp", 2}, Dim{"pp", 2})
		meshes[r] = m
		return err
	}))
	for r, m := range meshes {
		assert.Equal(t, []int{r / 2, r % 2}, m.Coord())
		assert.Equal(t, []int{r % 2, r%2 + 2}, m.Group("dp").Ranks(), "rank %d", r)
		assert.Equal(t, []int{2 * (r / 2), 2*(r/2) + 1}, m.Group("pp").Ranks(), "rank %d", r)
		assert.Equal(t, r/2, m.Group("dp").Rank())
		assert.Nil(t, m.Group("tp"))
		assert.Equal(t, "dp", m.Group("dp").Name())
		assert.Equal(t, fmt.Sprintf("mesh dp=2 pp=2, rank %d at (%d, %d)", r, r/2, r%2), m.String())
	}
	sum := func(g *ProcessGroup, r, it int) error {
		x := []float64{float64(r*100 + it)}
		if err := g.AllReduce(bg, F64(x), Sum); err != nil {
			return err
		}
		want := 0.0
		for _, q := range g.Ranks() {
			want += float64(q*100 + it)
		}
		if x[0] != want {
			return fmt.Errorf("%s: rank %d iteration %d: %v, want %v", g.Name(), r, it, x[0], want)
		}
		return nil
	}
	requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
		m := meshes[r]
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for k, name := range []string{"dp", "pp"} {
			wg.Go(func() {
				for it := range 200 {
					if err := sum(m.Group(name), r, it); err != nil {
						errs[k] = err
						return
					}
				}
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
		for it := range 100 {
			if err := sum(m.Group([]string{"dp", "pp"}[it%2]), r, it); err != nil {
				return err
			}
		}
		return m.Close()
	}))
	// The parent is still open.
	requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error { return g.Barrier(bg) }))
}

// ExampleNewMesh-style check: the hierarchical all-reduce written with a
// mesh (reduce within a host, all-reduce across hosts, broadcast within)
// gives the flat all-reduce's result.
func TestMeshHierarchicalAllReduce(t *testing.T) {
	c := newCluster(t, 6)
	requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
		m, err := NewMesh(bg, g, Dim{"host", 3}, Dim{"local", 2})
		if err != nil {
			return err
		}
		x := make([]float32, 33)
		flat := make([]float32, 33)
		for i := range x {
			x[i] = float32(exactInput(Sum, r, i))
		}
		copy(flat, x)
		local, hosts := m.Group("local"), m.Group("host")
		if err := local.Reduce(bg, F32(x), Sum, 0); err != nil {
			return err
		}
		if local.Rank() == 0 {
			if err := hosts.AllReduce(bg, F32(x), Sum); err != nil {
				return err
			}
		}
		if err := local.Broadcast(bg, F32(x), 0); err != nil {
			return err
		}
		if err := g.AllReduce(bg, F32(flat), Sum); err != nil {
			return err
		}
		assert.Equal(t, flat, x, "rank %d", r)
		return m.Close()
	}))
}

func TestNewGroupRefuses(t *testing.T) {
	c := newCluster(t, 3)
	for _, ranks := range [][]int{nil, {0, 0}, {3}, {-1, 1}} {
		errs := c.run(func(r int, g *ProcessGroup) error {
			_, err := g.NewGroup(bg, ranks)
			return err
		})
		for r, err := range errs {
			require.ErrorIs(t, err, ErrInvalidArgument, "ranks %v: rank %d", ranks, r)
		}
	}
	// One rank passes another list: every rank is told.
	errs := c.run(func(r int, g *ProcessGroup) error {
		ranks := []int{0, 1}
		if r == 2 {
			ranks = []int{0, 2}
		}
		_, err := g.NewGroup(bg, ranks)
		return err
	})
	for r, err := range errs {
		require.ErrorIs(t, err, ErrInvalidArgument, "rank %d", r)
	}
	// Mesh dimensions that do not fit, or differ between ranks.
	for _, dims := range [][]Dim{{{"a", 2}}, {{"a", 3}, {"a", 1}}, {{"", 3}}, {{"a", 0}}, nil} {
		errs = c.run(func(r int, g *ProcessGroup) error {
			_, err := NewMesh(bg, g, dims...)
			return err
		})
		for r, err := range errs {
			require.ErrorIs(t, err, ErrInvalidArgument, "dims %v: rank %d", dims, r)
		}
	}
	errs = c.run(func(r int, g *ProcessGroup) error {
		dims := []Dim{{"a", 3}}
		if r == 1 {
			dims = []Dim{{"b", 3}}
		}
		_, err := NewMesh(bg, g, dims...)
		return err
	})
	for r, err := range errs {
		require.ErrorIs(t, err, ErrInvalidArgument, "rank %d", r)
	}
	// None of it failed the job.
	requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error { return g.Barrier(bg) }))
}

// TestSubgroupDesync: members of a subgroup that call different
// collectives get a *DesyncError naming each other by job rank, and the
// whole job fails, the ranks outside the subgroup included.
func TestSubgroupDesync(t *testing.T) {
	c := newCluster(t, 4)
	subs := subgroups(t, c, func(r int, g *ProcessGroup) (*ProcessGroup, error) {
		return g.NewGroup(bg, []int{1, 3})
	})
	errs := c.run(func(r int, g *ProcessGroup) error {
		switch r {
		case 1:
			return subs[r].AllReduce(bg, F32(make([]float32, 4)), Sum)
		case 3:
			return subs[r].Broadcast(bg, F32(make([]float32, 4)), 0)
		}
		<-g.Failed()
		return g.Err()
	})
	for _, r := range []int{1, 3} {
		var de *DesyncError
		require.ErrorAs(t, errs[r], &de, "rank %d", r)
		assert.Equal(t, r, de.Rank)
		assert.Equal(t, 4-r, de.Peer, "rank %d names the other member by its job rank", r)
		var me *MemberError
		require.ErrorAs(t, errs[r], &me, "rank %d", r)
		assert.Equal(t, 4-r, me.Rank)
		assert.Equal(t, (4-r)/2, me.Member)
	}
	for _, r := range []int{0, 2} {
		require.ErrorIs(t, errs[r], ErrDesync, "rank %d hears of it", r)
		require.ErrorIs(t, c.gs[r].AllReduce(bg, F32(make([]float32, 1)), Sum), ErrAborted, "rank %d", r)
	}
}

// TestSubgroupKill: a rank dies while only its subgroup is busy: its
// partner's collective fails naming it (by job rank and as a member), and
// the ranks outside the subgroup learn it at once.
func TestSubgroupKill(t *testing.T) {
	ts := make([]*transport.Local, 4)
	c := newCluster(t, 4)
	copy(ts, c.ts)
	subs := subgroups(t, c, func(r int, g *ProcessGroup) (*ProcessGroup, error) {
		return g.Split(bg, r/2, 0)
	})
	errs := c.run(func(r int, g *ProcessGroup) error {
		switch r {
		case 2, 3:
			for it := 0; ; it++ {
				if r == 3 && it == 5 {
					ts[3].Kill() // in the middle of the pair's stream
					return nil
				}
				if err := subs[r].AllReduce(bg, F32(make([]float32, 1<<12)), Sum); err != nil {
					return err
				}
			}
		}
		select {
		case <-g.Failed():
		case <-time.After(10 * time.Second):
			return errors.New("not told in 10 s")
		}
		return g.Err()
	})
	var pe *PeerError
	require.ErrorAs(t, errs[2], &pe)
	assert.Equal(t, 3, pe.Rank)
	require.ErrorIs(t, errs[2], ErrPeerLost)
	var me *MemberError
	require.ErrorAs(t, errs[2], &me)
	assert.Equal(t, MemberError{Group: subs[2].Name(), Member: 1, Rank: 3}, MemberError{Group: me.Group, Member: me.Member, Rank: me.Rank})
	for _, r := range []int{0, 1} {
		require.ErrorAs(t, errs[r], &pe, "rank %d", r)
		assert.Equal(t, 3, pe.Rank, "rank %d", r)
		require.ErrorIs(t, errs[r], ErrPeerLost, "rank %d", r)
	}
}

// TestSubgroupClose: closing a subgroup fails its calls with ErrClosed and
// leaves its parent working; closing the job's group closes its
// subgroups.
func TestSubgroupClose(t *testing.T) {
	c := newCluster(t, 2)
	subs := subgroups(t, c, func(r int, g *ProcessGroup) (*ProcessGroup, error) {
		return g.NewGroup(bg, []int{0, 1})
	})
	// A queued async collective of the closed subgroup fails too.
	w := subs[0].AllReduceAsync(context.Background(), F32(make([]float32, 1)), Sum)
	require.NoError(t, subs[0].Close())
	require.NoError(t, subs[0].Close(), "idempotent")
	require.ErrorIs(t, w.Wait(bg), ErrClosed)
	require.ErrorIs(t, subs[0].AllReduce(bg, F32(make([]float32, 1)), Sum), ErrClosed)
	require.ErrorIs(t, subs[0].Send(bg, 1, 1, nil), ErrClosed)
	require.ErrorIs(t, subs[0].Err(), ErrClosed)
	requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error { return g.Barrier(bg) }))
	require.NoError(t, c.gs[1].Close())
	require.ErrorIs(t, subs[1].Barrier(bg), ErrClosed)
}

// TestSubgroupP2P: a subgroup's point-to-point calls address its members.
func TestSubgroupP2P(t *testing.T) {
	c := newCluster(t, 3)
	subs := subgroups(t, c, func(r int, g *ProcessGroup) (*ProcessGroup, error) {
		return g.NewGroup(bg, []int{2, 0})
	})
	requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
		switch r {
		case 2: // member 0
			return subs[r].Send(bg, 1, 9, []byte("to member 1"))
		case 0: // member 1
			p, err := subs[r].Recv(bg, 0, 9)
			assert.Equal(t, "to member 1", string(p))
			return err
		}
		return nil
	}))
}
