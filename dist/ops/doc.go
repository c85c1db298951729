// Package ops provides gdist's collectives as Gorgonia ops, so that a
// collective can sit inside an expression graph and be differentiated like
// any other operation.
//
// Each constructor (AllReduce, AllGather, ReduceScatter, Broadcast, Reduce,
// AllToAll, AllToAllV, Gather, Scatter, AllGatherV) adds one node to x's
// graph. When a machine executes the node, the op copies
// its input and runs the collective on its ProcessGroup, synchronously, with
// the group's default timeout (dist.WithTimeout). Every op implements the full
// gorgonia.Op and gorgonia.SDOp interfaces; Backpropagate turns each
// collective into the collective that computes its adjoint:
//
//	forward                      gradient of the input
//	AllReduce(Sum)               AllReduce(Sum) of the output gradient
//	AllReduce(Mean)              AllReduce(Mean) of the output gradient
//	AllGather                    ReduceScatter(Sum): this rank's block of the summed gradient
//	ReduceScatter(Sum|Mean)      AllGather of the gradient (scaled by 1/n for Mean)
//	Broadcast(root)              Reduce(Sum, root): the summed gradient on root, zeros elsewhere
//	Reduce(Sum|Mean, root)       Broadcast(root) of root's gradient (scaled by 1/n for Mean)
//	AllToAll                     AllToAll of the output gradient (the reverse exchange)
//	AllToAllV(send, recv)        AllToAllV(recv, send): the counts swapped
//	Gather(root)                 Scatter(root) of root's gradient: rank r gets block r
//	Scatter(root)                Gather(root): the concatenated gradient on root, zeros elsewhere
//	AllGatherV(counts)           this rank's rows of the summed gradient: an AllToAllV that
//	                             sends each rank its rows, then a local sum (a reduce-scatter
//	                             with uneven blocks)
//
// The loss these gradients belong to is the sum over ranks of each rank's
// local loss, which is what data- and model-parallel training optimise
// (divide by the world size in the loss if a mean is wanted). Max, Min and
// Prod reductions run forward but have no gradient: differentiating through
// them fails. The op's SymDiff error matches ErrNotDifferentiable, but
// gorgonia.Grad returns it inside a gorgonia.SymDiffError, which does not
// unwrap; detect it with IsNotDifferentiable(err), which understands both.
//
// Rules that come from running collectives inside graphs:
//
//   - Every rank must build the same collective nodes in the same order: the
//     TapeMachine executes nodes in creation order, and the collectives of a
//     group must be called in the same order on every rank. A mismatch fails
//     with a *dist.DesyncError rather than hanging.
//   - Each op instance writes a unique id into its hash, so two collectives
//     over the same input are two nodes (Gorgonia merges nodes with equal
//     hashes).
//   - Gorgonia's graph construction is not goroutine-safe: ranks simulated as
//     goroutines in one process must build their graphs under one mutex.
//   - Tensors of Float32 and Float64 are supported, and scalars for the ops
//     that keep the shape (AllReduce, Broadcast, Reduce). The others
//     concatenate, split or exchange rows of axis 0, and the counts of
//     AllToAllV and AllGatherV are in rows (a row of a (d0, d1, d2) tensor
//     is d1*d2 elements).
//   - Gather gives its (n*d0, ...) result on root and zeros of that shape
//     elsewhere, as Reduce does, so that every rank can build the same graph
//     after it.
//   - The ops work on any group, subgroups (ProcessGroup.NewGroup, Split)
//     and mesh groups included: ranks, roots and counts are the group's.
//   - Counts may be zero, and the ops handle tensors without elements, but
//     Gorgonia's own arithmetic panics on them: a graph that computes on or
//     differentiates through an empty tensor fails in Gorgonia, not here.
//
// The ops implement symbolic differentiation (SDOp) only, which is what the
// TapeMachine uses; they do not implement ADOp, so the LispMachine cannot
// differentiate through them.
//
// # Usage
//
// Every rank runs the same program with its own group and data:
//
//	x := gorgonia.NewMatrix(g, gorgonia.Float64, gorgonia.WithShape(2, 3), gorgonia.WithName("x"))
//	y, err := ops.AllReduce(pg, x, dist.Sum) // y = Σ_r x_r on every rank
//	...
//	loss := gorgonia.Must(gorgonia.Sum(gorgonia.Must(gorgonia.HadamardProd(y, w))))
//	_, err = gorgonia.Grad(loss, x) // x.Grad() = Σ_r w_r
//	vm := gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(x))
//	err = vm.RunAll()
package ops
