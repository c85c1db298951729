package ops_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/ops"
)

// moveCase is one data-moving collective (AllToAll, AllToAllV, Gather,
// Scatter, AllGatherV) on a group of n, with a naive reference. Rank r's
// input has inRows[r] rows and its output outRows[r], each row cols
// elements.
type moveCase struct {
	name            string
	inRows, outRows []int
	build           func(pg *dist.ProcessGroup, x *gorgonia.Node) (*gorgonia.Node, error)
	// ref returns every rank's output from every rank's input (row-major).
	ref func(xs [][]float64) [][]float64
}

// differentiable reports whether Gorgonia can differentiate the case: its
// arithmetic panics on tensors without elements, so a case with an empty
// input or output anywhere runs forward only.
func (c moveCase) differentiable() bool {
	return !slices.Contains(c.inRows, 0) && !slices.Contains(c.outRows, 0)
}

// moveCases returns the cases for a group of n and rows of cols elements:
// equal blocks of 0, 1 and 2 rows, uneven counts with zeros, and roots at
// both ends.
func moveCases(n, cols int) []moveCase {
	var cs []moveCase
	for _, b := range []int{1, 2, 0} { // rows per block
		cs = append(cs, moveCase{
			name:    fmt.Sprintf("AllToAll/block=%d", b),
			inRows:  fill(n, n*b),
			outRows: fill(n, n*b),
			build:   func(pg *dist.ProcessGroup, x *gorgonia.Node) (*gorgonia.Node, error) { return ops.AllToAll(pg, x) },
			ref:     allToAllRef(countMatrix(n, func(i, j int) int { return b }), cols),
		})
	}
	sends := []struct {
		name string
		c    func(i, j int) int // rows rank i sends rank j
	}{
		{"uneven", func(i, j int) int { return (i + 2*j + 1) % 4 }},
		{"rank0-idle", func(i, j int) int {
			if i == 0 || j == 0 {
				return 0
			}
			return i*j%3 + 1
		}},
	}
	for _, s := range sends {
		c := countMatrix(n, s.c)
		in, out := make([]int, n), make([]int, n)
		for i := range n {
			for j := range n {
				in[i] += c[i][j]
				out[j] += c[i][j]
			}
		}
		cs = append(cs, moveCase{
			name:    "AllToAllV/" + s.name,
			inRows:  in,
			outRows: out,
			build: func(pg *dist.ProcessGroup, x *gorgonia.Node) (*gorgonia.Node, error) {
				r := pg.Rank()
				send, recv := slices.Clone(c[r]), make([]int, n)
				for i := range n {
					recv[i] = c[i][r]
				}
				y, err := ops.AllToAllV(pg, x, send, recv)
				overwrite(send, recv) // the op keeps its own copies
				return y, err
			},
			ref: allToAllRef(c, cols),
		})
	}
	roots := []int{0}
	if n > 1 {
		roots = append(roots, n-1)
	}
	for _, root := range roots {
		for _, b := range []int{2, 0} {
			cs = append(cs, moveCase{
				name:    fmt.Sprintf("Gather/root=%d/rows=%d", root, b),
				inRows:  fill(n, b),
				outRows: fill(n, n*b),
				build: func(pg *dist.ProcessGroup, x *gorgonia.Node) (*gorgonia.Node, error) {
					return ops.Gather(pg, x, root)
				},
				ref: func(xs [][]float64) [][]float64 {
					ys := make([][]float64, n)
					for r := range n {
						ys[r] = make([]float64, n*b*cols)
					}
					ys[root] = slices.Concat(xs...)
					return ys
				},
			})
		}
		for _, b := range []int{1, 2, 0} {
			cs = append(cs, moveCase{
				name:    fmt.Sprintf("Scatter/root=%d/block=%d", root, b),
				inRows:  fill(n, n*b),
				outRows: fill(n, b),
				build: func(pg *dist.ProcessGroup, x *gorgonia.Node) (*gorgonia.Node, error) {
					return ops.Scatter(pg, x, root)
				},
				ref: func(xs [][]float64) [][]float64 {
					ys := make([][]float64, n)
					for r := range n {
						ys[r] = slices.Clone(xs[root][r*b*cols : (r+1)*b*cols])
					}
					return ys
				},
			})
		}
	}
	counts := []struct {
		name string
		c    func(r int) int
	}{
		{"ascending", func(r int) int { return r + 1 }},
		{"with-zeros", func(r int) int { return (5*r + 2) % 4 }}, // 2 3 0 1 2 3 0 1
		{"last-only", func(r int) int {
			if r == n-1 {
				return 3
			}
			return 0
		}},
	}
	for _, k := range counts {
		c := make([]int, n)
		for r := range n {
			c[r] = k.c(r)
		}
		cs = append(cs, moveCase{
			name:    "AllGatherV/" + k.name,
			inRows:  c,
			outRows: fill(n, sum(c)),
			build: func(pg *dist.ProcessGroup, x *gorgonia.Node) (*gorgonia.Node, error) {
				counts := slices.Clone(c)
				y, err := ops.AllGatherV(pg, x, counts)
				overwrite(counts)
				return y, err
			},
			ref: func(xs [][]float64) [][]float64 { return repeat(n, slices.Concat(xs...)) },
		})
	}
	return cs
}

