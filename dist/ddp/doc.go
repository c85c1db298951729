// Package ddp is data-parallel training for Gorgonia models, in the manner of
// PyTorch's DistributedDataParallel: every rank holds a full copy of the
// model, trains on its own share of each batch, and averages gradients with
// the other ranks before every optimiser step, so that all copies stay
// identical and training equals one process on the whole batch.
//
// Call Wrap on every rank once the model's parameters exist, use Hook at
// every use of a parameter in the forward pass, and step through Solver.
//
// # Usage
//
// On every rank (pg from gdist.InitFromEnv, or dist.New over a transport):
//
//	g := gorgonia.NewGraph()
//	params := ... // the model's learnable nodes, with values
//	d, err := ddp.Wrap(ctx, pg, params)
//	defer d.Close() // before pg.Close
//	x := gorgonia.NewMatrix(g, gorgonia.Float32, gorgonia.WithShape(localBatch, in))
//	h := x
//	for l := range layers {
//		w, err := d.Hook(params[2*l]) // at the point of use
//		h = gorgonia.Must(gorgonia.Mul(h, w))
//		...
//	}
//	loss := ... // a mean over the local batch
//	_, err = gorgonia.Grad(loss, params...)
//	vm := gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(params...))
//	solver := d.Solver(gorgonia.NewAdamSolver())
//	for each batch {
//		// Let x and y hold this rank's share of the batch
//		err = vm.RunAll()
//		err = solver.Step(gorgonia.NodesToValueGrads(params))
//		vm.Reset()
//		log.Printf("%+v", d.Stats())
//	}
//
// # How it works
//
// Wrap broadcasts the parameters from rank 0 and groups them into buckets,
// in reverse order (the order in which backprop produces their gradients):
// a small first bucket (DefaultFirstBucketCap, 1 MiB) so that communication
// starts early, then buckets of up to DefaultBucketCap (25 MiB), one dtype
// each.
//
// The forward pass uses Hook(w) in place of every parameter w. The hook is
// the identity; its gradient op, which gorgonia.Grad creates next to the
// gradient of hook(w), adds w's gradient into its bucket, and when a bucket
// is complete starts its all-reduce asynchronously (dist's AllReduce*Async)
// while the rest of backprop runs. No caller's context reaches a backward
// pass, so these all-reduces run under context.Background(): the group's
// default timeout (dist.WithTimeout) bounds each of them. Their finish times
// (dist.Work.Finished) give Stats.Comm; the DDP starts no goroutines. Sync (or the Solver wrapper's Step) then
// waits for the buckets and writes the averaged gradients into each
// parameter's gradient — param.Grad(), the dual value that every Gorgonia
// solver reads — before the inner solver steps.
//
// # Overlap needs hooks at the point of use
//
// The TapeMachine executes nodes in creation order, and Backpropagate visits
// the forward graph in reverse creation order, creating each node's gradient
// ops as it goes. A hook's gradient op is therefore created — and run — right
// after the gradient of the op that consumes the hook, provided the hook was
// created right before that op. Call Hook where the parameter is used. Hooks
// created for all parameters before the forward pass (Hooked, or a model
// that takes its parameters up front) are visited last, so their gradient
// ops all run at the end of backprop: training is identical, but the
// all-reduces do not overlap the backward pass (Stats.Exposed ≈ Stats.Comm).
//
// # ZeRO: sharded optimizer state and gradients
//
// WithZeRO(1) and WithZeRO(2) are DeepSpeed's ZeRO stages 1 and 2 on the
// same buckets and hooks. Each bucket is padded to a multiple of the world
// size and cut into one piece per rank; its reduce-scatter, launched during
// backprop exactly when DDP would launch its all-reduce, leaves on each rank
// the summed gradient of its own piece, which Sync averages as DDP does. The
// Solver then steps only this rank's piece — the parameter segments it
// covers, handed to the inner solver as gorgonia.ValueGrads over the
// parameters' own memory — so the inner solver keeps state (Adam's
// moments, a velocity) for 1/WorldSize of the model, and finally
// all-gathers the updated parameters, bucket by bucket, into every rank's
// tensors. ZeRO-1 keeps a gradient buffer per bucket, as DDP; ZeRO-2
// passes the buckets through two staging buffers, so that between steps a
// rank holds only its 1/WorldSize of the gradients.
//
//	d, err := ddp.Wrap(ctx, pg, params, ddp.WithZeRO(2))
//	logits, err := model.ForwardHooked(x, d.Hook)       // as with DDP
//	...
//	vm := gorgonia.NewTapeMachine(g)                     // no dual values: they would hold full gradients
//	solver := d.Solver(adam)                             // steps this rank's shard, then all-gathers
//	for each batch { vm.RunAll(); solver.Step(gorgonia.NodesToValueGrads(params)); vm.Reset() }
//
// The training is DDP's: on two ranks the reduce-scatter adds the ranks'
// gradients as the all-reduce does and the parameters are bitwise equal;
// on more ranks the sums are taken in another order, a difference of the
// size that reordering the batch across ranks makes (see the tests).
// Under ZeRO step through Solver: Sync alone leaves the averaged gradients
// in the shards, not in param.Grad(), and the parameters must be gathered
// after the step. Gorgonia's TapeMachine still computes every parameter's
// full gradient during backprop (a value it keeps for the life of the
// machine, as every node's); what ZeRO saves is the DDP's copies, the
// parameters' dual values and the optimizer state. Memory reports the
// DDP's buffers.
//
// WithMaxGradNorm clips the averaged gradients to a global norm, in plain
// DDP and under ZeRO (where the squares of the pieces are all-reduced).
//
// # Requirements
//
//   - The loss must be a mean over the local batch, and every rank's local
//     batch the same size, so that the mean of the ranks' gradients is the
//     gradient of the mean over the global batch.
//   - Every rank builds the same graph and runs the same steps: the bucket
//     all-reduces are collectives, issued in bucket order.
//   - Bind dual values for the parameters (gorgonia.BindDualValues) or read
//     gradients through param.Grad() as solvers do; one TapeMachine per DDP.
//   - Between two synchronised backward passes there must be a Sync (Step):
//     to accumulate gradients over several passes use SetSync(false) or
//     WithAccumulation.
//
// Errors raised inside the machine (a failed all-reduce, a misuse) reach
// RunAll wrapped by Gorgonia, which does not unwrap; the DDP keeps the first
// one, and Err, Sync and Step return it matchably. A DDP whose all-reduce
// failed stays failed.
//
// Close waits for the all-reduces in flight and drops the DDP's gradient
// buffers; afterwards every call fails with ErrClosed (which matches
// dist.ErrClosed too). The ProcessGroup stays the caller's: close the DDP,
// then the group.
package ddp
