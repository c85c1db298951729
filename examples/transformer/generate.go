package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/parallel"
	"github.com/gdist/gdist/dist/pipeline"
	"github.com/gdist/gdist/models/transformer"
)

// tagToken is the point-to-point tag of the sampled token the last stage
// sends back to the first (below pipeline.DefaultTagBase, whose range the
// pipeline uses).
const tagToken uint32 = 1

// errSplit means a -split is invalid for the model or the number of ranks.
var errSplit = errors.New("transformer: invalid layer split")

// genConfig is what generate needs besides the group.
type genConfig struct {
	Ckpt        string
	Prompt      string
	N           int     // tokens to generate
	Temperature float64 // 0: greedy
	Seed        uint64
	Split       []int // first layer of stages 1..world-1 (nil: even split)
	// NoCache recomputes the whole window for every token (the pipeline of
	// package pipeline with several ranks) instead of keeping a KV cache.
	NoCache bool
	// TP is the number of tensor-parallel ranks per pipeline stage with
	// the cache (0 or 1: none); the stages are world/TP.
	TP int
	// Heads is the number of attention heads of a safetensors Ckpt that
	// does not record its configuration (0: it must).
	Heads int
}

// genResult is what generate returns.
type genResult struct {
	Text    string        // prompt and generated text (rank 0; empty elsewhere)
	Tokens  int           // tokens generated
	Elapsed time.Duration // generation time (model loading excluded)
	Stages  [][2]int      // layer range [from, to] of every stage
	Layers  [2]int        // this rank's layers
	Step    int64         // training steps of the checkpoint
}

// generate extends cfg.Prompt by cfg.N tokens from the checkpoint. With one
// rank it runs the full model (transformer.Predictor and
// transformer.Generate). With several it is pipeline-parallel: rank r loads
// and runs only stage r's layers (transformer.LoadLayers), hidden states
// flow rank 0 -> 1 -> ... -> last (package pipeline), the last rank samples
// the next token (transformer.Sample with transformer.NewRNG(seed), as
// Generate does) and sends it back to rank 0, which appends it to the
// window. The text is the same as with one rank. Every rank calls generate
// with the same checkpoint and split; rank 0's prompt, count, temperature
// and seed are used everywhere.
func generate(ctx context.Context, pg *dist.ProcessGroup, cfg genConfig) (*genResult, error) {
	if cfg.N < 0 {
		return nil, fmt.Errorf("transformer: %d tokens to generate", cfg.N)
	}
	if !cfg.NoCache {
		return generateCached(ctx, pg, cfg)
	}
	if pg.WorldSize() == 1 {
		return generateLocal(ctx, cfg)
	}
	return generatePipeline(ctx, pg, cfg)
}

// encodePrompt encodes prompt with the checkpoint's vocabulary.
func encodePrompt(ck *transformer.Checkpoint, prompt string) ([]int, error) {
	if ck.Vocab == nil {
		return nil, fmt.Errorf("transformer: the checkpoint has no vocabulary")
	}
	if prompt == "" {
		return nil, transformer.ErrEmptyPrompt
	}
	ids, err := ck.Vocab.Encode(prompt)
	if err != nil {
		return nil, fmt.Errorf("prompt: %w", err)
	}
	return ids, nil
}

// generateLocal runs the full model in this process.
func generateLocal(ctx context.Context, cfg genConfig) (*genResult, error) {
	ck, err := loadModel(cfg.Ckpt, cfg.Heads)
	if err != nil {
		return nil, err
	}
	prompt, err := encodePrompt(ck, cfg.Prompt)
	if err != nil {
		return nil, err
	}
	graphMu.Lock()
	p, err := transformer.NewPredictor(ck.Config, ck.Tensors)
	graphMu.Unlock()
	if err != nil {
		return nil, err
	}
	defer p.Close()
	begin := time.Now()
	out, err := transformer.Generate(ctx, p, prompt, cfg.N, cfg.Temperature, cfg.Seed)
	if err != nil {
		return nil, err
	}
	head := ck.Config.HeadLayer()
	return &genResult{
		Text: cfg.Prompt + ck.Vocab.Decode(out), Tokens: len(out), Elapsed: time.Since(begin),
		Stages: [][2]int{{0, head}}, Layers: [2]int{0, head}, Step: ck.Step,
	}, nil
}

