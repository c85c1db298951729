package optim

import "math"

// The options mirror Gorgonia's SolverOpts of the same names, but each
// constructor accepts only the options that apply to it (WithBeta1 does not
// compile as an SGD option), and values are validated by the constructor.

// SGDOption configures NewSGD.
type SGDOption interface{ sgd() option }

// MomentumOption configures NewMomentum.
type MomentumOption interface{ momentum() option }

// AdamOption configures NewAdam.
type AdamOption interface{ adam() option }

// CommonOption is an option that every solver accepts.
type CommonOption struct{ o option }

func (c CommonOption) sgd() option      { return c.o }
func (c CommonOption) momentum() option { return c.o }
func (c CommonOption) adam() option     { return c.o }

type momentumOnly struct{ o option }

func (c momentumOnly) momentum() option { return c.o }

type adamOnly struct{ o option }

func (c adamOnly) adam() option { return c.o }

// option sets one hyper-parameter after checking its value.
type option struct {
	name  string
	v     float64
	check func(float64) string // "" if valid, else what the value must be
	set   func(*Hyper, float64)
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

func nonNegative(x float64) string {
	if finite(x) && x >= 0 {
		return ""
	}
	return "must be finite and >= 0"
}

func positive(x float64) string {
	if finite(x) && x > 0 {
		return ""
	}
	return "must be finite and > 0"
}

func unitInterval(x float64) string {
	if finite(x) && x >= 0 && x < 1 {
		return ""
	}
	return "must be in [0, 1)"
}

// WithLearnRate sets the step size (default 0.001).
func WithLearnRate(eta float64) CommonOption {
	return CommonOption{option{"WithLearnRate", eta, nonNegative, func(h *Hyper, v float64) { h.LearnRate = v }}}
}

// WithL2Reg adds an L2 penalty l2*w to every gradient (Gorgonia's Momentum
// penalises the velocity instead of w on tensors; this package does the same).
// Default: none. WithL2Reg(0) is not the same as none: Gorgonia then still
// adds w*0 to the gradient, which turns -0 into +0 and inf weights into NaN
// gradients, and so does this package.
func WithL2Reg(l2 float64) CommonOption {
	return CommonOption{option{"WithL2Reg", l2, nonNegative, func(h *Hyper, v float64) { h.L2Reg, h.UseL2Reg = v, true }}}
}

// WithL1Reg adds an L1 penalty l1*sign(w) to every gradient (of the velocity
// for Momentum on tensors, as Gorgonia does). Default: none.
func WithL1Reg(l1 float64) CommonOption {
	return CommonOption{option{"WithL1Reg", l1, nonNegative, func(h *Hyper, v float64) { h.L1Reg, h.UseL1Reg = v, true }}}
}

// WithClip clamps every (regularised, batch-scaled) gradient element to
// [-clip, clip]. clip must be > 0. Default: no clipping.
func WithClip(clip float64) CommonOption {
	return CommonOption{option{"WithClip", clip, positive, func(h *Hyper, v float64) { h.Clip = v }}}
}

// WithBatchSize divides every gradient by batch when batch > 1 (default 1).
func WithBatchSize(batch float64) CommonOption {
	return CommonOption{option{"WithBatchSize", batch, positive, func(h *Hyper, v float64) { h.Batch = v }}}
}

// WithMomentum sets Momentum's velocity decay (default 0.9).
func WithMomentum(momentum float64) MomentumOption {
	return momentumOnly{option{"WithMomentum", momentum, nonNegative, func(h *Hyper, v float64) { h.Momentum = v }}}
}

// WithBeta1 sets Adam's first-moment decay (default 0.9).
func WithBeta1(beta1 float64) AdamOption {
	return adamOnly{option{"WithBeta1", beta1, unitInterval, func(h *Hyper, v float64) { h.Beta1 = v }}}
}

// WithBeta2 sets Adam's second-moment decay (default 0.999).
func WithBeta2(beta2 float64) AdamOption {
	return adamOnly{option{"WithBeta2", beta2, unitInterval, func(h *Hyper, v float64) { h.Beta2 = v }}}
}

// WithEps sets Adam's denominator smoothing (default 1e-8).
func WithEps(eps float64) AdamOption {
	return adamOnly{option{"WithEps", eps, nonNegative, func(h *Hyper, v float64) { h.Eps = v }}}
}

// configure applies opts to h, validating each.
func configure(h *Hyper, opts []option) error {
	for _, o := range opts {
		if reason := o.check(o.v); reason != "" {
			return &OptionError{Option: o.name, Value: o.v, Reason: reason}
		}
		o.set(h, o.v)
	}
	return nil
}
