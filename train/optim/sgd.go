package optim

import "gorgonia.org/gorgonia"

// SGD is stochastic gradient descent, step for step and bit for bit
// gorgonia.VanillaSolver: w -= eta * clip(batchScale(g + l1*sign(w) + l2*w)).
// It keeps no per-parameter slots; its State still records the parameters
// and the step count.
type SGD struct{ base }

var _ Solver = (*SGD)(nil)

// NewSGD returns an SGD solver. Defaults, as Gorgonia's: learning rate 0.001,
// batch 1, no regularisation, no clipping.
func NewSGD(opts ...Option) (*SGD, error) {
	s := &SGD{base{kind: KindSGD, h: Hyper{LearnRate: 0.001, Batch: 1}}}
	if err := s.configure("NewSGD", opts); err != nil {
		return nil, err
	}
	return s, nil
}

// Step applies one update to every parameter of model from its gradient
// (param.Grad(), the dual value) and zeroes the gradient, as Gorgonia's
// solvers do. It checks every parameter before updating any: on error nothing
// has changed.
func (s *SGD) Step(model []gorgonia.ValueGrad) error {
	if err := s.begin(model); err != nil {
		return err
	}
	c32 := newCoef[float32](s.h, 0, 0)
	c64 := newCoef[float64](s.h, 0, 0)
	for _, bd := range s.binds {
		switch {
		case bd.w32 != nil:
			sgdDense(&c32, bd.w32, bd.g32)
		case bd.w64 != nil:
			sgdDense(&c64, bd.w64, bd.g64)
		case bd.sw32 != nil:
			sgdScalar(&c32, (*float32)(bd.sw32), (*float32)(bd.sg32))
		case bd.sw64 != nil:
			sgdScalar(&c64, (*float64)(bd.sw64), (*float64)(bd.sg64))
		}
	}
	return nil
}