// stageRanges splits layers 0..numLayers-1 into world contiguous stages.
// split holds the first layer of stages 1..world-1, strictly increasing in
// (0, numLayers); nil means an even split (earlier stages get the extra
// layers).
func stageRanges(numLayers, world int, split []int) ([][2]int, error) {
	if world < 1 || world > numLayers {
		return nil, fmt.Errorf("%w: %d stages for a model of %d layers (embedding, blocks, head)", errSplit, world, numLayers)
	}
	starts := make([]int, 0, world)
	starts = append(starts, 0)
	if split == nil {
		for s := 1; s < world; s++ {
			starts = append(starts, starts[s-1]+numLayers/world+btoi(s-1 < numLayers%world))
		}
	} else {
		if len(split) != world-1 {
			return nil, fmt.Errorf("%w: %d split points for %d stages (want %d)", errSplit, len(split), world, world-1)
		}
		for _, s := range split {
			if s <= starts[len(starts)-1] || s >= numLayers {
				return nil, fmt.Errorf("%w: split %v must be strictly increasing in [1, %d]", errSplit, split, numLayers-1)
			}
			starts = append(starts, s)
		}
	}
	out := make([][2]int, world)
	for s := range world {
		end := numLayers
		if s+1 < world {
			end = starts[s+1]
		}
		out[s] = [2]int{starts[s], end - 1}
	}
	return out, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// parseSplit parses "a,b,c" into layer indices; "" is nil.
func parseSplit(s string) ([]int, error) {
	if s == "" {
		return nil, nil
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("%w: %q is not a list of layer numbers", errSplit, s)
		}
		out = append(out, n)
	}
	return out, nil
}

// header is what rank 0 tells the other stages before generating.
type header struct {
	promptLen, n int
	temperature  float64
	seed         uint64
}

func (h header) encode() []float64 {
	return []float64{float64(h.promptLen), float64(h.n), h.temperature, float64(h.seed >> 32), float64(h.seed & 0xffffffff)}
}

func decodeHeader(v []float64) header {
	return header{promptLen: int(v[0]), n: int(v[1]), temperature: v[2], seed: uint64(v[3])<<32 | uint64(v[4])}
}

