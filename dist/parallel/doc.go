// Package parallel composes data, pipeline and tensor parallelism for the
// transformer of models/transformer on a mesh of DP x PP x TP ranks
// (Megatron-LM's 3-D parallelism): DP replicas, each a pipeline
// (dist/pipeline) of PP stages, each stage split over TP tensor-parallel
// members (dist/tp), gradients averaged over the replicas (dist/ddp, or one
// all-reduce after a pipeline step).
//
// Experimental: the API may change.
//
// # Usage
//
// Training, on every rank of a job of DP*PP*TP ranks:
//
//	pg, err := gdist.InitFromEnv(ctx)
//	l := parallel.Layout{DP: 2, PP: 2, TP: 2}
//	tr, err := parallel.NewTrainer(ctx, pg, cfg, l, batch, parallel.WithMicroBatches(4))
//	defer tr.Close()
//	for step := range steps {
//		in, tgt, _ := transformer.SampleBatch(rng, data, batch, cfg.Ctx) // the same global batch on every rank
//		loss, err := tr.Step(ctx, in, tgt)                               // the whole batch's loss, on every rank
//	}
//	ws, err := tr.Weights(ctx) // the single-process model's tensors, on every rank
//	if pg.Rank() == 0 {
//		err = transformer.Save(path, &transformer.Checkpoint{Config: cfg, Vocab: vocab, Tensors: ws})
//	}
//
// The result is the single-process transformer.Trainer's, up to rounding:
// the tests train 50 steps in float64 with TP=2, DP×TP, DP×PP, PP×TP and
// DP×PP×TP and find the parameters equal to 1e-13 (relative).
//
// Generation with a KV cache, each of the DP replicas a pipeline of PP
// stages of TP ranks serving requests of its own:
//
//	ck, err := transformer.Load(path)
//	g, err := parallel.NewGenerator(ctx, pg, ck.Config, parallel.Layout{DP: 2, PP: 2, TP: 2}, 8,
//		parallel.WithWeights(ck.Tensors)) // each rank keeps its part
//	mine := reqs[g.Groups().DP.Rank()] // this replica's requests, the same on its ranks
//	out, err := g.Generate(ctx, mine) // on the first and last stages: each request's new tokens
//
// The requests move through the stages in groups (WithGroups, default one
// per stage): while the last stage samples one group's tokens, the first
// already computes the next group, so every stage works at once. Each
// request gets the tokens transformer.Generate gives it alone on one
// process.
package parallel