func fill(n, v int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = v
	}
	return s
}

func sum(s []int) int {
	t := 0
	for _, v := range s {
		t += v
	}
	return t
}

// overwrite spoils counts the caller has passed on.
func overwrite(counts ...[]int) {
	for _, c := range counts {
		for i := range c {
			c[i] = -7
		}
	}
}

// countMatrix returns c[i][j] = f(i, j) for i, j < n.
func countMatrix(n int, f func(i, j int) int) [][]int {
	c := make([][]int, n)
	for i := range c {
		c[i] = make([]int, n)
		for j := range c[i] {
			c[i][j] = f(i, j)
		}
	}
	return c
}

// allToAllRef returns the reference of an all-to-all in which rank i sends
// c[i][j] rows of cols elements to rank j, taken from its input in order.
func allToAllRef(c [][]int, cols int) func(xs [][]float64) [][]float64 {
	return func(xs [][]float64) [][]float64 {
		n := len(c)
		ys := make([][]float64, n)
		for j := range n {
			ys[j] = []float64{}
		}
		for i := range n {
			off := 0
			for j := range n {
				ys[j] = append(ys[j], xs[i][off*cols:(off+c[i][j])*cols]...)
				off += c[i][j]
			}
		}
		return ys
	}
}

// adjoint returns, for the linear map ref, every rank's gradient of
// Σ_r <ws[r], ref(xs)[r]> with respect to its input of sizes[r] elements:
// the loss of each unit input in turn.
func adjoint(ref func([][]float64) [][]float64, sizes []int, ws [][]float64) [][]float64 {
	gs := make([][]float64, len(sizes))
	for q, m := range sizes {
		gs[q] = make([]float64, m)
		for e := range m {
			unit := make([][]float64, len(sizes))
			for r, s := range sizes {
				unit[r] = make([]float64, s)
			}
			unit[q][e] = 1
			for r, y := range ref(unit) {
				for i, v := range y {
					gs[q][e] += ws[r][i] * v
				}
			}
		}
	}
	return gs
}

// moveInputs returns every rank's input and loss weights for c, seeded by
// salt so that groups running side by side differ.
func moveInputs(c moveCase, cols, salt int) (xs, ws [][]float64) {
	n := len(c.inRows)
	xs, ws = make([][]float64, n), make([][]float64, n)
	for r := range n {
		xs[r] = seq(c.inRows[r]*cols, func(i int) float64 { return valueOf(r+salt, i) })
		ws[r] = seq(c.outRows[r]*cols, func(i int) float64 { return weightOf(r+salt, i) })
	}
	return xs, ws
}

// runMove runs c on pg's rank with input x (rows of cols elements) and,
// if c is differentiable, loss weights w (see runGraph).
func runMove(t testing.TB, pg *dist.ProcessGroup, c moveCase, dt tensor.Dtype, cols int, x, w []float64) (y, gx []float64, err error) {
	if !c.differentiable() {
		w = nil
	}
	r := pg.Rank()
	return runGraph(t, pg, dt, c.build, tensor.Shape{c.inRows[r], cols}, x, tensor.Shape{c.outRows[r], cols}, w)
}

