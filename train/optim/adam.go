package optim

import "gorgonia.org/gorgonia"

// Adam is the Adam solver, step for step and bit for bit
// gorgonia.AdamSolver (Kingma and Ba, with the bias corrections applied to the
// moments and eps added outside the square root). Its slots are "m" (the mean
// of gradients) and "v" (the mean of squared gradients); its iteration count
// drives the bias correction.
type Adam struct{ base }

var _ Solver = (*Adam)(nil)

// NewAdam returns an Adam solver. Defaults, as Gorgonia's: learning rate
// 0.001, eps 1e-8, beta1 0.9, beta2 0.999, batch 1, no regularisation, no
// clipping.
func NewAdam(opts ...Option) (*Adam, error) {
	s := &Adam{base{kind: KindAdam, h: Hyper{LearnRate: 0.001, Eps: 1e-8, Beta1: 0.9, Beta2: 0.999, Batch: 1}}}
	if err := s.configure("NewAdam", opts); err != nil {
		return nil, err
	}
	return s, nil
}

// Step applies one update to every parameter of model from its gradient
// (param.Grad(), the dual value) and zeroes the gradient, as Gorgonia's
// solvers do. It checks every parameter before updating any: on error nothing
// has changed (Gorgonia's would still count the step).
func (s *Adam) Step(model []gorgonia.ValueGrad) error {
	if err := s.begin(model); err != nil {
		return err
	}
	c1, c2 := s.corrections()
	c32 := newCoef[float32](s.h, c1, c2)
	c64 := newCoef[float64](s.h, c1, c2)
	for i, bd := range s.binds {
		m, v := s.state[i].Slots[0], s.state[i].Slots[1]
		switch {
		case bd.w32 != nil:
			adamDense(&c32, bd.w32, bd.g32, m.F32, v.F32)
		case bd.w64 != nil:
			adamDense(&c64, bd.w64, bd.g64, m.F64, v.F64)
		case bd.sw32 != nil:
			adamScalar(&c32, (*float32)(bd.sw32), (*float32)(bd.sg32), &m.F32[0], &v.F32[0])
		case bd.sw64 != nil:
			adamScalar(&c64, (*float64)(bd.sw64), (*float64)(bd.sg64), &m.F64[0], &v.F64[0])
		}
	}
	return nil
}
