package optim

import "math"

// The kernels below reproduce, element by element, the sequence of tensor
// operations that Gorgonia v0.9.18's solvers (solvers.go) run on a
// *tensor.Dense, and the scalar arithmetic they run on *gorgonia.F32 and
// *gorgonia.F64. Gorgonia runs each operation as a separate pass over the
// vector (tensor's internal/execution loops and vecf32/vecf64, all plain
// IEEE-754 operations rounded to the element type), so every intermediate is
// rounded to T before the next operation reads it. One fused loop gives the
// same bits provided each intermediate is rounded the same way: the explicit
// T(...) conversions mark those roundings (and, by the Go spec, forbid the
// compiler from fusing a multiply into an add across them).
//
// Square roots: tensor uses math32.Sqrt for float32 and math.Sqrt for
// float64, both correctly rounded, and a float32 square root computed in
// float64 and rounded back is also correctly rounded (53 >= 2*24+2), so
// T(math.Sqrt(float64(x))) gives the same bits for both.
//
// Where Gorgonia writes a multiply and an add in one expression (tensor's
// MulIncr loop incr[i] += a[i]*b, and the scalar paths), the kernels write
// the same expression, so that a compiler that fuses it (FMA, on arm64 and
// others) fuses both alike. Bitwise identity is tested on amd64, where Go
// never fuses.

type float interface{ float32 | float64 }

// coef holds a solver's hyper-parameters converted to the element type the
// way Gorgonia converts them.
type coef[T float] struct {
	l1, l2          T
	clip, negClip   T
	negEta, eta     T
	momentum        T
	beta1, beta2    T
	omb1, omb2      T
	eps             T
	onePerBatch     T
	batch           T
	cv1, cv2        T // 1/(1-beta1^t), 1/(1-beta2^t)
	useL1, useL2    bool
	useBatch        bool
	useClip         bool
	scalarBatchTest bool // the scalar paths test batch > 1 in T
}

// newCoef converts h for element type T. correction1 and correction2 are
// Adam's bias corrections 1-beta^t, computed in float64 as Gorgonia does.
func newCoef[T float](h Hyper, correction1, correction2 float64) coef[T] {
	c := coef[T]{
		l1:          T(h.L1Reg),
		l2:          T(h.L2Reg),
		clip:        T(h.Clip),
		negClip:     -T(h.Clip),
		negEta:      -T(h.LearnRate),
		eta:         T(h.LearnRate),
		momentum:    T(h.Momentum),
		beta1:       T(h.Beta1),
		beta2:       T(h.Beta2),
		omb1:        T(1) - T(h.Beta1),
		omb2:        T(1) - T(h.Beta2),
		eps:         T(h.Eps),
		onePerBatch: T(1) / T(h.Batch),
		batch:       T(h.Batch),
		cv1:         T(1) / T(correction1),
		cv2:         T(1) / T(correction2),
		useL1:       h.UseL1Reg,
		useL2:       h.UseL2Reg,
		useBatch:    h.Batch > 1,
		useClip:     h.Clip > 0,
	}
	c.scalarBatchTest = c.batch > 1
	return c
}

// sign is tensor's Sign: -1 below zero, 1 above, x itself otherwise (±0, NaN).
func sign[T float](x T) T {
	if x < 0 {
		return -1
	}
	if x > 0 {
		return 1
	}
	return x
}

// clamp is tensor's Clamp for lo < hi, both finite.
func clamp[T float](x, lo, hi T) T {
	if x < lo {
		return lo
	}
	if x > hi {
		return hi
	}
	return x
}

// regularise and scale are the gradient preparation that every Dense path
// shares: L1 (of r), L2 (of r), then 1/batch, clip. r is the weight for SGD
// and Adam, and the velocity for Momentum (Gorgonia regularises the velocity
// there). They are two functions, called under hoisted flags, so that both
// are inlined into the kernels' loops.
func regularise[T float](c *coef[T], g, r T) T {
	if c.useL1 {
		g = g + T(c.l1*sign(r))
	}
	if c.useL2 {
		g = g + T(r*c.l2)
	}
	return g
}

func scale[T float](c *coef[T], g T) T {
	if c.useBatch {
		g = T(g * c.onePerBatch)
	}
	if c.useClip {
		g = clamp(g, c.negClip, c.clip)
	}
	return g
}

