package optim_test

import (
	"errors"
	"fmt"
	"log"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/train/optim"
)

// quadratic builds loss = sum(w²) over a parameter w and returns a machine
// that computes the loss and w's gradient.
func quadratic() (*gorgonia.Node, gorgonia.VM) {
	g := gorgonia.NewGraph()
	w := gorgonia.NewVector(g, tensor.Float64, gorgonia.WithShape(3), gorgonia.WithName("w"),
		gorgonia.WithValue(tensor.New(tensor.WithBacking([]float64{1, -2, 3}))))
	loss := gorgonia.Must(gorgonia.Sum(gorgonia.Must(gorgonia.Square(w))))
	if _, err := gorgonia.Grad(loss, w); err != nil {
		log.Fatal(err)
	}
	return w, gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(w))
}

// train runs steps steps of solver on w.
func train(w *gorgonia.Node, vm gorgonia.VM, solver gorgonia.Solver, steps int) {
	for range steps {
		if err := vm.RunAll(); err != nil {
			log.Fatal(err)
		}
		if err := solver.Step(gorgonia.NodesToValueGrads(gorgonia.Nodes{w})); err != nil {
			log.Fatal(err)
		}
		vm.Reset()
	}
}

// Train with Adam, save its state half way, resume in a fresh solver: the
// result is the uninterrupted run's, bit for bit.
func Example() {
	w1, vm1 := quadratic()
	defer vm1.Close()
	adam, err := optim.NewAdam(optim.WithLearnRate(0.1))
	if err != nil {
		log.Fatal(err)
	}
	train(w1, vm1, adam, 20)

	// A run interrupted after 10 steps: its state goes to a checkpoint as
	// named tensors and scalars, and comes back into a new solver.
	w2, vm2 := quadratic()
	defer vm2.Close()
	first, _ := optim.NewAdam(optim.WithLearnRate(0.1))
	train(w2, vm2, first, 10)
	flat := first.State().Flatten()
	for _, t := range flat.Tensors {
		fmt.Println(t.Name, t.Shape)
	}
	st, err := optim.Unflatten(flat)
	if err != nil {
		log.Fatal(err)
	}
	resumed, err := optim.New(st)
	if err != nil {
		log.Fatal(err)
	}
	train(w2, vm2, resumed, 10)

	fmt.Println("iterations:", resumed.State().Iter)
	fmt.Printf("w: %.4f\n", w2.Value().Data())
	fmt.Println("identical:", fmt.Sprint(w1.Value().Data()) == fmt.Sprint(w2.Value().Data()))
	// Output:
	// param.0.m [3]
	// param.0.v [3]
	// iterations: 20
	// w: [-0.2712 -0.2225 1.1194]
	// identical: true
}

// A mismatched state is refused with an error that names the parameter and
// can be matched; the solver is unchanged.
func ExampleAdam_SetState() {
	w, vm := quadratic()
	defer vm.Close()
	adam, _ := optim.NewAdam()
	train(w, vm, adam, 1)

	st := adam.State()
	st.Params[0].Shape = []int{1, 3}
	err := adam.SetState(st)
	fmt.Println(err)
	var pe *optim.ParamError
	if errors.As(err, &pe) && errors.Is(err, optim.ErrShape) {
		fmt.Println("parameter", pe.Index, pe.Name)
	}
	// Output:
	// optim: shape mismatch: parameter 0 (w): want [3], got [1 3]
	// parameter 0 w
}
