package pipeline

// A stage's graphs run on the pipeline's own executor, not on a
// gorgonia.TapeMachine: a TapeMachine's RunAll locks its OS thread and
// starts a goroutine for every run (two thread hand-offs per micro-batch,
// tens of microseconds each on a loaded machine) and Reset drops every
// register, so that each run allocates every intermediate tensor again.
// The executor runs the same ops in the order a TapeMachine does (the
// reverse of gorgonia.Sort), keeps each op's output from one run to the
// next and writes into it where the op allows (gorgonia.UsePreallocDoer),
// runs the common ops of a layer (matrix products, element-wise arithmetic,
// tanh, sums over rows, reshapes) without Gorgonia's ops (gemm.go,
// elem.go, shape.go), and can stop between passes — after the forward pass, after the
// input-gradient pass — and carry on later, on the same goroutine.

import (
	"fmt"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// ownKernels says whether the executor runs Gorgonia's matrix products
// (gemm.go), element-wise arithmetic (elem.go), tanh, squares, sums over
// rows and reshapes (shape.go) itself rather than through their ops; tests turn it
// off to compare the two.
var ownKernels = true

// program is one graph prepared for the executor: the op nodes that the
// outputs of its passes depend on, in execution order, and each node's
// value in the current run.
type program struct {
	nodes  []*gorgonia.Node
	index  map[*gorgonia.Node]int
	args   [][]int          // children of each node, by index, in order
	vals   []gorgonia.Value // each node's value in the current run
	own    []bool           // vals[i] was made by node i's op and nothing else holds it: the op may write into it next run
	loads  []int            // argument nodes (no op): their bound values are loaded when a run starts
	passes [][]int          // op nodes of each pass, in execution order
	buf    []gorgonia.Value // arguments of the op being run
	elem   []elemOp         // the element-wise operation node i computes, if any (elem.go)
	fast   []fastOp         // the unary op node i computes, if any (shape.go)
	shapes []tensor.Shape   // the shape of node i, if fast[i] (Node.Shape copies it)
	mm     []matMul         // the matrix product node i computes, if isMM[i]
	isMM   []bool           // node i is a matrix product the executor runs itself (gemm.go)
	// addTo[i], if set, is the gradient data ([]float32 or []float64)
	// that node i's value is added to instead of being kept (see
	// accumulateInto).
	addTo   []any
	scratch *gemmScratch // shared by every program of a pipeline, which run one at a time
}

// compile prepares g's nodes for passes that compute outs[0], then
// outs[1], and so on: pass k runs, in the order a TapeMachine would, the
// op nodes that outs[k] depend on and that no earlier pass ran. Nodes no
// output depends on (gorgonia.Read nodes, say) are never run.
func compile(g *gorgonia.ExprGraph, outs ...gorgonia.Nodes) (*program, error) {
	sorted, err := gorgonia.Sort(g)
	if err != nil {
		return nil, fmt.Errorf("%w: sorting the stage's graph: %v", ErrStage, err)
	}
	p := &program{index: make(map[*gorgonia.Node]int)}
	pass := make(map[*gorgonia.Node]int) // the pass that needs each node first
	for k, o := range outs {
		stack := append(gorgonia.Nodes(nil), o...)
		for len(stack) > 0 {
			n := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if _, seen := pass[n]; seen {
				continue
			}
			pass[n] = k
			stack = append(stack, children(g, n)...)
		}
	}
	// sorted lists parents before children; run children first.
	p.passes = make([][]int, len(outs))
	for i := len(sorted) - 1; i >= 0; i-- {
		n := sorted[i]
		k, ok := pass[n]
		if !ok {
			continue
		}
		idx := len(p.nodes)
		p.index[n] = idx
		p.nodes = append(p.nodes, n)
		if n.Op() == nil {
			p.loads = append(p.loads, idx)
		} else {
			p.passes[k] = append(p.passes[k], idx)
		}
	}
	p.args = make([][]int, len(p.nodes))
	most := 0
	for i, n := range p.nodes {
		if n.Op() == nil {
			continue
		}
		cs := children(g, n)
		p.args[i] = make([]int, len(cs))
		for j, c := range cs {
			ci, ok := p.index[c]
			if !ok {
				return nil, fmt.Errorf("%w: node %v has a child %v outside the graph's order", ErrStage, n, c)
			}
			p.args[i][j] = ci
		}
		most = max(most, len(cs))
	}
	p.mm = make([]matMul, len(p.nodes))
	p.isMM = make([]bool, len(p.nodes))
	p.elem = make([]elemOp, len(p.nodes))
	p.fast = make([]fastOp, len(p.nodes))
	p.shapes = make([]tensor.Shape, len(p.nodes))
	for i, n := range p.nodes {
		switch {
		case !ownKernels || n.Op() == nil:
		case len(p.args[i]) == 2:
			p.mm[i], p.isMM[i] = asMatMul(n.Op())
			p.elem[i] = asElem(n.Op())
		case len(p.args[i]) == 1:
			if p.fast[i] = asFast(n.Op()); p.fast[i] != fastNone {
				p.shapes[i] = n.Shape()
			}
		}
	}
	p.addTo = make([]any, len(p.nodes))
	p.scratch = new(gemmScratch)
	p.vals = make([]gorgonia.Value, len(p.nodes))
	p.own = make([]bool, len(p.nodes))
	p.buf = make([]gorgonia.Value, 0, most)
	return p, nil
}

// children returns n's children in argument order.
func children(g *gorgonia.ExprGraph, n *gorgonia.Node) gorgonia.Nodes {
	it := g.From(n.ID())
	out := make(gorgonia.Nodes, 0, it.Len())
	for it.Next() {
		out = append(out, it.Node().(*gorgonia.Node))
	}
	return out
}

// has reports whether the program holds node n.
func (p *program) has(n *gorgonia.Node) bool {
	_, ok := p.index[n]
	return ok
}

// load starts a run: every argument node's bound value (parameters,
// inputs, the gradient the next stage sends) is read again, as a Let may
// have rebound it.
func (p *program) load() {
	for _, i := range p.loads {
		p.vals[i] = p.nodes[i].Value()
	}
}

// run runs pass k.
func (p *program) run(k int) error {
	for _, i := range p.passes[k] {
		if err := p.exec(i); err != nil {
			return err
		}
	}
	return nil
}

// exec runs node i's op on its children's current values.
func (p *program) exec(i int) error {
	if p.isMM[i] {
		args := p.args[i]
		a, b := p.vals[args[0]], p.vals[args[1]]
		if dst := p.addTo[i]; dst != nil {
			if p.mm[i].add(dst, p.scratch, a, b) {
				return nil
			}
		} else if v, ok := p.mm[i].run(p.vals[i], p.own[i], a, b); ok {
			return p.done(i, v)
		}
	}
	if e := p.elem[i]; e != elemNone {
		args := p.args[i]
		if v, ok := e.run(p.vals[i], p.own[i], p.vals[args[0]], p.vals[args[1]]); ok {
			return p.done(i, v)
		}
	}
	if f := p.fast[i]; f != fastNone {
		if v, ok := f.run(p.vals[i], p.own[i], p.vals[p.args[i][0]], p.shapes[i]); ok {
			return p.done(i, v)
		}
	}
	op := p.nodes[i].Op()
	a := p.buf[:0]
	for _, c := range p.args[i] {
		a = append(a, p.vals[c])
	}
	var v gorgonia.Value
	var err error
	if pd, ok := op.(gorgonia.UsePreallocDoer); ok && p.own[i] {
		if v, err = pd.UsePreallocDo(p.vals[i], a...); err != nil {
			v, err = op.Do(a...) // as a TapeMachine does
		}
	} else {
		v, err = op.Do(a...)
	}
	clear(a)
	if err != nil {
		return fmt.Errorf("pipeline: running %v: %w", p.nodes[i], err)
	}
	return p.done(i, v)
}

// done records v as node i's value in the current run, or adds it to the
// node's gradient (accumulateInto).
func (p *program) done(i int, v gorgonia.Value) error {
	p.vals[i] = v
	p.own[i] = !sharesMemory(v, p.args[i], p.vals)
	if dst := p.addTo[i]; dst != nil {
		src, err := denseData(v)
		if err != nil {
			return err
		}
		return addInto(dst, src)
	}
	return nil
}

// accumulateInto makes node i's value, from the next run on, be added to
// dst (a gradient's data, []float32 or []float64, of the node's size) when
// the node runs, instead of being kept: a matrix product is then computed a
// strip at a time and added while in the cache (gemmAdd32), never written
// out whole. The sums are bitwise those of adding the kept value with
// addInto. dst nil keeps the value again.
func (p *program) accumulateInto(i int, dst any) { p.addTo[i] = dst }

// value returns node n's value in the current run (nil if the program
// does not hold n).
func (p *program) value(n *gorgonia.Node) gorgonia.Value {
	i, ok := p.index[n]
	if !ok {
		return nil
	}
	return p.vals[i]
}

// sharesMemory reports whether v is, or is a view of, one of the values of
// nodes args: then v belongs to that node and must not be written into.
// Scalars never share.
func sharesMemory(v gorgonia.Value, args []int, vals []gorgonia.Value) bool {
	t, ok := v.(tensor.Tensor)
	if !ok {
		return false
	}
	lo, hi := memRange(t)
	for _, c := range args {
		if u, ok := vals[c].(tensor.Tensor); ok {
			if ulo, uhi := memRange(u); lo < uhi && ulo < hi {
				return true
			}
		}
	}
	return false
}

// memRange returns the addresses [lo, hi) of t's backing memory.
func memRange(t tensor.Tensor) (lo, hi uintptr) {
	lo = t.Uintptr()
	return lo, lo + t.MemSize()
}

// denseData returns the flat data ([]float32 or []float64) of a tensor
// value, materialising views. The slice aliases v unless it was a view.
func denseData(v gorgonia.Value) (any, error) {
	d, ok := v.(*tensor.Dense)
	if !ok {
		return nil, fmt.Errorf("%w: value %T is not a dense tensor", ErrStage, v)
	}
	if d.IsView() {
		d = d.Materialize().(*tensor.Dense)
	}
	// Float32s and Float64s, not Data, which allocates twice.
	switch d.Dtype() {
	case tensor.Float32:
		return d.Float32s(), nil
	case tensor.Float64:
		return d.Float64s(), nil
	}
	return nil, fmt.Errorf("%w: dtype %v (want float32 or float64)", ErrStage, d.Dtype())
}

// flatData returns the data of d, a float32 or float64 tensor that is not
// a view, as a []float32 or []float64 aliasing it (d.Data allocates a
// reflect value besides).
func flatData(d *tensor.Dense) any {
	if d.Dtype() == tensor.Float32 {
		return d.Float32s()
	}
	return d.Float64s()
}