// prepScalar is the gradient preparation of Gorgonia's *F32/*F64 paths,
// which differ from the Dense paths in L1: the weight's sign is taken as +1
// at zero and NaN.
func prepScalar[T float](c *coef[T], g, w T) T {
	if c.useL1 {
		l1 := c.l1
		if w < 0 {
			l1 = -l1
		}
		g += l1
	}
	if c.useL2 {
		g += c.l2 * w
	}
	if c.scalarBatchTest {
		g = T(g * c.onePerBatch)
	}
	if c.useClip {
		if g > c.clip {
			g = c.clip
		} else if g < -c.clip {
			g = -c.clip
		}
	}
	return g
}

// sgdDense: g = prep(g); g *= -eta; w += g; g = 0.
func sgdDense[T float](c *coef[T], w, g []T) {
	g = g[:len(w)]
	reg, sc := c.useL1 || c.useL2, c.useBatch || c.useClip
	for i := range w {
		gi := g[i]
		if reg {
			gi = regularise(c, gi, w[i])
		}
		if sc {
			gi = scale(c, gi)
		}
		gi = T(gi * c.negEta)
		w[i] = w[i] + gi
		g[i] = 0
	}
}

// sgdScalar: w += -eta * prep(g).
func sgdScalar[T float](c *coef[T], w, g *T) {
	gi := prepScalar(c, *g, *w)
	upd := -c.eta * gi
	*w += upd
	*g = 0
}

// momentumDense: g = prep(g, vel); g *= -eta; vel *= momentum; vel += g;
// w += vel; g = 0.
func momentumDense[T float](c *coef[T], w, g, vel []T) {
	g = g[:len(w)]
	reg, sc := c.useL1 || c.useL2, c.useBatch || c.useClip
	vel = vel[:len(w)]
	for i := range w {
		v := vel[i]
		gi := g[i]
		if reg {
			gi = regularise(c, gi, v)
		}
		if sc {
			gi = scale(c, gi)
		}
		gi = T(gi * c.negEta)
		v = T(v*c.momentum) + gi
		vel[i] = v
		w[i] = w[i] + v
		g[i] = 0
	}
}

// momentumScalar: c = vel*momentum - eta*prep(g, w); w += c. Gorgonia's
// scalar path never stores the new velocity, so vel is read, not written.
func momentumScalar[T float](c *coef[T], w, g, vel *T) {
	gi := prepScalar(c, *g, *w)
	v := *vel*c.momentum - c.eta*gi
	*w = *w + v
	*g = 0
}

// adamDense mirrors AdamSolver.Step on a *tensor.Dense:
//
//	g = prep(g, w)
//	t1 = g * (1-beta1); g = g*g; g *= (1-beta2)
//	m = t1 + m*beta1; v = g + v*beta2
//	mh = m * cv1; vh = sqrt(v * cv2) + eps
//	w += (mh * -eta) / vh; g = 0
func adamDense[T float](c *coef[T], w, g, m, v []T) {
	g = g[:len(w)]
	reg, sc := c.useL1 || c.useL2, c.useBatch || c.useClip
	m = m[:len(w)]
	v = v[:len(w)]
	for i := range w {
		gi := g[i]
		if reg {
			gi = regularise(c, gi, w[i])
		}
		if sc {
			gi = scale(c, gi)
		}
		t1 := T(gi * c.omb1)
		g2 := T(T(gi*gi) * c.omb2)
		mi := t1 + m[i]*c.beta1 // tensor's MulIncr: incr[i] += a[i]*b
		vi := g2 + v[i]*c.beta2
		m[i] = mi
		v[i] = vi
		mh := T(mi * c.cv1)
		vh := T(math.Sqrt(float64(T(vi * c.cv2))))
		vh = vh + c.eps
		mh = T(mh * c.negEta)
		w[i] = w[i] + mh/vh
		g[i] = 0
	}
}

// adamScalar mirrors AdamSolver.Step on *F32/*F64, whose second moment
// multiplies (1-beta2)*g first and then g.
func adamScalar[T float](c *coef[T], w, g, m, v *T) {
	gi := prepScalar(c, *g, *w)
	mi := c.beta1**m + c.omb1*gi
	vi := c.beta2**v + c.omb2*gi*gi
	*m = mi
	*v = vi
	mh := T(c.cv1 * mi)
	vh := T(c.cv2 * vi)
	upd := -c.eta * mh / (T(math.Sqrt(float64(vh))) + c.eps)
	*w = *w + upd
	*g = 0
}
