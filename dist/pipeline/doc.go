// Package pipeline is pipeline parallelism for Gorgonia models: a model's
// layers are split into contiguous stages, one per rank (or, with
// NewInterleaved, into v chunks per rank); each rank builds only its own
// stages' graphs and holds only their weights, and hidden states (and, when
// training, their gradients) move between neighbouring stages as tagged
// point-to-point messages of a dist.ProcessGroup.
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
// Another schedule: pipeline.WithSchedule(pipeline.ZeroBubble). Interleaved
// 1F1B, with 2 chunks per rank, each built for its virtual stage vs (of
// 2*p; rank r holds vs = r and r+p):
//
//	p, err := pipeline.NewInterleaved(ctx, pg, 2, func(g *gorgonia.ExprGraph, vs int) (pipeline.Stage, error) {
//		from, to := vs*n/(2*pg.WorldSize()), (vs+1)*n/(2*pg.WorldSize())-1
//		return transformer.NewStage(g, cfg, from, to, microBatch)
//	}, pipeline.WithMicroBatches(8), pipeline.WithLoss(transformer.CrossEntropy))
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
// TrainStep runs one of four schedules (WithSchedule; p stages, m
// micro-batches, bubble = the fraction of a step a stage waits):
//
//	GPipe        all forwards, then all backwards           bubble (p-1)/(m+p-1), m graphs per stage
//	OneFOneB     1F1B: warm-up, then one forward and one    (p-1)/(m+p-1), at most p-s graphs on stage s
//	             backward in turn
//	ZeroBubble   ZB-H1: backward split into an input-       (p-1)/(3m+p-1) when the three passes cost the
//	             gradient and a weight-gradient pass, the   same, at most p graphs per stage
//	             latter filling the stage's waits
//	Interleaved  interleaved 1F1B over v chunks per rank    (p-1)/(vm+p-1), v times the messages
//	             (NewInterleaved)
//
// The last stage runs each micro-batch's forward, loss and backward back to
// back. The batch loss is the mean of the micro-batch losses and the
// parameter gradients are added in micro-batch order into the learnables'
// dual values, so they equal, up to rounding (1e-12 in float64 in the
// tests), what one process computes on the whole batch, and a Gorgonia
// solver steps on them as usual. Every schedule gives bitwise the same
// gradients. Predict simulates a schedule with given pass times (Stats.Costs
// measures them) and returns the step time and bubble it expects.
//
// # Executor
//
// The pipeline runs its graphs with an executor of its own rather than a
// gorgonia.TapeMachine, whose RunAll locks its OS thread and starts a
// goroutine per run and whose Reset drops every intermediate tensor. The
// executor runs the ops in the order a TapeMachine does (bitwise the same
// results), keeps each op's output from one run to the next and writes into
// it where the op allows (gorgonia.UsePreallocDoer), runs Gorgonia's
// matrix products itself — gonum's kernels on the same 64x64 blocks as
// gonum's Sgemm and Dgemm (for float32 a·b and aᵀ·b the same loops over an
// AVX2 axpy that rounds as gonum's does), bitwise the same products, but on
// the calling goroutine instead of one goroutine per block — as well as element-wise
// addition, subtraction and products, tanh, squares, sums over rows and
// reshapes, all bitwise as Gorgonia computes them, adds each weight-gradient product to
// the learnable's gradient a strip at a time instead of keeping it, and
// runs a training graph in passes: the forward pass, then — once the next stage's gradient
// of the output has arrived into an input node — the backward pass, or with
// ZeroBubble the input-gradient pass and later the weight-gradient pass.
// Only nodes that the stage's outputs depend on run (a gorgonia.Read node
// the stage adds does not). A stage keeps one graph per micro-batch it
// holds at once, each with its own values. WithRecompute instead keeps one
// graph and only each micro-batch's input, and repeats the forward pass
// before the backward (GPipe's re-materialisation), for about a third more
// compute. Activations and gradients are sent from the graph's own tensors,
// which the graph does not overwrite before the send is done.
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
// then one per call, micro-batch, direction and boundary between virtual
// stages, so messages can never be confused.
package pipeline
