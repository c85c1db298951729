// Package pipeline is pipeline parallelism for Gorgonia models: a model's
// layers are split into contiguous stages, one per rank; each rank builds
// only its own stage's graphs and holds only its stage's weights, and hidden
// states (and, when training, their gradients) move between neighbouring
// stages as tagged point-to-point messages of a dist.ProcessGroup.
//
// Experimental: the API may change.
//
// # Usage
//
// Every rank builds its stage and calls the same methods in the same order.
// Rank r runs stage r and builds only its own layers; here the
// transformer's layers are split evenly:
//
//	pg, err := gdist.InitFromEnv(ctx)
//	if err != nil { ... }
//	defer pg.Close()
//	n := cfg.NumLayers()
//	from := pg.Rank() * n / pg.WorldSize()         // this rank's layers: [from, to]
//	to := (pg.Rank()+1)*n/pg.WorldSize() - 1
//	build := func(g *gorgonia.ExprGraph) (pipeline.Stage, error) {
//		return transformer.NewStage(g, cfg, from, to, microBatch)
//	}
//	p, err := pipeline.New(ctx, pg, build,
//		pipeline.WithMicroBatches(8),
//		pipeline.WithLoss(transformer.CrossEntropy)) // used by the last stage
//	if err != nil { ... } // *pipeline.StageMismatchError if neighbours disagree
//	defer p.Close()
//	solver := gorgonia.NewAdamSolver()
//	for step := range steps {
//		loss, err := p.TrainStep(ctx, pipeline.Data{
//			Input:  func(mb int, in *tensor.Dense) error { ... }, // first stage
//			Target: func(mb int, t *tensor.Dense) error { ... },  // last stage
//		})
//		if err != nil { ... } // a *dist.PeerError if another stage failed
//		if err := solver.Step(gorgonia.NodesToValueGrads(p.Learnables())); err != nil { ... }
//	}
//	err = p.Infer(ctx, pipeline.Data{Input: ..., Output: ...})
//
// To start from saved weights, load only this stage's tensors
// (transformer.LoadLayers(path, from, to)) and hand them to the stage:
// p.Stage().(*transformer.Stage).SetWeights(ck.Tensors); every graph of the
// pipeline shares them.
//
// # Stages
//
// A Stage declares its per-micro-batch input and output shapes, adds its
// forward pass to a graph, and lists its learnables; *transformer.Stage
// satisfies it. New calls the Builder once for every graph it needs and
// makes all of them share the first one's parameter tensors (Stage). At
// setup every stage sends a descriptor (its input and output shape and
// dtype, the number of stages and micro-batches, the schedule) to every
// other, and all of them check all neighbouring pairs in stage order: a
// disagreement is a *StageMismatchError (or ErrConfigMismatch) on every
// stage, before any data moves, instead of a hang or wrong numbers.
//
// # Schedules
//
// Infer streams micro-batches through the stages: stage s computes
// micro-batch m while stage s+1 computes m-1 (outputs are sent from a
// goroutine, so sending never delays the next computation).
//
// TrainStep runs GPipe (all forwards, then all backwards) or, with
// WithSchedule(OneFOneB), 1F1B; the last stage runs each micro-batch's
// forward, loss and backward back to back. The batch loss is the mean of
// the micro-batch losses and the parameter gradients are accumulated in
// micro-batch order into the learnables' dual values, so they equal, up to
// rounding (1e-12 in float64 in the tests), what one process computes on the
// whole batch, and a Gorgonia solver steps on them as usual. All schedules
// give bitwise identical gradients.
//
// A TapeMachine runs a whole graph, forward and backward, in one RunAll.
// To stop between the two halves, a training graph ends its forward pass
// with an exchange op: out -> exchange(out), and the backward pass is
// gorgonia.Backpropagate with exchange(out) as the gradient of out. The
// op's Do hands out to the scheduler and blocks until the gradient from the
// next stage has arrived, so the tape of each micro-batch in flight is
// paused there, on its own goroutine, keeping its activations. That costs
// one graph per micro-batch in flight: m with GPipe, at most p-s with 1F1B.
// WithRecompute instead keeps one graph and only each micro-batch's input:
// the forward run is abandoned at the exchange op and repeated before the
// backward (GPipe's re-materialisation), for about a third more compute.
//
// # Failure
//
// A failing call (a lost or frozen peer, a callback's error, a cancelled
// context) breaks the pipeline and fails its group: the pipeline has no
// failure protocol of its own but uses dist's one failure domain
// (dist.ProcessGroup.Abort), so the cause travels to every rank encoded,
// the first cause wins, and every user of the group (other stages, DDP
// collectives, point-to-point calls) fails with the same typed error. The
// other stages' current or next call fails with a *dist.PeerError naming
// the culprit: the lost or frozen rank (dist.ErrPeerLost), or the failed
// stage's rank (ErrStageFailed, with the *dist.AbortError giving the
// kind and the message). A killed stage makes all of them fail promptly,
// even those waiting on a live neighbour, because the group watches every
// peer. A stage whose builder fails in New fails the group the same way, so
// the other stages' New fails at once.
//
// Every stage must make the same calls in the same order. Each call starts
// with a small header to the neighbours it sends data to (call kind and
// number); the first receive from a neighbour checks it, so stages that
// disagree (one in Infer, another in TrainStep, or one a call ahead) fail
// at once with ErrCallMismatch instead of waiting for their contexts (on
// the stage that found it an error naming both calls, on the others a
// *dist.PeerError naming that stage's rank).
//
// # Tags
//
// A pipeline uses TagSpan point-to-point tags from its tag base
// (WithTagBase): one for setup, one reserved, one for call headers, and
// then one per call, micro-batch and direction, so messages can never be
// confused.
package pipeline
