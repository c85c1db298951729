// Package tp is tensor parallelism for Gorgonia models, after Megatron-LM:
// a layer too wide or too slow for one process is split within itself over
// the members of a group (a tensor-parallel subgroup, such as a mesh's "tp"
// group), each member holding and computing a part of its weights.
//
// Experimental: the API may change.
//
// # Building blocks
//
// The two conjugate operators, as Gorgonia ops with gradients:
//
//	Copy(g, x)    f: identity forward, all-reduce (sum) of the gradient backward
//	Reduce(g, x)  g: all-reduce (sum) forward, identity backward
//
// and Gather / Scatter along the last axis (all-gather forward and split
// backward, and the converse). On them sit the layers, each member holding
// its part of the whole layer's weights (drawn from one seed, or cut from
// WithWeights, so a split layer equals the unsplit one):
//
//	NewColumnLinear   y = Copy(x)·W[:, part] + b[part]   (output split; WithGatherOutput joins it)
//	NewRowLinear      y = Reduce(x[:, part]·W[part, :]) + b
//	NewVocabEmbedding Reduce(onehot[:, part]·E[part, :])  (vocabulary split, possibly unevenly)
//	CrossEntropy      the mean cross-entropy of split logits: per row, an all-reduce of
//	                  the maximum, of the sum of exponentials and of the target's logit;
//	                  no member ever holds the whole logits
//
// A column-parallel layer followed by a row-parallel one (an MLP, or
// attention with its heads split) costs one all-reduce forward and one
// backward.
//
// # The transformer
//
// NewStage builds a models/transformer stage split over a group (see
// transformer.TensorParallel: heads, MLP units and vocabulary split,
// replicated layer norms), initialised from the same seed as the
// single-process model; NewDecoder its KV-cache decoder for generation.
// Checkpoints stay the single-process model's: transformer.Shard cuts a
// member's part on load, GatherWeights joins the parts on save, and
// GatherLogits gathers one row of logits to sample from. Package
// dist/parallel composes these stages with pipelines and data
// parallelism.
//
// # Usage
//
// Every member of the tensor-parallel group g runs:
//
//	gr := gorgonia.NewGraph()
//	st, err := tp.NewStage(gr, g, cfg, 0, cfg.HeadLayer(), batch) // this member's part
//	in, tgt := st.NewInput("in"), st.NewTargets("targets")       // [rows, vocabulary part]
//	logits, err := st.Forward(in)                                 // this member's part of the logits
//	loss, err := tp.CrossEntropy(g, logits, tgt)                  // the same scalar on every member
//	_, err = gorgonia.Grad(loss, st.Learnables()...)
//	vm := gorgonia.NewTapeMachine(gr, gorgonia.BindDualValues(st.Learnables()...))
//	lo, hi := st.VocabPart()
//	// each step: transformer.FillOneHotPart(in.Value().(*tensor.Dense), ids, lo, hi, cfg.Vocab),
//	// the same for the targets, vm.RunAll(), solver.Step, vm.Reset()
//	whole, err := tp.GatherWeights(ctx, g, st.Weights()) // the single-process checkpoint's tensors
//
// Graph construction is not safe from several goroutines at once: tests
// that run members in one process build under one mutex.
package tp
