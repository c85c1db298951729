package dist

import (
	"fmt"

	"github.com/gdist/gdist/dist/internal/coll"
	"github.com/gdist/gdist/dist/transport"
)

// Hierarchical (topology-aware) collectives: when the transport knows which
// ranks share a host (transport.Topology) and a group's members span
// several hosts, at least one of them with several members, its AllReduce
// and Broadcast keep most of their traffic within the hosts (see package
// coll for the algorithms and WithHierarchical for the behaviour).

// topology returns the host of every rank of t's job, or nil if the
// collectives stay flat: hierarchical collectives are off, or t does not
// implement transport.Topology. A host map that breaks the Topology
// contract is an error.
func topology(t transport.Transport, cfg *config, world int) ([]int, error) {
	if !cfg.hier {
		return nil, nil
	}
	tp, ok := t.(transport.Topology)
	if !ok {
		return nil, nil
	}
	hosts := tp.Hosts()
	if len(hosts) != world {
		return nil, fmt.Errorf("dist: %w: transport topology: %d host entries for %d ranks", ErrInvalidArgument, len(hosts), world)
	}
	if err := transport.CheckHosts(hosts); err != nil {
		return nil, fmt.Errorf("dist: %w: transport topology: %w", ErrInvalidArgument, err)
	}
	return hosts, nil
}

// pairSegment returns the coll.Net.PairSegment of a group of n members
// whose job ranks are ranks (nil: the whole job): the configured segment
// when the group has 2 members and the transport says they talk through
// shared memory (transport.SharedMemory), else 0.
func (d *domain) pairSegment(ranks []int, n int) int {
	sm, ok := d.t.(transport.SharedMemory)
	if n != 2 || !ok {
		return 0
	}
	a, b := 0, 1
	if ranks != nil {
		a, b = ranks[0], ranks[1]
	}
	other := a
	if a == d.rank {
		other = b
	}
	if !sm.SharedMemory(other) {
		return 0
	}
	return d.cfg.pairSegment
}

// plan returns the hierarchical plan of member me of the group of n
// members whose job ranks are ranks (nil: the whole job), or nil when its
// collectives run flat. The members' hosts are renumbered in the order of
// their lowest member, as coll.NewPlan wants them.
func (d *domain) plan(ranks []int, me, n int) *coll.Plan {
	if d.hosts == nil {
		return nil
	}
	hosts := make([]int, n)
	number := make(map[int]int)
	for i := range n {
		r := i
		if ranks != nil {
			r = ranks[i]
		}
		h, ok := number[d.hosts[r]]
		if !ok {
			h = len(number)
			number[d.hosts[r]] = h
		}
		hosts[i] = h
	}
	return coll.NewPlan(hosts, me)
}
