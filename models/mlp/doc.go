// Package mlp is a multi-layer perceptron in plain Gorgonia: fully
// connected layers with ReLU between them, a fused and numerically stable
// softmax cross-entropy loss, and host-side accuracy helpers.
//
// It knows nothing of distribution. A data-parallel wrapper takes
// Learnables, substitutes hook(w) for each parameter through ForwardWith,
// and fits the usual RunAll, Solver.Step, Reset loop.
//
// Parameters are created with deterministic values from Config.Seed, so every
// process of a job starts from the same model without a broadcast (gdist's
// DDP broadcasts anyway). Read and write parameter values through the
// learnables' tensors: p.Value().Data() is a []float32 or []float64 backing
// the parameter, owned by the graph.
//
// # Usage
//
//	g := gorgonia.NewGraph()
//	m, err := mlp.New(g, mlp.Config{Sizes: []int{784, 256, 128, 10}, Batch: 64, Seed: 1})
//	if err != nil { ... }
//	x, y := m.NewInputs()
//	logits, err := m.Forward(x)
//	if err != nil { ... }
//	loss, err := mlp.Loss(logits, y)
//	if err != nil { ... }
//	if _, err := gorgonia.Grad(loss, m.Learnables()...); err != nil { ... }
//	vm := gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(m.Learnables()...))
//	defer vm.Close()
//	solver := gorgonia.NewAdamSolver(gorgonia.WithLearnRate(1e-3))
//	for each batch {
//		// fill the tensors bound to x and y (gorgonia.Let)
//		if err := vm.RunAll(); err != nil { ... }
//		if err := solver.Step(gorgonia.NodesToValueGrads(m.Learnables())); err != nil { ... }
//		vm.Reset()
//	}
//
// On MNIST, Adam with learning rate 1e-3 and batch 128 passes 97% test
// accuracy after two epochs.
package mlp
