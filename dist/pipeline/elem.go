package pipeline

// The executor also runs Gorgonia's element-wise addition, subtraction and
// Hadamard product of two tensors of one shape itself: through the op each
// costs several allocations and a few microseconds of dispatch, more than
// the arithmetic on a micro-batch of a few rows. Each element is one IEEE
// operation, so the results are bitwise the op's.

import (
	"reflect"
	"sync"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// elemOp is an element-wise binary operation the executor runs itself.
type elemOp uint8

const (
	elemNone elemOp = iota
	elemAdd
	elemSub
	elemMul
)

// elemRef is the type of Gorgonia's element-wise binary op and the
// String of its addition, subtraction and Hadamard product of two
// matrices, against which compile recognises them.
var elemRef = sync.OnceValues(func() (reflect.Type, map[string]elemOp) {
	g := gorgonia.NewGraph()
	a := gorgonia.NewMatrix(g, tensor.Float64, gorgonia.WithShape(2, 2))
	b := gorgonia.NewMatrix(g, tensor.Float64, gorgonia.WithShape(2, 2))
	ops := map[string]elemOp{}
	var typ reflect.Type
	for _, x := range []struct {
		f func(a, b *gorgonia.Node) (*gorgonia.Node, error)
		e elemOp
	}{{gorgonia.Add, elemAdd}, {gorgonia.Sub, elemSub}, {gorgonia.HadamardProd, elemMul}} {
		n, err := x.f(a, b)
		if err != nil {
			return nil, nil
		}
		t := reflect.TypeOf(n.Op())
		if typ != nil && t != typ {
			return nil, nil
		}
		typ = t
		ops[n.Op().String()] = x.e
	}
	if len(ops) != 3 {
		return nil, nil
	}
	return typ, ops
})

// asElem returns the element-wise operation op is, or elemNone.
func asElem(op gorgonia.Op) elemOp {
	typ, ops := elemRef()
	if op == nil || typ == nil || reflect.TypeOf(op) != typ {
		return elemNone
	}
	return ops[op.String()]
}

// plainDense reports whether v is a dense tensor that is neither a view
// nor transposed, on tensor's standard engine: its data is its elements in
// order, and tensor's own functions would compute on it.
func plainDense(v gorgonia.Value) (*tensor.Dense, bool) {
	d, ok := v.(*tensor.Dense)
	if !ok || d.IsMaterializable() || !d.DataOrder().IsRowMajor() {
		return nil, false
	}
	if _, ok := d.Engine().(tensor.StdEng); !ok {
		return nil, false
	}
	return d, true
}

// run computes a op b into dst, which it reuses if it has the result's
// shape and dtype and may be written (reuse), or else allocates. a and b
// are plain float32 or float64 tensors of one shape, or one of them is a
// scalar of their dtype; ok is false, and nothing is computed, for
// anything else (the op runs as usual).
func (e elemOp) run(dst gorgonia.Value, reuse bool, a, b gorgonia.Value) (gorgonia.Value, bool) {
	ad, aok := plainDense(a)
	bd, bok := plainDense(b)
	var t *tensor.Dense // a tensor operand, which gives the result's shape
	switch {
	case aok && bok:
		if ad.Dtype() != bd.Dtype() || !ad.Shape().Eq(bd.Shape()) {
			return nil, false
		}
		t = ad
	case aok:
		t = ad
	case bok:
		t = bd
	default:
		return nil, false
	}
	dt := t.Dtype()
	if t.Shape().IsScalar() || (dt != tensor.Float32 && dt != tensor.Float64) {
		return nil, false
	}
	var c *tensor.Dense
	if d, ok := plainDense(dst); reuse && ok && d.Dtype() == dt && d.Shape().Eq(t.Shape()) {
		c = d
	} else {
		c = tensor.New(tensor.Of(dt), tensor.WithShape(t.Shape().Clone()...))
	}
	if dt == tensor.Float32 {
		x, xs, xok := operand32(a, ad, aok)
		y, ys, yok := operand32(b, bd, bok)
		if !xok || !yok {
			return nil, false
		}
		elem(e, c.Float32s(), x, xs, y, ys)
	} else {
		x, xs, xok := operand64(a, ad, aok)
		y, ys, yok := operand64(b, bd, bok)
		if !xok || !yok {
			return nil, false
		}
		elem(e, c.Float64s(), x, xs, y, ys)
	}
	return c, true
}

// operand32 returns a float32 operand: the tensor's data if dense, else
// the scalar (ok false if v is neither).
func operand32(v gorgonia.Value, d *tensor.Dense, dense bool) ([]float32, float32, bool) {
	if dense {
		return d.Float32s(), 0, true
	}
	if s, ok := v.(*gorgonia.F32); ok {
		return nil, float32(*s), true
	}
	return nil, 0, false
}

// operand64 is operand32 for float64.
func operand64(v gorgonia.Value, d *tensor.Dense, dense bool) ([]float64, float64, bool) {
	if dense {
		return d.Float64s(), 0, true
	}
	if s, ok := v.(*gorgonia.F64); ok {
		return nil, float64(*s), true
	}
	return nil, 0, false
}

// elem sets c[i] = a[i] op b[i], where a nil a (or b) stands for the
// scalar as (bs) in every element; a and b have c's length.
func elem[T float32 | float64](e elemOp, c, a []T, as T, b []T, bs T) {
	switch {
	case a != nil && b != nil:
		a, b = a[:len(c)], b[:len(c)]
		switch e {
		case elemAdd:
			for i := range c {
				c[i] = a[i] + b[i]
			}
		case elemSub:
			for i := range c {
				c[i] = a[i] - b[i]
			}
		case elemMul:
			for i := range c {
				c[i] = a[i] * b[i]
			}
		}
	case a != nil:
		a = a[:len(c)]
		switch e {
		case elemAdd:
			for i := range c {
				c[i] = a[i] + bs
			}
		case elemSub:
			for i := range c {
				c[i] = a[i] - bs
			}
		case elemMul:
			for i := range c {
				c[i] = a[i] * bs
			}
		}
	default:
		b = b[:len(c)]
		switch e {
		case elemAdd:
			for i := range c {
				c[i] = as + b[i]
			}
		case elemSub:
			for i := range c {
				c[i] = as - b[i]
			}
		case elemMul:
			for i := range c {
				c[i] = as * b[i]
			}
		}
	}
}