// checkMove compares every rank's output and gradient, as runMove returned
// them, with c's reference on inputs xs and weights ws.
func checkMove(t *testing.T, c moveCase, cols int, xs, ws, ys, gs [][]float64, tol float64) {
	t.Helper()
	wantY := c.ref(xs)
	var wantG [][]float64
	if c.differentiable() {
		sizes := make([]int, len(xs))
		for r, x := range xs {
			sizes[r] = len(x)
		}
		wantG = adjoint(c.ref, sizes, ws)
	}
	for r := range xs {
		assertClose(t, wantY[r], ys[r], tol, "rank %d output", r)
		if wantG != nil {
			assertClose(t, wantG[r], gs[r], tol, "rank %d gradient", r)
		}
	}
}

// TestMoveValuesAndGradients runs each data-moving collective op in a real
// graph on 1 to 8 ranks, in Float64 and Float32, and compares every rank's
// output with a naive reference and, where Gorgonia can differentiate (no
// empty tensor), its input gradient of loss = Σ_r Σ_i y_r[i]·w_r[i] with
// the reference's adjoint.
func TestMoveValuesAndGradients(t *testing.T) {
	const cols = 3
	for n := 1; n <= 8; n++ {
		for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			for _, c := range moveCases(n, cols) {
				t.Run(fmt.Sprintf("n=%d/%v/%s", n, dt, c.name), func(t *testing.T) {
					tol := 1e-12
					if dt == tensor.Float32 {
						tol = 1e-5
					}
					xs, ws := moveInputs(c, cols, 0)
					ys, gs := make([][]float64, n), make([][]float64, n)
					runRanks(t, n, func(pg *dist.ProcessGroup) error {
						r := pg.Rank()
						var err error
						ys[r], gs[r], err = runMove(t, pg, c, dt, cols, xs[r], ws[r])
						return err
					})
					if !t.Failed() {
						checkMove(t, c, cols, xs, ws, ys, gs, tol)
					}
				})
			}
		}
	}
}

// TestMoveSubgroups runs every case on the two halves of a group of four
// (pg.Split by rank parity), side by side, with different inputs in each.
func TestMoveSubgroups(t *testing.T) {
	const n, cols = 4, 3
	cases := moveCases(n/2, cols)
	type result struct{ ys, gs [][]float64 }
	res := make([][]result, 2) // by color, then case
	for color := range res {
		res[color] = make([]result, len(cases))
		for i := range cases {
			res[color][i] = result{make([][]float64, n/2), make([][]float64, n/2)}
		}
	}
	runRanks(t, n, func(pg *dist.ProcessGroup) error {
		color := pg.Rank() % 2
		sub, err := pg.Split(context.Background(), color, 0)
		if err != nil {
			return err
		}
		defer sub.Close()
		if sub.WorldSize() != n/2 || sub.Rank() != pg.Rank()/2 {
			return fmt.Errorf("rank %d: subgroup rank %d of %d", pg.Rank(), sub.Rank(), sub.WorldSize())
		}
		for i, c := range cases {
			xs, ws := moveInputs(c, cols, 10*color)
			r := sub.Rank()
			y, g, err := runMove(t, sub, c, tensor.Float64, cols, xs[r], ws[r])
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			res[color][i].ys[r], res[color][i].gs[r] = y, g
		}
		return nil
	})
	if t.Failed() {
		return
	}
	for color := range res {
		for i, c := range cases {
			t.Run(fmt.Sprintf("color=%d/%s", color, c.name), func(t *testing.T) {
				xs, ws := moveInputs(c, cols, 10*color)
				checkMove(t, c, cols, xs, ws, res[color][i].ys, res[color][i].gs, 1e-12)
			})
		}
	}
}

