// Package transformer is a small decoder-only, character-level transformer
// (GPT-style) in plain Gorgonia, built so that it can be cut into pipeline
// stages. It does not import gdist's dist packages; parallelism wraps it.
//
// # Model
//
// A model has Config.NumLayers() = Layers+2 pipeline layers:
//
//	layer 0          embedding: one-hot tokens · tok_emb + positions · pos_emb
//	layers 1..L      pre-LN blocks: x += attn(LN1(x)); x += mlp(LN2(x))
//	                 (causal multi-head self-attention, GELU MLP)
//	layer L+1        final layer norm and output head (logits)
//
// Activations are 2-D with one row per token, batch*Ctx rows in
// sequence-major order (row b*Ctx+t is position t of sequence b). Tokens
// enter as one-hot float rows [batch*Ctx, Vocab]; hidden states between
// layers are [batch*Ctx, Dim]; the head outputs logits [batch*Ctx, Vocab].
// Every forward pass uses the full block of Ctx positions: shorter inputs
// are right-padded, which causal attention makes invisible to the real
// positions.
//
// Parameters are named "layerNN.<part>" (LayerName, LayerOf, ParamNames),
// for example "layer00.tok_emb", "layer01.attn.wq", "layer03.head.w", and
// are initialised from (Config.Seed, name), so any Stage holds exactly the
// values the full model would. A Stage over layers [from, to] owns only
// those parameters; a full model is the Stage [0, Layers+1].
//
// Attention and the loss use this package's own row-wise softmax ops
// instead of Gorgonia's SoftMax/LogSoftMax, which in v0.9.18 couple the rows
// of a tensor numerically. As a result each sequence's outputs are
// independent of the rest of the batch, and running layers [0, k] and
// [k+1, L+1] as two graphs (copying the hidden states between them) gives
// bitwise the same logits and gradients as the full model.
//
// # Usage
//
// Train and sample in one process:
//
//	text := "..."
//	vocab := transformer.NewVocab(text)
//	data, _ := vocab.Encode(text)
//	cfg := transformer.DefaultConfig(vocab.Size())
//	tr, err := transformer.NewTrainer(cfg, 16) // batch of 16 sequences
//	if err != nil { ... }
//	defer tr.Close()
//	rng := rand.New(rand.NewPCG(1, 2))
//	for step := 0; step < 1000; step++ {
//		in, tgt, _ := transformer.SampleBatch(rng, data, 16, cfg.Ctx)
//		loss, err := tr.Step(ctx, in, tgt)
//		...
//	}
//	err = transformer.Save("model.ckpt", &transformer.Checkpoint{
//		Config: cfg, Vocab: vocab, Step: int64(tr.Steps()), Tensors: tr.Weights()})
//
//	p, _ := transformer.NewPredictor(cfg, tr.Weights())
//	prompt, _ := vocab.Encode("The light ")
//	out, _ := transformer.Generate(ctx, p, prompt, 200, 0.8, 42)
//	fmt.Println(vocab.Decode(out))
//
// Train data-parallel with dist/ddp (every rank runs this on its own
// batches): the DDP wraps the parameters before the forward pass is built,
// and the forward pass uses DDP.Hook at every use of a parameter, so each
// gradient bucket's all-reduce starts during the backward pass:
//
//	g := gorgonia.NewGraph()
//	st, _ := transformer.NewStage(g, cfg, 0, cfg.HeadLayer(), 16)
//	d, _ := ddp.Wrap(ctx, pg, st.Learnables()) // a collective: rank 0's values
//	tr, _ := transformer.NewTrainerFor(st,
//		transformer.WithHook(d.Hook),
//		transformer.WithSolver(d.Solver(gorgonia.NewAdamSolver())))
//	loss, err := tr.Step(ctx, in, tgt) // this rank's loss; gradients are averaged
//
// Build one pipeline stage (layers from..to) in its own graph, after
// learning the model's shape from the checkpoint header alone:
//
//	cfg, vocab, _, _ := transformer.LoadConfig("model.ckpt") // no tensor data read
//	from, to := ... // this rank's layers out of cfg.NumLayers()
//	ck, _ := transformer.LoadLayers("model.ckpt", from, to) // or seeded init
//	g := gorgonia.NewGraph()
//	st, _ := transformer.NewStage(g, ck.Config, from, to, microBatch)
//	_ = st.SetWeights(ck.Tensors)
//	in := st.NewInput("in")              // one-hot tokens or hidden states
//	out, _ := st.Forward(in)             // hidden states or logits (ForwardHooked for DDP)
//	var loss *gorgonia.Node
//	if st.IsLast() {
//		loss, _ = transformer.CrossEntropy(out, st.NewTargets("targets"))
//	} else {
//		outGrad := gorgonia.NewMatrix(g, ck.Config.Dtype.Tensor(),
//			gorgonia.WithShape(st.OutputShape()...), gorgonia.WithName("out_grad"),
//			gorgonia.WithInit(gorgonia.Zeroes()))
//		loss, _ = transformer.Surrogate(out, outGrad) // fed with d loss/d out
//	}
//	wrt := st.Learnables()
//	if !st.IsFirst() {
//		wrt = append(wrt, in) // d loss/d in goes to the previous stage
//	}
//	grads, _ := gorgonia.Grad(loss, wrt...)
//	vm := gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(st.Learnables()...))
//
// Before each run, fill the input (FillOneHot on in.Value() for the first
// stage, copy received hidden states into in.Value() otherwise), and the
// targets or out_grad; after vm.RunAll, copy out (Float64s or the raw
// tensor data) and, for a non-first stage, grads[len(grads)-1] (d loss/d in)
// before vm.Reset.
//
// A pipeline computes next-token logits its own way and reuses Sample (and
// NewRNG) to pick tokens, or implements Runner and calls Generate.
//
// # Safetensors
//
// Safetensors is the format torch and Hugging Face users share
// (https://github.com/huggingface/safetensors): an 8-byte little-endian
// header length, a JSON header giving each tensor's dtype, shape and byte
// range (and an optional "__metadata__" object of strings), then the raw
// little-endian data. WriteSafetensors and ReadSafetensors name a model's
// parameters as Hugging Face's GPT-2 does (GPT2Model's state dict; the model
// is GPT-2's architecture: pre-LN blocks, learned positions, the tanh GELU,
// layer norms with eps 1e-5), i = l-1 for block l:
//
//	layer00.tok_emb [V, D]             wte.weight [V, D]
//	layer00.pos_emb [T, D]             wpe.weight [T, D]
//	layerNN.ln1.g, ln1.b [D]           h.i.ln_1.weight, h.i.ln_1.bias
//	layerNN.attn.wq|wk|wv [D, D]       h.i.attn.c_attn.weight [D, 3D]: columns q | k | v
//	(no bias)                          h.i.attn.c_attn.bias [3D]: zeros
//	layerNN.attn.wo [D, D], attn.bo    h.i.attn.c_proj.weight, h.i.attn.c_proj.bias
//	layerNN.ln2.g, ln2.b               h.i.ln_2.weight, h.i.ln_2.bias
//	layerNN.mlp.w1 [D, H], mlp.b1      h.i.mlp.c_fc.weight [D, H], h.i.mlp.c_fc.bias
//	layerNN.mlp.w2 [H, D], mlp.b2      h.i.mlp.c_proj.weight [H, D], h.i.mlp.c_proj.bias
//	layerL+1.ln.g, ln.b                ln_f.weight, ln_f.bias
//	layerL+1.head.w [D, V]             lm_head.weight [V, D], transposed (absent if TiedHead)
//	layerL+1.head.b [V]                lm_head.bias [V]
//
// Weights are stored as GPT-2's Conv1D stores them, [in, out], y = x·W +
// b, except lm_head.weight, a torch Linear's [out, in]. GPT-2 has no head
// bias: a Hugging Face GPT2LMHeadModel ignores lm_head.bias (with a
// warning), so a model whose head.b is not zero predicts differently
// there. The header's __metadata__ holds "format": "pt" and gdist's own
// keys: "gdist.format" (FormatName), "gdist.config" (the Config as JSON),
// "gdist.vocab" (the Vocab as JSON, if any) and "gdist.step". Reading
// (ReadSafetensors, LoadSafetensors) takes such a file back exactly, or a
// GPT-2-like file from elsewhere given its number of heads; this model's
// q, k and v have no bias, so a file whose c_attn.bias is not zero (GPT-2's
// own weights) is refused, naming the tensor:
//
//	ck, _ := transformer.Load("model.gdc")
//	err := transformer.SaveSafetensors("model.safetensors", ck)
//	back, err := transformer.LoadSafetensors("model.safetensors", 0) // heads: from the metadata
//
// # Concurrency
//
// Stage, Trainer and Predictor are not safe for concurrent use. Gorgonia's
// graph construction and Grad touch package-level state: NewTrainer,
// NewTrainerFor and NewPredictor serialise among themselves, but code that
// builds graphs (NewStage, Forward, Grad) in several goroutines at once must
// hold its own mutex around construction — and release it around
// collectives such as ddp.Wrap, which wait for the other ranks. Running separate graphs concurrently is fine.
package transformer
