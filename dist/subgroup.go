package dist

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"slices"
)

// Subgroups. NewGroup and Split are collectives over the parent group:
// every member of the parent calls them, in the same order as its other
// collectives. They exchange, with an all-gather over the parent, what
// each member asked for and the lowest group id it has not seen used; the
// new groups take ids above every member's, so two groups that share
// members never share an id (and with it their block of tags). Groups are
// created in the same order on every rank, as torch.distributed requires:
// create them from one goroutine per rank, not from several at once.

// groupRecord is what each member of the parent contributes to a group
// creation: 16 bytes, little-endian.
//
//	new_group: id proposal u32, flags u32 (1: the ranks are valid), hash of the ranks u64
//	split:     id proposal u32, color i32 (negative: no group), key i64
const groupRecord = 16

// NewGroup returns the subgroup of the members ranks of g (ranks of g, not
// of the job; member i of the new group is ranks[i]), as torch's
// new_group: every member of g calls it with the same ranks, and the
// members in ranks get the subgroup while the others get nil (and a nil
// error). The subgroup reuses g's connections: no new sockets, no new
// rendezvous. It fails with an error matching ErrInvalidArgument on every
// member when the ranks are not distinct ranks of g, or when the members
// passed different lists.
func (g *ProcessGroup) NewGroup(ctx context.Context, ranks []int) (*ProcessGroup, error) {
	name := g.opName(kNewGroup)
	valid := len(ranks) > 0
	seen := make(map[int]bool, len(ranks))
	for _, r := range ranks {
		if r < 0 || r >= g.size || seen[r] {
			valid = false
		}
		seen[r] = true
	}
	h := fnv.New64a()
	for _, r := range ranks {
		h.Write(binary.LittleEndian.AppendUint64(nil, uint64(r)))
	}
	var flags uint32
	if valid {
		flags = 1
	}
	mine := g.record(flags, h.Sum64())
	all, err := g.gatherRecords(ctx, kNewGroup, mine)
	if err != nil {
		return nil, err
	}
	if !valid {
		return nil, fmt.Errorf("dist: %s: %w: ranks %v are not distinct ranks of a group of %d", name, ErrInvalidArgument, ranks, g.size)
	}
	le := binary.LittleEndian
	id := uint32(0)
	for r := range g.size {
		rec := all[r*groupRecord:]
		if le.Uint32(rec[4:]) != 1 {
			return nil, fmt.Errorf("dist: %s: %w: rank %d of the group passed invalid ranks", name, ErrInvalidArgument, r)
		}
		if le.Uint64(rec[8:]) != h.Sum64() {
			return nil, fmt.Errorf("dist: %s: %w: rank %d passed other ranks than this rank's %v", name, ErrInvalidArgument, r, ranks)
		}
		id = max(id, le.Uint32(rec))
	}
	if err := g.d.reserveIDs(id, 1); err != nil {
		return nil, fmt.Errorf("dist: %s: %w", name, err)
	}
	me := slices.Index(ranks, g.rank)
	if me < 0 {
		return nil, nil
	}
	members := make([]int, len(ranks))
	for i, r := range ranks {
		members[i] = g.global(r)
	}
	return g.d.newGroup(id, fmt.Sprintf("group %d", id), members, me, len(members)), nil
}

// Split partitions g into subgroups by color, as MPI_Comm_split: every
// member of g calls it; the members that pass the same color form a
// subgroup, ordered by key and then by their rank in g. A negative color
// joins no subgroup: that member gets nil (and a nil error). Every
// subgroup reuses g's connections.
func (g *ProcessGroup) Split(ctx context.Context, color, key int) (*ProcessGroup, error) {
	return g.split(ctx, color, key, "")
}

// split is Split with the subgroups named name ("" for "group N").
func (g *ProcessGroup) split(ctx context.Context, color, key int, name string) (*ProcessGroup, error) {
	op := g.opName(kSplit)
	if color > 1<<31-1 {
		return nil, fmt.Errorf("dist: %s: %w: color %d above %d", op, ErrInvalidArgument, color, 1<<31-1)
	}
	if color < 0 {
		color = -1
	}
	mine := g.record(uint32(int32(color)), uint64(int64(key)))
	all, err := g.gatherRecords(ctx, kSplit, mine)
	if err != nil {
		return nil, err
	}
	le := binary.LittleEndian
	type member struct{ rank, color, key int }
	var ms []member
	base := uint32(0)
	for r := range g.size {
		rec := all[r*groupRecord:]
		base = max(base, le.Uint32(rec))
		if c := int(int32(le.Uint32(rec[4:]))); c >= 0 {
			ms = append(ms, member{r, c, int(int64(le.Uint64(rec[8:])))})
		}
	}
	colors := make([]int, 0, len(ms))
	for _, m := range ms {
		colors = append(colors, m.color)
	}
	slices.Sort(colors)
	colors = slices.Compact(colors)
	if err := g.d.reserveIDs(base, len(colors)); err != nil {
		return nil, fmt.Errorf("dist: %s: %w", op, err)
	}
	if color < 0 {
		return nil, nil
	}
	var mine2 []member
	for _, m := range ms {
		if m.color == color {
			mine2 = append(mine2, m)
		}
	}
	slices.SortStableFunc(mine2, func(a, b member) int {
		return cmp.Or(cmp.Compare(a.key, b.key), cmp.Compare(a.rank, b.rank))
	})
	members := make([]int, len(mine2))
	me := -1
	for i, m := range mine2 {
		members[i] = g.global(m.rank)
		if m.rank == g.rank {
			me = i
		}
	}
	id := base + uint32(slices.Index(colors, color))
	if name == "" {
		name = fmt.Sprintf("group %d", id)
	}
	return g.d.newGroup(id, name, members, me, len(members)), nil
}

// record returns this member's 16-byte contribution to a group creation:
// the lowest group id it has not seen used, then a and b.
func (g *ProcessGroup) record(a uint32, b uint64) []byte {
	g.d.mu.Lock()
	next := g.d.nextID
	g.d.mu.Unlock()
	le := binary.LittleEndian
	rec := make([]byte, groupRecord)
	le.PutUint32(rec, next)
	le.PutUint32(rec[4:], a)
	le.PutUint64(rec[8:], b)
	return rec
}

// gatherRecords all-gathers every member's record over g, as collective
// kind (new_group or split): a member that calls another collective at
// this point gets a *DesyncError.
func (g *ProcessGroup) gatherRecords(ctx context.Context, kind opKind, mine []byte) ([]byte, error) {
	all := make([]byte, g.size*groupRecord)
	c := call{kind: kind, dt: Float64, count: groupRecord / 8, data: all, src: mine}
	if err := g.run(ctx, &c, nil); err != nil {
		return nil, err
	}
	return all, nil
}

// reserveIDs records that ids [base, base+n) are taken: this rank's next
// proposal is above them. It fails when they do not fit in the reserved
// tag range.
func (d *domain) reserveIDs(base uint32, n int) error {
	if int(base)+n > maxGroups {
		return fmt.Errorf("%w: a job creates at most %d groups", ErrInvalidArgument, maxGroups-1)
	}
	d.mu.Lock()
	d.nextID = max(d.nextID, base+uint32(n))
	d.mu.Unlock()
	return nil
}