// TestMoveNumericGradient checks the gradient of each differentiable case
// against central finite differences of the global loss Σ_r Σ_i w_r[i]·y_r[i]²,
// on 2 and 3 ranks and on a subgroup of two of four.
func TestMoveNumericGradient(t *testing.T) {
	const cols = 2
	check := func(t *testing.T, pg *dist.ProcessGroup, c moveCase, salt int) error {
		r := pg.Rank()
		xs, ws := moveInputs(c, cols, salt)
		return checkGraphGradient(t, pg, tensor.Shape{c.inRows[r], cols}, xs[r], func(x *gorgonia.Node) (*gorgonia.Node, error) {
			w := gorgonia.NewConstant(makeTensor(tensor.Float64, tensor.Shape{c.outRows[r], cols}, ws[r]), gorgonia.WithName("w"))
			y, err := c.build(pg, x)
			if err != nil {
				return nil, err
			}
			return gorgonia.Sum(gorgonia.Must(gorgonia.HadamardProd(gorgonia.Must(gorgonia.Square(y)), w)))
		})
	}
	for _, n := range []int{2, 3} {
		for _, c := range moveCases(n, cols) {
			if !c.differentiable() {
				continue
			}
			t.Run(fmt.Sprintf("n=%d/%s", n, c.name), func(t *testing.T) {
				runRanks(t, n, func(pg *dist.ProcessGroup) error { return check(t, pg, c, 0) })
			})
		}
	}
	t.Run("subgroup", func(t *testing.T) {
		cases := moveCases(2, cols)
		runRanks(t, 4, func(pg *dist.ProcessGroup) error {
			color := pg.Rank() % 2
			sub, err := pg.Split(context.Background(), color, 0)
			if err != nil {
				return err
			}
			defer sub.Close()
			for _, c := range cases {
				if !c.differentiable() {
					continue
				}
				if err := check(t, sub, c, 10*color); err != nil {
					return fmt.Errorf("%s: %w", c.name, err)
				}
			}
			return nil
		})
	})
}

func TestMoveInvalidArguments(t *testing.T) {
	pg := buildingGroup(t, 2)
	buildMu.Lock()
	defer buildMu.Unlock()
	g := gorgonia.NewGraph()
	m := gorgonia.NewMatrix(g, tensor.Float64, gorgonia.WithShape(3, 2), gorgonia.WithName("m")) // 3 rows
	s := gorgonia.NewScalar(g, tensor.Float64, gorgonia.WithName("s"))
	i := gorgonia.NewVector(g, tensor.Int, gorgonia.WithShape(4), gorgonia.WithName("i"))

	invalid := map[string]func() (*gorgonia.Node, error){
		"AllToAll/rows-not-divisible": func() (*gorgonia.Node, error) { return ops.AllToAll(pg, m) },
		"AllToAll/scalar":             func() (*gorgonia.Node, error) { return ops.AllToAll(pg, s) },
		"AllToAll/nil-group":          func() (*gorgonia.Node, error) { return ops.AllToAll(nil, m) },
		"AllToAll/nil-node":           func() (*gorgonia.Node, error) { return ops.AllToAll(pg, nil) },
		"Scatter/rows-not-divisible":  func() (*gorgonia.Node, error) { return ops.Scatter(pg, m, 0) },
		"Scatter/scalar":              func() (*gorgonia.Node, error) { return ops.Scatter(pg, s, 0) },
		"Gather/scalar":               func() (*gorgonia.Node, error) { return ops.Gather(pg, s, 1) },
		"AllToAllV/short-send":        func() (*gorgonia.Node, error) { return ops.AllToAllV(pg, m, []int{3}, []int{3, 1}) },
		"AllToAllV/long-recv":         func() (*gorgonia.Node, error) { return ops.AllToAllV(pg, m, []int{1, 2}, []int{1, 2, 0}) },
		"AllToAllV/nil-counts":        func() (*gorgonia.Node, error) { return ops.AllToAllV(pg, m, nil, nil) },
		"AllToAllV/negative-send":     func() (*gorgonia.Node, error) { return ops.AllToAllV(pg, m, []int{4, -1}, []int{4, 0}) },
		"AllToAllV/negative-recv":     func() (*gorgonia.Node, error) { return ops.AllToAllV(pg, m, []int{1, 2}, []int{1, -2}) },
		"AllToAllV/send-not-rows":     func() (*gorgonia.Node, error) { return ops.AllToAllV(pg, m, []int{1, 1}, []int{1, 1}) },
		"AllToAllV/self-mismatch":     func() (*gorgonia.Node, error) { return ops.AllToAllV(pg, m, []int{1, 2}, []int{2, 2}) },
		"AllToAllV/scalar":            func() (*gorgonia.Node, error) { return ops.AllToAllV(pg, s, []int{1, 0}, []int{1, 0}) },
		"AllGatherV/long-counts":      func() (*gorgonia.Node, error) { return ops.AllGatherV(pg, m, []int{3, 1, 1}) },
		"AllGatherV/nil-counts":       func() (*gorgonia.Node, error) { return ops.AllGatherV(pg, m, nil) },
		"AllGatherV/negative":         func() (*gorgonia.Node, error) { return ops.AllGatherV(pg, m, []int{3, -1}) },
		"AllGatherV/counts-not-rows":  func() (*gorgonia.Node, error) { return ops.AllGatherV(pg, m, []int{2, 1}) },
		"AllGatherV/scalar":           func() (*gorgonia.Node, error) { return ops.AllGatherV(pg, s, []int{1, 1}) },
	}
	for name, build := range invalid {
		y, err := build()
		assert.ErrorIs(t, err, dist.ErrInvalidArgument, name)
		assert.Nil(t, y, name)
	}
	for name, root := range map[string]int{"too-big": 2, "negative": -1} {
		_, err := ops.Gather(pg, m, root)
		assert.ErrorIs(t, err, dist.ErrInvalidRank, "Gather/%s", name)
		_, err = ops.Scatter(pg, gorgonia.NewMatrix(g, tensor.Float64, gorgonia.WithShape(4, 2)), root)
		assert.ErrorIs(t, err, dist.ErrInvalidRank, "Scatter/%s", name)
	}
	for name, build := range map[string]func() (*gorgonia.Node, error){
		"AllToAll":   func() (*gorgonia.Node, error) { return ops.AllToAll(pg, i) },
		"AllToAllV":  func() (*gorgonia.Node, error) { return ops.AllToAllV(pg, i, []int{2, 2}, []int{2, 2}) },
		"Gather":     func() (*gorgonia.Node, error) { return ops.Gather(pg, i, 0) },
		"Scatter":    func() (*gorgonia.Node, error) { return ops.Scatter(pg, i, 0) },
		"AllGatherV": func() (*gorgonia.Node, error) { return ops.AllGatherV(pg, i, []int{4, 1}) },
	} {
		_, err := build()
		assert.ErrorIs(t, err, dist.ErrUnsupportedDType, name)
	}
}

