package fed

import "math"

// ServerOptimizer moves the global model by a round's average update. delta
// is the sample-weighted mean, over the clients whose updates were averaged,
// of their new weights minus the model they started the round from — the
// pseudo-gradient of Reddi et al., "Adaptive Federated Optimization" (ICLR
// 2021), with the sign of a step: model + delta is the clients' weighted
// average. Step updates model in place. It is called by the leader's round
// only, never concurrently, and not for a round no update reached.
type ServerOptimizer interface {
	Step(model []float32, delta []float64)
}

// FedAvg is the server step of McMahan et al. (2017): the model becomes the
// clients' sample-weighted average (LR 1), or moves LR of the way there.
// It is what Lead uses without WithServerOptimizer.
type FedAvg struct {
	LR float64 // server learning rate; 0 means 1
}

// Step implements ServerOptimizer.
func (o *FedAvg) Step(model []float32, delta []float64) {
	lr := o.LR
	if lr == 0 {
		lr = 1
	}
	for i, d := range delta {
		model[i] = float32(float64(model[i]) + lr*d)
	}
}

// FedAvgM is FedAvg with server momentum (Hsu et al., 2019; Flower's
// FedAvgM): v = Momentum·v + delta, model += LR·v.
type FedAvgM struct {
	LR       float64 // server learning rate; 0 means 1
	Momentum float64 // 0 means 0.9

	v []float64
}

// Step implements ServerOptimizer.
func (o *FedAvgM) Step(model []float32, delta []float64) {
	lr, beta := or(o.LR, 1), or(o.Momentum, 0.9)
	if len(o.v) != len(delta) {
		o.v = make([]float64, len(delta))
	}
	for i, d := range delta {
		o.v[i] = beta*o.v[i] + d
		model[i] = float32(float64(model[i]) + lr*o.v[i])
	}
}

// adaptive is the state and step shared by FedAdam, FedYogi and
// FedAdagrad, which differ only in how they update the second moment
// (Reddi et al. 2021, Algorithm 2): m = β1·m + (1-β1)·Δ; v from Δ²;
// model += η·m/(√v + τ). m starts at 0 and v at τ², as the paper has it.
type adaptive struct {
	m, v []float64
}

func (a *adaptive) step(model []float32, delta []float64, eta, beta1, tau float64, second func(v, d2 float64) float64) {
	if len(a.m) != len(delta) {
		a.m = make([]float64, len(delta))
		a.v = make([]float64, len(delta))
		for i := range a.v {
			a.v[i] = tau * tau
		}
	}
	for i, d := range delta {
		a.m[i] = beta1*a.m[i] + (1-beta1)*d
		a.v[i] = second(a.v[i], d*d)
		model[i] = float32(float64(model[i]) + eta*a.m[i]/(math.Sqrt(a.v[i])+tau))
	}
}

// FedAdam is the adaptive server optimizer FedAdam of Reddi et al. (2021):
// v = β2·v + (1-β2)·Δ². The zero value takes the paper's usual settings:
// η = 0.01, β1 = 0.9, β2 = 0.99, τ = 1e-3.
type FedAdam struct {
	LR, Beta1, Beta2, Tau float64 // η, β1, β2, τ; 0 means the default

	adaptive
}

// Step implements ServerOptimizer.
func (o *FedAdam) Step(model []float32, delta []float64) {
	b2 := or(o.Beta2, 0.99)
	o.step(model, delta, or(o.LR, 1e-2), or(o.Beta1, 0.9), or(o.Tau, 1e-3), func(v, d2 float64) float64 {
		return b2*v + (1-b2)*d2
	})
}

// FedYogi is FedYogi of Reddi et al. (2021): v = v - (1-β2)·Δ²·sign(v-Δ²),
// which grows v more slowly than FedAdam when updates are large. Defaults
// as FedAdam's.
type FedYogi struct {
	LR, Beta1, Beta2, Tau float64 // η, β1, β2, τ; 0 means the default

	adaptive
}

// Step implements ServerOptimizer.
func (o *FedYogi) Step(model []float32, delta []float64) {
	b2 := or(o.Beta2, 0.99)
	o.step(model, delta, or(o.LR, 1e-2), or(o.Beta1, 0.9), or(o.Tau, 1e-3), func(v, d2 float64) float64 {
		return v - (1-b2)*d2*sign(v-d2)
	})
}

// FedAdagrad is FedAdagrad of Reddi et al. (2021): v = v + Δ². Defaults:
// η = 0.01, β1 = 0.9 (Beta1 < 0 means 0: no momentum), τ = 1e-3.
type FedAdagrad struct {
	LR, Beta1, Tau float64 // η, β1, τ; 0 means the default

	adaptive
}

// Step implements ServerOptimizer.
func (o *FedAdagrad) Step(model []float32, delta []float64) {
	o.step(model, delta, or(o.LR, 1e-2), max(or(o.Beta1, 0.9), 0), or(o.Tau, 1e-3), func(v, d2 float64) float64 {
		return v + d2
	})
}

// or returns x, or def when x is 0.
func or(x, def float64) float64 {
	if x == 0 {
		return def
	}
	return x
}

func sign(x float64) float64 {
	switch {
	case x > 0:
		return 1
	case x < 0:
		return -1
	}
	return 0
}