// generatePipeline runs this rank's stage of the pipeline.
func generatePipeline(ctx context.Context, pg *dist.ProcessGroup, cfg genConfig) (*genResult, error) {
	rank, world := pg.Rank(), pg.WorldSize()
	// Every rank reads the config and vocabulary, then its own layers
	// only, and checks the split and the prompt before any message moves,
	// so that a bad argument fails every rank the same way.
	mc, vocab, step, err := loadConfig(cfg.Ckpt, cfg.Heads)
	if err != nil {
		return nil, err
	}
	meta := &transformer.Checkpoint{Config: mc, Vocab: vocab, Step: step}
	if mc.TiedHead {
		return nil, fmt.Errorf("%w: the model ties its output head to its embedding, so layer 0 and layer %d must be in one stage; generate on one process",
			errSplit, mc.HeadLayer())
	}
	stages, err := stageRanges(mc.NumLayers(), world, cfg.Split)
	if err != nil {
		return nil, err
	}
	promptIDs, err := encodePrompt(meta, cfg.Prompt)
	if err != nil {
		return nil, err
	}
	from, to := stages[rank][0], stages[rank][1]
	ck, err := loadLayers(cfg.Ckpt, from, to, cfg.Heads)
	if err != nil {
		return nil, err
	}

	// Rank 0's request rules.
	h := header{promptLen: len(promptIDs), n: cfg.N, temperature: cfg.Temperature, seed: cfg.Seed}
	hv := h.encode()
	if err := pg.Broadcast(ctx, dist.F64(hv), 0); err != nil {
		return nil, err
	}
	h = decodeHeader(hv)

	build := func(g *gorgonia.ExprGraph) (pipeline.Stage, error) {
		st, err := transformer.NewStage(g, mc, from, to, 1)
		if err != nil {
			return nil, err
		}
		if err := st.SetWeights(ck.Tensors); err != nil {
			return nil, err
		}
		return st, nil
	}
	p, err := pipeline.New(ctx, pg, build, pipeline.WithTraining(false), pipeline.WithBuildLock(&graphMu))
	if err != nil {
		return nil, err
	}
	defer p.Close()

	first, last := rank == 0, rank == world-1
	T, V := mc.Ctx, mc.Vocab
	tokens := slices.Clone(promptIDs) // rank 0
	ids := make([]int, T)
	var rng = transformer.NewRNG(h.seed) // last rank
	logits := make([]float64, V)
	tok := make([]float64, 1)
	begin := time.Now()
	for i := range h.n {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("transformer: generate: %w", err)
		}
		window := min(h.promptLen+i, T) // tokens the model sees this step
		var d pipeline.Data
		if first {
			d.Input = func(_ int, in *tensor.Dense) error {
				clear(ids)
				copy(ids, tokens[len(tokens)-window:])
				return transformer.FillOneHot(in, ids)
			}
		}
		if last {
			d.Output = func(_ int, out *tensor.Dense) error {
				switch x := out.Data().(type) {
				case []float32:
					for j, v := range x[(window-1)*V : window*V] {
						logits[j] = float64(v)
					}
				case []float64:
					copy(logits, x[(window-1)*V:window*V])
				default:
					return fmt.Errorf("transformer: logits of type %T", x)
				}
				tok[0] = float64(transformer.Sample(logits, h.temperature, rng))
				return nil
			}
		}
		if err := p.Infer(ctx, d); err != nil {
			return nil, err
		}
		switch {
		case last:
			if err := pg.Send(ctx, 0, tagToken, dist.F64(tok).Bytes()); err != nil {
				return nil, err
			}
		case first:
			if n, err := pg.RecvInto(ctx, world-1, tagToken, dist.F64(tok).Bytes()); err != nil {
				return nil, err
			} else if n != 8*len(tok) {
				return nil, fmt.Errorf("transformer: last stage sent a token message of %d bytes", n)
			}
			if tok[0] < 0 || tok[0] >= float64(V) || tok[0] != math.Trunc(tok[0]) {
				return nil, fmt.Errorf("transformer: last stage sent token %v (vocabulary %d)", tok[0], V)
			}
			tokens = append(tokens, int(tok[0]))
		}
	}
	res := &genResult{Tokens: h.n, Elapsed: time.Since(begin), Stages: stages, Layers: [2]int{from, to}, Step: meta.Step}
	if first {
		res.Text = cfg.Prompt + meta.Vocab.Decode(tokens[len(promptIDs):])
	}
	return res, nil
}

// generateCached generates with a KV cache: on one process with a
// transformer.Decoder, else on a pipeline of world/TP stages of TP
// tensor-parallel ranks (parallel.Generator), every rank loading the
// checkpoint and keeping its part.
func generateCached(ctx context.Context, pg *dist.ProcessGroup, cfg genConfig) (*genResult, error) {
	ck, err := loadModel(cfg.Ckpt, cfg.Heads)
	if err != nil {
		return nil, err
	}
	prompt, err := encodePrompt(ck, cfg.Prompt)
	if err != nil {
		return nil, err
	}
	tpn := max(cfg.TP, 1)
	if pg.WorldSize()%tpn != 0 {
		return nil, fmt.Errorf("%w: %d ranks do not split into stages of %d tensor-parallel ranks", errSplit, pg.WorldSize(), tpn)
	}
	l := parallel.Layout{DP: 1, PP: pg.WorldSize() / tpn, TP: tpn}
	if err := l.Validate(pg.WorldSize(), ck.Config); err != nil {
		return nil, fmt.Errorf("%w: %w", errSplit, err)
	}
	g, err := parallel.NewGenerator(ctx, pg, ck.Config, l, 1, parallel.WithWeights(ck.Tensors), parallel.WithBuildLock(&graphMu))
	if err != nil {
		return nil, err
	}
	defer g.Close()
	begin := time.Now()
	out, err := g.Generate(ctx, []transformer.Request{{Prompt: prompt, N: cfg.N, Temperature: cfg.Temperature, Seed: cfg.Seed}})
	if err != nil {
		return nil, err
	}
	stages := l.Stages(ck.Config.NumLayers())
	res := &genResult{Tokens: cfg.N, Elapsed: time.Since(begin), Stages: stages, Layers: stages[pg.Rank()/tpn], Step: ck.Step}
	if pg.Rank() == 0 {
		res.Text = cfg.Prompt + ck.Vocab.Decode(out[0])
	}
	return res, nil
}
