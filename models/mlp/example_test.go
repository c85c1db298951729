package mlp_test

import (
	"fmt"
	"log"

	"github.com/gdist/gdist/models/mlp"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

func Example() {
	g := gorgonia.NewGraph()
	m, err := mlp.New(g, mlp.Config{Sizes: []int{4, 3, 2}, Batch: 5, Seed: 1})
	if err != nil {
		log.Fatal(err)
	}
	x, y := m.NewInputs()
	logits, err := m.Forward(x)
	if err != nil {
		log.Fatal(err)
	}
	loss, err := mlp.Loss(logits, y)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := gorgonia.Grad(loss, m.Learnables()...); err != nil {
		log.Fatal(err)
	}
	vm := gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(m.Learnables()...))
	defer vm.Close()

	xs := make([]float32, 5*4)
	ys := make([]float32, 5*2)
	for r := range 5 {
		ys[r*2] = 1 // every row is class 0
	}
	if err := gorgonia.Let(x, tensor.New(tensor.WithShape(5, 4), tensor.WithBacking(xs))); err != nil {
		log.Fatal(err)
	}
	if err := gorgonia.Let(y, tensor.New(tensor.WithShape(5, 2), tensor.WithBacking(ys))); err != nil {
		log.Fatal(err)
	}
	if err := vm.RunAll(); err != nil {
		log.Fatal(err)
	}
	// With zero inputs and zero biases the logits are zero: loss = ln 2.
	fmt.Printf("loss %.4f\n", loss.Value().Data())
	for _, p := range m.Learnables() {
		fmt.Println(p.Name(), p.Shape())
	}
	// Output:
	// loss 0.6931
	// w0 (4, 3)
	// b0 (3)
	// w1 (3, 2)
	// b1 (2)
}
