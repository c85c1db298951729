package dist

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
)

// Dim is one dimension of a Mesh: its name ("dp", "pp", "tp") and size.
type Dim struct {
	Name string
	Size int
}

// Mesh arranges the members of a group in a grid of named dimensions, as
// torch's DeviceMesh: with dims {dp 2} {pp 2} on 4 ranks, rank r has
// coordinates (r / 2, r % 2) — row-major, the last dimension varying
// fastest — and Group("dp") is the subgroup of the ranks that differ from
// it only in their dp coordinate (here {r%2, r%2+2}). Each dimension's
// groups are made by Split, so a Mesh's groups use the parent's
// connections and share its failure domain.
type Mesh struct {
	parent *ProcessGroup
	dims   []Dim
	coord  []int
	groups []*ProcessGroup
}

// NewMesh arranges g's members in a grid of the given dimensions, whose
// sizes must multiply to g.WorldSize() and whose names must be distinct and
// not empty (else ErrInvalidArgument). It is a collective over g: every
// member calls it with the same dims (a member that passes others fails,
// with every member, with ErrInvalidArgument).
func NewMesh(ctx context.Context, g *ProcessGroup, dims ...Dim) (*Mesh, error) {
	name := g.opName(kSplit)
	product := 1
	seen := map[string]bool{}
	var bad error
	for _, d := range dims {
		switch {
		case d.Name == "" || seen[d.Name]:
			bad = fmt.Errorf("dist: mesh: %w: dimension names must be distinct and not empty: %v", ErrInvalidArgument, dims)
		case d.Size < 1:
			bad = fmt.Errorf("dist: mesh: %w: dimension %s of size %d", ErrInvalidArgument, d.Name, d.Size)
		default:
			product *= d.Size
		}
		seen[d.Name] = true
	}
	if bad == nil && (len(dims) == 0 || product != g.size) {
		bad = fmt.Errorf("dist: mesh: %w: dimensions %v hold %d ranks, the group has %d", ErrInvalidArgument, dims, product, g.size)
	}
	// Check that every member passed the same dims before splitting.
	h := fnv.New64a()
	for _, d := range dims {
		h.Write([]byte(d.Name))
		h.Write(binary.LittleEndian.AppendUint64([]byte{0}, uint64(d.Size)))
	}
	var ok uint32
	if bad == nil {
		ok = 1
	}
	all, err := g.gatherRecords(ctx, kSplit, g.record(ok, h.Sum64()))
	if err != nil {
		return nil, err
	}
	if bad != nil {
		return nil, bad
	}
	le := binary.LittleEndian
	for r := range g.size {
		rec := all[r*groupRecord:]
		if le.Uint32(rec[4:]) != 1 || le.Uint64(rec[8:]) != h.Sum64() {
			return nil, fmt.Errorf("dist: %s: mesh: %w: rank %d of the group passed other dimensions than this rank's %v", name, ErrInvalidArgument, r, dims)
		}
	}
	m := &Mesh{parent: g, dims: slices.Clone(dims), coord: make([]int, len(dims))}
	rest := g.rank
	for i := len(dims) - 1; i >= 0; i-- {
		m.coord[i] = rest % dims[i].Size
		rest /= dims[i].Size
	}
	for i, d := range dims {
		// The color numbers the other coordinates; the key is this one.
		color := 0
		for j := range dims {
			if j != i {
				color = color*dims[j].Size + m.coord[j]
			}
		}
		sub, err := g.split(ctx, color, m.coord[i], d.Name)
		if err != nil {
			m.Close()
			return nil, err
		}
		m.groups = append(m.groups, sub)
	}
	return m, nil
}

// Group returns this rank's group along the dimension called name: the
// members of the parent whose coordinates differ from this rank's in that
// dimension only, ordered by their coordinate in it. It returns nil for a
// name that is not a dimension of the mesh.
func (m *Mesh) Group(name string) *ProcessGroup {
	for i, d := range m.dims {
		if d.Name == name {
			return m.groups[i]
		}
	}
	return nil
}

// Coord returns this rank's coordinates, one per dimension. The caller
// owns the slice.
func (m *Mesh) Coord() []int { return slices.Clone(m.coord) }

// Dims returns the mesh's dimensions. The caller owns the slice.
func (m *Mesh) Dims() []Dim { return slices.Clone(m.dims) }

// Parent returns the group the mesh arranges.
func (m *Mesh) Parent() *ProcessGroup { return m.parent }

// String describes the mesh and this rank's place in it, like
// "mesh dp=2 pp=2, rank 3 at (1, 1)".
func (m *Mesh) String() string {
	var b strings.Builder
	b.WriteString("mesh")
	for _, d := range m.dims {
		fmt.Fprintf(&b, " %s=%d", d.Name, d.Size)
	}
	fmt.Fprintf(&b, ", rank %d at (", m.parent.rank)
	for i, c := range m.coord {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprint(&b, c)
	}
	b.WriteString(")")
	return b.String()
}

// Close closes the mesh's groups (not its parent).
func (m *Mesh) Close() error {
	var errs []error
	for _, g := range m.groups {
		errs = append(errs, g.Close())
	}
	return errors.Join(errs...)
}
