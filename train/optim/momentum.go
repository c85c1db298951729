package optim

import "gorgonia.org/gorgonia"

// Momentum is SGD with momentum, step for step and bit for bit
// gorgonia.Momentum: vel = vel*momentum - eta*g; w += vel, where g is the
// gradient regularised and clipped as in SGD.
//
// Two Gorgonia behaviours are kept, because bitwise identity is the
// contract: on tensors the L1/L2 penalties are computed from the velocity,
// not the weights; and on scalar parameters (*gorgonia.F32, *gorgonia.F64)
// the new velocity is never stored, so they are updated as by plain SGD.
type Momentum struct{ base }

var _ Solver = (*Momentum)(nil)

// NewMomentum returns a Momentum solver. Defaults, as Gorgonia's: learning
// rate 0.001, momentum 0.9, batch 1, no regularisation, no clipping.
func NewMomentum(opts ...Option) (*Momentum, error) {
	s := &Momentum{base{kind: KindMomentum, h: Hyper{LearnRate: 0.001, Momentum: 0.9, Batch: 1}}}
	if err := s.configure("NewMomentum", opts); err != nil {
		return nil, err
	}
	return s, nil
}

// Step applies one update to every parameter of model from its gradient
// (param.Grad(), the dual value) and zeroes the gradient, as Gorgonia's
// solvers do. It checks every parameter before updating any: on error nothing
// has changed.
func (s *Momentum) Step(model []gorgonia.ValueGrad) error {
	if err := s.begin(model); err != nil {
		return err
	}
	c32 := newCoef[float32](s.h, 0, 0)
	c64 := newCoef[float64](s.h, 0, 0)
	for i, bd := range s.binds {
		vel := s.state[i].Slots[0]
		switch {
		case bd.w32 != nil:
			momentumDense(&c32, bd.w32, bd.g32, vel.F32)
		case bd.w64 != nil:
			momentumDense(&c64, bd.w64, bd.g64, vel.F64)
		case bd.sw32 != nil:
			momentumScalar(&c32, (*float32)(bd.sw32), (*float32)(bd.sg32), &vel.F32[0])
		case bd.sw64 != nil:
			momentumScalar(&c64, (*float64)(bd.sw64), (*float64)(bd.sg64), &vel.F64[0])
		}
	}
	return nil
}
