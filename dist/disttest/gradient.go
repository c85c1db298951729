package disttest

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/gdist/gdist/dist"
)

// Gradient is one tensor whose gradient CheckGradients checks.
type Gradient struct {
	// Name names the tensor in failure messages.
	Name string
	// Data is the backing slice of the tensor's value, which the check
	// perturbs in place (and restores); Grad is the gradient to check.
	Data, Grad []float64
	// Replicated means every rank holds the same Data (an input every
	// member of a tensor-parallel group holds whole): an element is
	// perturbed on every rank at once. Otherwise each rank holds its own
	// tensor (its part of a split weight, or its own input), perhaps of
	// another length, and an element is perturbed on its rank alone.
	Replicated bool
}

// CheckGradients compares each rank's gradients with central differences
// of a loss that every rank of pg computes together: loss runs the rank's
// graph and returns the global loss, the same value on every rank (a loss
// every member computes, or one all-reduced inside loss). Every rank calls
// it, with its gradients in the same order and the same Replicated flags:
// the ranks perturb the elements in turn (for a rank's own tensor, its
// elements while the others evaluate the unperturbed loss with it), by
// ±eps, and a rank reports on t every element of its tensors whose
// difference quotient differs from the gradient by more than tol·max(1,
// |quotient|). The error is that of loss or of a collective.
func CheckGradients(t testing.TB, pg *dist.ProcessGroup, loss func() (float64, error), grads []Gradient, eps, tol float64) error {
	t.Helper()
	quotient := func(data []float64, i int, mine bool) (float64, error) {
		var orig float64
		if mine {
			orig = data[i]
			data[i] = orig + eps
		}
		lp, err := loss()
		if err != nil {
			return 0, err
		}
		if mine {
			data[i] = orig - eps
		}
		lm, err := loss()
		if mine {
			data[i] = orig
		}
		return (lp - lm) / (2 * eps), err
	}
	check := func(g Gradient, i int, num float64) {
		if math.Abs(num-g.Grad[i]) > tol*math.Max(1, math.Abs(num)) {
			t.Errorf("rank %d %s[%d]: central difference %v, gradient %v", pg.Rank(), g.Name, i, num, g.Grad[i])
		}
	}
	n, me := pg.WorldSize(), pg.Rank()
	lens := make([]float64, len(grads))
	for k, g := range grads {
		lens[k] = float64(len(g.Data))
	}
	all := make([]float64, n*len(grads)) // rank r's length of tensor k at r*len(grads)+k
	if err := pg.AllGather(context.Background(), dist.F64(all), dist.F64(lens)); err != nil {
		return err
	}
	for k, g := range grads {
		if len(g.Grad) != len(g.Data) {
			return fmt.Errorf("disttest: %s: %d gradient elements for %d values", g.Name, len(g.Grad), len(g.Data))
		}
		if g.Replicated {
			for i := range g.Data {
				num, err := quotient(g.Data, i, true)
				if err != nil {
					return err
				}
				check(g, i, num)
			}
			continue
		}
		for owner := range n {
			for i := range int(all[owner*len(grads)+k]) {
				num, err := quotient(g.Data, i, owner == me)
				if err != nil {
					return err
				}
				if owner == me {
					check(g, i, num)
				}
			}
		}
	}
	return nil
}