// TestAllToAllVMismatchFails gives rank 0 receive counts that disagree with
// what rank 1 sends: rank 0's run fails with a protocol error naming rank 1
// instead of delivering wrong rows or hanging, and the job is aborted.
func TestAllToAllVMismatchFails(t *testing.T) {
	errs, groupErrs := make([]error, 2), make([]error, 2)
	runRanks(t, 2, func(pg *dist.ProcessGroup) error {
		r := pg.Rank()
		buildMu.Lock()
		g := gorgonia.NewGraph()
		x := gorgonia.NewMatrix(g, tensor.Float64, gorgonia.WithShape(2, 2), gorgonia.WithName("x"),
			gorgonia.WithValue(makeTensor(tensor.Float64, tensor.Shape{2, 2}, []float64{1, 2, 3, 4})))
		// Both send one row to each rank; rank 0 expects two from rank 1.
		_, err := ops.AllToAllV(pg, x, []int{1, 1}, [][]int{{1, 2}, {1, 1}}[r])
		buildMu.Unlock()
		if err != nil {
			return err
		}
		vm := gorgonia.NewTapeMachine(g)
		defer vm.Close()
		errs[r] = vm.RunAll()
		groupErrs[r] = pg.Err()
		return nil
	})
	require.Error(t, errs[0])
	cause := runCause(errs[0])
	assert.ErrorIs(t, cause, dist.ErrProtocol)
	var pe *dist.PeerError
	if assert.ErrorAs(t, cause, &pe) {
		assert.Equal(t, 1, pe.Rank)
	}
	assert.ErrorIs(t, groupErrs[0], dist.ErrProtocol, "the job is aborted")
}

// runCause returns the error of the op that failed a TapeMachine's run:
// Gorgonia wraps it in an error that keeps it behind an Err method without
// unwrapping to it.
func runCause(err error) error {
	var ce interface{ Err() error }
	if errors.As(err, &ce) {
		return ce.Err()
	}
	return err
}
