package pipeline

// More of Gorgonia's ops that cost more to dispatch than to compute on a
// micro-batch of a few rows, which the executor runs itself: tanh and
// square, with the functions tensor's engine applies (Gorgonia's op
// allocates its result on every call); the sum of a matrix over its rows
// (a bias's gradient), added row after row as tensor's reduction does; and
// a reshape of a tensor whose data has not moved since the last run, whose
// last value (a header over the same data) stays as it is. All bitwise the
// ops' results.

import (
	"math"
	"reflect"
	"sync"

	"github.com/chewxy/math32"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// fastOp is one of the unary ops of this file, recognised by compile.
type fastOp uint8

const (
	fastNone fastOp = iota
	fastSumRows
	fastReshape
	fastTanh
	fastSquare
)

// fastRef is the type and String of Gorgonia's Sum over axis 0, against
// which asFast recognises it.
var fastRef = sync.OnceValues(func() (sum reflect.Type, sumName string) {
	g := gorgonia.NewGraph()
	a := gorgonia.NewMatrix(g, tensor.Float64, gorgonia.WithShape(2, 3))
	s, err := gorgonia.Sum(a, 0)
	if err != nil {
		return nil, ""
	}
	return reflect.TypeOf(s.Op()), s.Op().String()
})

// reshapeRef is the type of Gorgonia's Reshape op.
var reshapeRef = sync.OnceValue(func() reflect.Type {
	g := gorgonia.NewGraph()
	a := gorgonia.NewMatrix(g, tensor.Float64, gorgonia.WithShape(2, 3))
	r, err := gorgonia.Reshape(a, tensor.Shape{3, 2})
	if err != nil {
		return nil
	}
	return reflect.TypeOf(r.Op())
})

// unaryRef is the type of Gorgonia's element-wise unary op and the
// Strings of its tanh and square, against which asFast recognises them.
var unaryRef = sync.OnceValues(func() (reflect.Type, map[string]fastOp) {
	g := gorgonia.NewGraph()
	a := gorgonia.NewMatrix(g, tensor.Float64, gorgonia.WithShape(2, 3))
	th, err := gorgonia.Tanh(a)
	if err != nil {
		return nil, nil
	}
	sq, err := gorgonia.Square(a)
	if err != nil || reflect.TypeOf(sq.Op()) != reflect.TypeOf(th.Op()) {
		return nil, nil
	}
	return reflect.TypeOf(th.Op()), map[string]fastOp{th.Op().String(): fastTanh, sq.Op().String(): fastSquare}
})

// asFast returns which of this file's ops op is, or fastNone.
func asFast(op gorgonia.Op) fastOp {
	if op == nil {
		return fastNone
	}
	t := reflect.TypeOf(op)
	if u, names := unaryRef(); u != nil && t == u {
		return names[op.String()]
	}
	if sum, name := fastRef(); sum != nil && t == sum && op.String() == name {
		return fastSumRows
	}
	if r := reshapeRef(); r != nil && t == r {
		return fastReshape
	}
	return fastNone
}

// run computes the op on a into a value of shape `shape` (the node's),
// reusing last (the node's last value) as run allows (own: last may be
// written). ok is false, and nothing is computed, for operands it does not
// handle: then the op runs as usual.
func (f fastOp) run(last gorgonia.Value, own bool, a gorgonia.Value, shape tensor.Shape) (gorgonia.Value, bool) {
	ad, ok := plainDense(a)
	if !ok {
		return nil, false
	}
	dt := ad.Dtype()
	if dt != tensor.Float32 && dt != tensor.Float64 {
		return nil, false
	}
	switch f {
	case fastReshape:
		// The last value is a header over a's data with the node's shape
		// (the op's ShallowClone and Reshape): if a's data has not moved,
		// it is what the op would make again.
		l, ok := last.(*tensor.Dense)
		if !ok || l.IsView() || l.Dtype() != dt || !l.Shape().Eq(shape) ||
			l.Uintptr() != ad.Uintptr() || l.MemSize() != ad.MemSize() {
			return nil, false
		}
		return l, true
	case fastTanh, fastSquare:
		if ad.Shape().IsScalar() || !shape.Eq(ad.Shape()) {
			return nil, false
		}
		var c *tensor.Dense
		if d, ok := plainDense(last); own && ok && d.Dtype() == dt && d.Shape().Eq(shape) {
			c = d
		} else {
			c = tensor.New(tensor.Of(dt), tensor.WithShape(shape.Clone()...))
		}
		if dt == tensor.Float32 {
			unary(f, c.Float32s(), ad.Float32s(), math32.Tanh)
		} else {
			unary(f, c.Float64s(), ad.Float64s(), math.Tanh)
		}
		return c, true
	case fastSumRows:
		if ad.Dims() != 2 || shape.TotalSize() != ad.Shape()[1] || ad.Shape()[0] == 0 {
			return nil, false
		}
		rows, cols := ad.Shape()[0], ad.Shape()[1]
		var c *tensor.Dense
		if d, ok := plainDense(last); own && ok && d.Dtype() == dt && d.Shape().Eq(shape) {
			c = d
		} else {
			c = tensor.New(tensor.Of(dt), tensor.WithShape(shape.Clone()...))
		}
		if dt == tensor.Float32 {
			sumRows32(c.Float32s(), ad.Float32s(), rows, cols)
		} else {
			sumRows64(c.Float64s(), ad.Float64s(), rows, cols)
		}
		return c, true
	}
	return nil, false
}

// sumRows32 sets c to the sum of the rows of a (rows x cols), adding them
// in order as tensor's reduction over axis 0 does.
func sumRows32(c, a []float32, rows, cols int) {
	c = c[:cols]
	copy(c, a[:cols])
	for r := 1; r < rows; r++ {
		row := a[r*cols : (r+1)*cols]
		for j := range c {
			c[j] += row[j]
		}
	}
}

// sumRows64 is sumRows32 for float64.
func sumRows64(c, a []float64, rows, cols int) {
	c = c[:cols]
	copy(c, a[:cols])
	for r := 1; r < rows; r++ {
		row := a[r*cols : (r+1)*cols]
		for j := range c {
			c[j] += row[j]
		}
	}
}

// unary sets c[i] = tanh(a[i]) or a[i]², with the functions tensor's
// engine uses: tanh is math32.Tanh for float32 and math.Tanh for float64,
// the square a product.
func unary[T float32 | float64](f fastOp, c, a []T, tanh func(T) T) {
	a = a[:len(c)]
	switch f {
	case fastTanh:
		for i := range c {
			c[i] = tanh(a[i])
		}
	case fastSquare:
		for i := range c {
			c[i] = a[i] * a[i]
		}
	}
}
