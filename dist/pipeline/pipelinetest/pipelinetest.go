// Package pipelinetest holds a small MLP that splits into pipeline stages by
// layer, shared by dist/pipeline's tests and bench/pipeline. It satisfies
// pipeline.Stage (and pipeline's optional Dtyper) without importing it.
package pipelinetest

import (
	"fmt"
	"math"
	"slices"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// MLPStage is layers [from, to) of an MLP with the given widths: layer l is
// x·w_l + b_l, followed by tanh except for the model's last layer. Rows is
// the number of rows of one micro-batch.
type MLPStage struct {
	sizes    []int
	from, to int
	rows     int
	dt       tensor.Dtype
	params   gorgonia.Nodes
}

// ParamVal is the deterministic initial value of layer l's weight (k = 0)
// or bias (k = 1) element i, before scaling.
func ParamVal(l, k, i int) float64 {
	return 0.5 * math.Sin(1.7*float64(l)+0.31*float64(i)+2.3*float64(k)+0.1)
}

// NewMLPStage adds layers [from, to) of the MLP with widths sizes to g, with
// deterministic initial values (the same for a layer whichever stage holds it).
func NewMLPStage(g *gorgonia.ExprGraph, sizes []int, from, to, rows int, dt tensor.Dtype) *MLPStage {
	s := &MLPStage{sizes: sizes, from: from, to: to, rows: rows, dt: dt}
	for l := from; l < to; l++ {
		in, out := sizes[l], sizes[l+1]
		w := make([]float64, in*out)
		for i := range w {
			w[i] = ParamVal(l, 0, i) / math.Sqrt(float64(in))
		}
		b := make([]float64, out)
		for i := range b {
			b[i] = 0.1 * ParamVal(l, 1, i)
		}
		s.params = append(s.params,
			gorgonia.NewMatrix(g, dt, gorgonia.WithShape(in, out), gorgonia.WithName(fmt.Sprintf("w%d", l)),
				gorgonia.WithValue(Dense(dt, []int{in, out}, w))),
			gorgonia.NewVector(g, dt, gorgonia.WithShape(out), gorgonia.WithName(fmt.Sprintf("b%d", l)),
				gorgonia.WithValue(Dense(dt, []int{out}, b))))
	}
	return s
}

// InputShape is the shape of one micro-batch entering the stage.
func (s *MLPStage) InputShape() tensor.Shape { return tensor.Shape{s.rows, s.sizes[s.from]} }

// OutputShape is the shape of one micro-batch leaving the stage.
func (s *MLPStage) OutputShape() tensor.Shape { return tensor.Shape{s.rows, s.sizes[s.to]} }

// Learnables returns the stage's parameters (w, b per layer); the slice is new.
func (s *MLPStage) Learnables() gorgonia.Nodes { return slices.Clone(s.params) }

// Dtype is the stage's element type.
func (s *MLPStage) Dtype() tensor.Dtype { return s.dt }

// Forward adds the stage's layers on top of x.
func (s *MLPStage) Forward(x *gorgonia.Node) (*gorgonia.Node, error) {
	h := x
	for l := s.from; l < s.to; l++ {
		k := 2 * (l - s.from)
		z, err := gorgonia.Mul(h, s.params[k])
		if err != nil {
			return nil, err
		}
		if z, err = gorgonia.BroadcastAdd(z, s.params[k+1], nil, []byte{0}); err != nil {
			return nil, err
		}
		if l < len(s.sizes)-2 {
			if z, err = gorgonia.Tanh(z); err != nil {
				return nil, err
			}
		}
		h = z
	}
	return h, nil
}

// MSE is the mean squared error over all elements.
func MSE(out, target *gorgonia.Node) (*gorgonia.Node, error) {
	d, err := gorgonia.Sub(out, target)
	if err != nil {
		return nil, err
	}
	sq, err := gorgonia.Square(d)
	if err != nil {
		return nil, err
	}
	return gorgonia.Mean(sq)
}

// Dense returns a tensor of dtype dt (Float32 or Float64) and the given shape
// holding a copy of vals.
func Dense(dt tensor.Dtype, shape []int, vals []float64) *tensor.Dense {
	if dt == tensor.Float32 {
		f := make([]float32, len(vals))
		for i, v := range vals {
			f[i] = float32(v)
		}
		return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(f))
	}
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(slices.Clone(vals)))
}
