// Package fsdp is fully sharded data-parallel training for Gorgonia models
// built from units (MLP layers, transformer blocks), in the manner of
// PyTorch's FullyShardedDataParallel and DeepSpeed's ZeRO stage 3: each rank
// stores 1/WorldSize of every unit's parameters, of their gradients and of
// the optimizer state, and a unit's parameters exist whole only while the
// unit computes. Training is the same as DDP's (package dist/ddp): on two
// ranks bitwise, on more up to the order in which the ranks' gradients are
// summed.
//
// Experimental: the API may change.
//
// # Usage
//
// On every rank (pg from gdist.InitFromEnv, or dist.New over a transport):
//
//	g := gorgonia.NewGraph()
//	model, err := mlp.New(g, mlp.Config{Sizes: []int{784, 256, 128, 10}, Batch: 64, Seed: 1})
//	ps := model.Learnables()               // w0, b0, w1, b1, w2, b2
//	units := []gorgonia.Nodes{ps[0:2], ps[2:4], ps[4:6]} // one unit per layer
//	f, err := fsdp.Wrap(ctx, pg, units)   // broadcasts rank 0's values, keeps this rank's pieces
//	defer f.Close()                        // before pg.Close
//	x, y := model.NewInputs()
//	logits, err := model.ForwardHooked(x, f.Hook) // a hook at every use of a parameter
//	loss, err := mlp.Loss(logits, y)
//	_, err = gorgonia.Grad(loss, ps...)
//	vm := gorgonia.NewTapeMachine(g)       // no dual values (they would hold full gradients)
//	adam, err := optim.NewAdam(optim.WithLearnRate(1e-3))
//	solver := f.Solver(adam)               // steps this rank's pieces
//	for each batch {
//		// Let x and y hold this rank's share of the batch
//		err = vm.RunAll()
//		err = solver.Step(gorgonia.NodesToValueGrads(ps))
//		vm.Reset()
//	}
//	weights, err := f.FullParams(ctx)     // a collective: the whole model, for evaluation or saving
//
// # How it works
//
// Wrap lays every unit's parameters out in one flat buffer, padded to a
// multiple of the world size, and keeps this rank's piece of it (torch's
// FlatParameter). Two gather buffers, each the size of the largest unit of
// its parity, hold the units whole: the units at even positions of the
// forward pass take turns in one, those at odd positions in the other
// (with WithPrefetch(false), one buffer the size of the largest unit serves
// them all). Every parameter node is bound to its place in its unit's
// gather buffer.
//
// The forward pass uses Hook(p) in place of every parameter p. When the
// machine runs a unit's first hook, the unit's all-gather (started earlier)
// is waited for and the next unit's is started, so that it runs while this
// unit computes; the unit after next will gather into this unit's buffer.
// Each hook's gradient op copies its parameter's gradient into the unit's
// staging buffer (two, by parity again). Backpropagate creates a node's
// gradient ops in reverse order of creation, so the gradient op of a unit's
// first hook is the last of the unit's backward ops to run and runs before
// any backward op of the unit before it: there the unit's gradients are
// complete, and its reduce-scatter starts (each rank receives the sum of
// its piece; Step averages it as DDP does); there too the unit before is
// gathered again — its all-gather was started one unit earlier — and the
// one before that starts gathering. The last two units of the forward pass
// are still in their buffers when the backward pass begins and are not
// gathered again.
//
// # What Gorgonia's TapeMachine lets FSDP free, and when
//
// The TapeMachine gives every node its own register when the graph is
// compiled and keeps each node's value for the life of the machine: it
// frees nothing between passes (its CPU "free" instruction does nothing)
// and only an op that declares it may overwrite a dead input writes into
// another node's memory. So within one machine nothing a Gorgonia op
// produced is ever released: activations, and the gradient of every
// parameter, computed whole by the op that consumes it (a matrix product's
// gradient op), stay allocated as in single-process training. What FSDP
// controls is the memory behind the values it hands out and the buffers it
// keeps:
//
//   - Parameters: the hooks return tensors over the two gather buffers, so
//     between units a rank holds its pieces (1/WorldSize of the model) plus
//     at most two gathered units (one without prefetching): the resident
//     parameters approach 1/WorldSize of the model as it has more, smaller
//     units. Each unit's parameters are overwritten by the unit after next
//     as soon as the unit's forward (or backward) is done. The parameters' own tensors are released at Wrap. To keep
//     Gorgonia from writing another op's result over a gather buffer in
//     place, each hook's gradient op also reads the hook's output, which
//     keeps that register alive until the unit's backward is over.
//   - Gradients: a rank keeps its piece of each unit's averaged gradient
//     (1/WorldSize) and two staging buffers; the full gradients in the
//     machine's registers are Gorgonia's, as above.
//   - Optimizer state: the inner solver sees only this rank's segments.
//
// # Requirements
//
//   - Units must be used one after another in the forward pass (ErrUnitOrder
//     otherwise): a parameter shared by two layers (a tied embedding and
//     output head) belongs in one unit that spans them. Call Hook right
//     before every use, as DDP's hooks are used.
//   - The first parameter a unit uses must receive a gradient: its gradient
//     op ends the unit's backward pass.
//   - Every rank builds the same graph and runs the same steps; every
//     forward pass is followed by its backward pass and one Step. FSDP does
//     not accumulate gradients over passes.
//   - One TapeMachine per FSDP, which must run the graph in the order it
//     was built (a unit's op running while the unit is not gathered fails
//     with ErrNotResident). Do not bind dual values for the parameters.
//   - Read the parameters with FullParams: between steps, a parameter
//     node's value holds whatever unit last used its buffer.
package fsdp
