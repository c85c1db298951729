package optim

import (
	"math"

	"github.com/gdist/gdist/internal/options"
)

// The options mirror Gorgonia's SolverOpts of the same names. Every
// constructor takes the one Option type, checks each value as it applies
// it, and refuses an option that does not apply to its solver (WithBeta1
// given to NewSGD) with an *OptionError naming it; both match
// ErrInvalidArgument.

// Option configures NewSGD, NewMomentum or NewAdam. WithLearnRate,
// WithL2Reg, WithL1Reg, WithClip and WithBatchSize apply to every solver;
// WithMomentum to Momentum only; WithBeta1, WithBeta2 and WithEps to Adam
// only. A nil Option is refused.
type Option func(*config) error

// config is what a constructor's options configure: the hyper-parameters of
// a solver of the given kind.
type config struct {
	kind Kind
	h    Hyper
}

// hyperOption is an option that sets one hyper-parameter to v after
// checking it. only, if not empty, is the one kind of solver it applies to.
func hyperOption(name string, v float64, only Kind, check func(float64) string, set func(*Hyper, float64)) Option {
	return func(c *config) error {
		if only != "" && c.kind != only {
			return &OptionError{Option: name, Value: v, Reason: "applies to " + string(only) + " only, not to " + string(c.kind)}
		}
		if reason := check(v); reason != "" {
			return &OptionError{Option: name, Value: v, Reason: reason}
		}
		set(&c.h, v)
		return nil
	}
}

// configure applies opts, in order, to b's hyper-parameters (its kind's
// defaults); ctor names the constructor in the error of a nil option.
func (b *base) configure(ctor string, opts []Option) error {
	c := config{kind: b.kind, h: b.h}
	if err := options.Apply(&c, opts, "optim: "+ctor, ErrInvalidArgument); err != nil {
		return err
	}
	b.h = c.h
	return nil
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
func WithLearnRate(eta float64) Option {
	return hyperOption("WithLearnRate", eta, "", nonNegative, func(h *Hyper, v float64) { h.LearnRate = v })
}

// WithL2Reg adds an L2 penalty l2*w to every gradient (Gorgonia's Momentum
// penalises the velocity instead of w on tensors; this package does the same).
// Default: none. WithL2Reg(0) is not the same as none: Gorgonia then still
// adds w*0 to the gradient, which turns -0 into +0 and inf weights into NaN
// gradients, and so does this package.
func WithL2Reg(l2 float64) Option {
	return hyperOption("WithL2Reg", l2, "", nonNegative, func(h *Hyper, v float64) { h.L2Reg, h.UseL2Reg = v, true })
}

// WithL1Reg adds an L1 penalty l1*sign(w) to every gradient (of the velocity
// for Momentum on tensors, as Gorgonia does). Default: none.
func WithL1Reg(l1 float64) Option {
	return hyperOption("WithL1Reg", l1, "", nonNegative, func(h *Hyper, v float64) { h.L1Reg, h.UseL1Reg = v, true })
}

// WithClip clamps every (regularised, batch-scaled) gradient element to
// [-clip, clip]. clip must be > 0. Default: no clipping.
func WithClip(clip float64) Option {
	return hyperOption("WithClip", clip, "", positive, func(h *Hyper, v float64) { h.Clip = v })
}

// WithBatchSize divides every gradient by batch when batch > 1 (default 1).
func WithBatchSize(batch float64) Option {
	return hyperOption("WithBatchSize", batch, "", positive, func(h *Hyper, v float64) { h.Batch = v })
}

// WithMomentum sets Momentum's velocity decay (default 0.9). Momentum only.
func WithMomentum(momentum float64) Option {
	return hyperOption("WithMomentum", momentum, KindMomentum, nonNegative, func(h *Hyper, v float64) { h.Momentum = v })
}

// WithBeta1 sets Adam's first-moment decay (default 0.9). Adam only.
func WithBeta1(beta1 float64) Option {
	return hyperOption("WithBeta1", beta1, KindAdam, unitInterval, func(h *Hyper, v float64) { h.Beta1 = v })
}

// WithBeta2 sets Adam's second-moment decay (default 0.999). Adam only.
func WithBeta2(beta2 float64) Option {
	return hyperOption("WithBeta2", beta2, KindAdam, unitInterval, func(h *Hyper, v float64) { h.Beta2 = v })
}

// WithEps sets Adam's denominator smoothing (default 1e-8). Adam only.
func WithEps(eps float64) Option {
	return hyperOption("WithEps", eps, KindAdam, nonNegative, func(h *Hyper, v float64) { h.Eps = v })
}
