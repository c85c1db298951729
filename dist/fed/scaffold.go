package fed

import (
	"fmt"
	"math"
)

// WithScaffold corrects the clients' drift with control variates
// (SCAFFOLD, Karimireddy et al., ICML 2020, option II): the leader keeps a
// control variate c, each client one of its own, cᵢ, and every local
// gradient step adds c - cᵢ (Task.Correction) to the gradient, so that a
// client whose data is unlike the others' (a few classes of many) follows
// the federation's gradient rather than its own. After training, the
// client tells how (Task.Trained: steps and learning rate), Report derives
// cᵢ's change, Δcᵢ = -c - (y - x)/(K·η), and the leader moves c by the
// changes of the clients that took part divided by the number of clients
// in the job. FedAvg, the server optimizers and secure aggregation work as
// without it (with secure aggregation, Δcᵢ is summed securely too); the
// task and the update carry twice the values.
//
// A client's cᵢ lives in its process: a restarted client starts again from
// zero, while c still holds its earlier share, which the next rounds wear
// off. (Lead.)
func WithScaffold() Option {
	return func(c *config) error {
		c.scaffold = true
		c.only("WithScaffold", roleLeader)
		return nil
	}
}

// Trained records how the client trained on this task: steps optimizer
// steps at learning rate lr (for SGD with momentum β, pass lr/(1-β), the
// step its updates settle at). A round with SCAFFOLD (WithScaffold on the
// leader; Task.Correction is not nil) needs it before Report; otherwise it
// is ignored.
func (t *Task) Trained(steps int, lr float64) {
	t.steps, t.lr = steps, lr
}

// taskPayload is a task's payload: the model, and with SCAFFOLD the
// leader's control variate after it.
func (lp *loop) taskPayload() []byte {
	if !lp.l.cfg.scaffold {
		return lp.model()
	}
	lp.l.mu.Lock()
	v := make([]float32, 0, 2*len(lp.l.model))
	v = append(v, lp.l.model...)
	lp.l.mu.Unlock()
	for _, x := range lp.control {
		v = append(v, float32(x))
	}
	return vecBytes(v)
}

// updateLen is the number of values in an update: the model's, twice that
// with SCAFFOLD (the change of the client's control variate follows).
func (l *Leader) updateLen() int {
	if l.cfg.scaffold {
		return 2 * len(l.model)
	}
	return len(l.model)
}

// stepControl moves the leader's control variate by sum, the sum of the
// changes of the clients that took part, over the job's clients.
func (lp *loop) stepControl(sum []float64) {
	n := float64(lp.l.world - 1)
	for i, x := range sum {
		lp.control[i] += x / n
	}
}

// scaffoldUpdate is a client's update with SCAFFOLD: the weights' change
// dy, then the change of the client's control variate, Δcᵢ = -c -
// dy/(K·η), divided by samples when the update is summed securely (the
// secure sum is weighted by the sample count; the control variates are
// summed plain). It also moves the client's own control variate by Δcᵢ.
func scaffoldUpdate(ci, control, dy []float32, steps int, lr float64, samples int, secure bool) ([]float32, error) {
	if steps < 1 || !(lr > 0) || math.IsInf(lr, 0) {
		return nil, fmt.Errorf("fed: %w: a SCAFFOLD round needs Task.Trained(steps, lr) with steps >= 1 and lr > 0, got %d, %v", ErrInvalidArgument, steps, lr)
	}
	out := make([]float32, 2*len(dy))
	copy(out, dy)
	k := float32(float64(steps) * lr)
	for i, d := range dy {
		dc := -control[i] - d/k
		ci[i] += dc
		if secure {
			dc /= float32(samples)
		}
		out[len(dy)+i] = dc
	}
	return out, nil
}
