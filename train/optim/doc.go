// Package optim provides Gorgonia solvers whose state can be saved and
// restored: SGD, Momentum and Adam. Each implements gorgonia.Solver and
// updates parameters bit for bit as Gorgonia v0.9.18's VanillaSolver,
// Momentum and AdamSolver do with the same settings, for float32 and float64
// parameters (*tensor.Dense, *gorgonia.F32, *gorgonia.F64); unlike those, it
// can export its complete state — hyper-parameters, iteration count and
// per-parameter moments — and a fresh solver restored from it continues the
// run exactly as if it had never stopped.
//
// # Gorgonia semantics
//
// Step reads each parameter's gradient through ValueGrad.Grad (for a
// *gorgonia.Node, its dual value), updates the value in place and zeroes the
// gradient, as Gorgonia's solvers do; code that writes into the gradient's
// backing slice before Step (DDP's averaged gradients) works with these
// solvers exactly as with Gorgonia's. The gradient is prepared in Gorgonia's
// order: + l1*sign(w), + l2*w, / batch (when batch > 1), clamped to ±clip;
// the kernels reproduce Gorgonia's sequence of rounded tensor operations
// element by element in one pass, allocating nothing per step. Gorgonia's
// quirks are kept, since bitwise identity is the contract: Momentum
// penalises the velocity (not the weight) on tensors and never stores the
// velocity of scalar parameters; the scalar paths take sign(0) as +1 in L1
// and multiply Adam's (1-beta2)*g before *g.
//
// Three differences, all on paths where Gorgonia would not produce a useful
// result: a *tensor.Dense of shape () takes the tensor path (Gorgonia's
// Momentum and Adam panic on one); options are validated by the
// constructor (a learning rate must be finite and >= 0, a clip > 0, betas
// in [0, 1), ...; an option of another solver, such as WithBeta1 for SGD,
// is refused too: an *OptionError matching ErrInvalidArgument), and Step
// checks every parameter (type, dtype, shape, count against the state)
// before it updates any, so that a failed Step changes nothing.
//
// # State
//
// State is plain data: Kind, Hyper, Iter and, per parameter by index (with
// its name, dtype and shape), its slots — none for SGD, "velocity" for
// Momentum, "m" and "v" for Adam — as []float32 or []float64. Params[i]
// belongs to model[i] of the slice given to Step, so the state of any subset
// of parameters (a ZeRO shard) is addressable by index. State returns a deep
// copy; SetState copies its argument. SetState refuses, with an error
// matching ErrKind, ErrParamCount, ErrShape, ErrDtype, ErrName or
// ErrInvalidState (a *ParamError naming the parameter), a state that does not
// fit, and then changes nothing. A fresh solver takes any valid state and
// checks it against the model at the first Step; call Init(model) first to
// have it checked at SetState. New builds a solver of the state's kind from
// a State alone.
//
// Flatten and Unflatten convert a State to and from a Flat: named strings,
// integers, floats and tensors, the form a checkpoint writer stores. The
// naming scheme is documented on Flat: tensors are "param.<i>.<slot>", e.g.
// "param.0.m".
//
// Solvers are not safe for concurrent use.
//
// # Usage
//
//	solver, err := optim.NewAdam(optim.WithLearnRate(1e-3), optim.WithClip(5))
//	vm := gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(params...))
//	for step := range steps {
//		// Let the inputs hold this step's batch
//		err = vm.RunAll()
//		err = solver.Step(gorgonia.NodesToValueGrads(params))
//		vm.Reset()
//	}
//	flat := solver.State().Flatten() // store flat.Tensors and the scalars
//
// and to resume:
//
//	st, err := optim.Unflatten(flat) // rebuilt from the checkpoint
//	solver, err := optim.New(st)     // or NewAdam(...) then SetState(st)
//
// With DDP, wrap it as any Gorgonia solver: d.Solver(solver).
package optim
