package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/gdist/gdist"
	"github.com/gdist/gdist/internal/cli"
)

// runGenerate is the generate command.
func runGenerate(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	fs := flag.NewFlagSet("generate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg genConfig
	fs.StringVar(&cfg.Ckpt, "ckpt", defaultCkpt, "checkpoint written by train (or a .safetensors model)")
	fs.IntVar(&cfg.Heads, "heads", 0, "attention heads of a .safetensors model that does not record its configuration")
	fs.StringVar(&cfg.Prompt, "prompt", "Light is", "text to continue (characters of the training text only)")
	fs.IntVar(&cfg.N, "n", 200, "tokens (characters) to generate")
	fs.Float64Var(&cfg.Temperature, "temperature", 0.8, "sampling temperature (0: greedy)")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the sampler")
	fs.BoolVar(&cfg.NoCache, "no-cache", false, "recompute the whole window for every token instead of keeping a KV cache")
	fs.IntVar(&cfg.TP, "tp", 1, "with the cache: tensor-parallel ranks per pipeline stage (the stages are N/tp)")
	split := fs.String("split", "", "pipeline: first layer of stages 1..N-1, comma-separated (layers are 0 = embedding, 1..L = blocks, L+1 = head; default: even split)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: [gdistrun -n N --] transformer generate [flags]

Continues a prompt with a trained model, keeping each layer's keys and
values (a KV cache) so that a new token costs one position. Under gdistrun
-n N the model runs as an N/tp-stage pipeline of tp tensor-parallel ranks
each: rank r keeps only its part of its stage's layers, and the text is the
same as on one process. Rank 0 prints it to stdout. -no-cache recomputes
the window for every token (an N-stage pipeline, -split).

Flags:
`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if cfg.Split, err = parseSplit(*split); err != nil {
		return usageError(fs, stderr, "%v", err)
	}
	if cfg.N < 0 || cfg.Temperature < 0 {
		return usageError(fs, stderr, "-n and -temperature must not be negative")
	}
	cli.SetProcs()

	pg, err := gdist.InitFromEnv(ctx)
	if err != nil {
		return err
	}
	defer cli.Close(&err, pg)
	res, err := generate(ctx, pg, cfg)
	if err != nil {
		return err
	}
	if pg.Rank() != 0 {
		fmt.Fprintf(stderr, "generate: stage %d of %d ran layers %d..%d\n", pg.Rank(), pg.WorldSize(), res.Layers[0], res.Layers[1])
		return nil
	}
	fmt.Fprintln(stdout, res.Text)
	mode := "1 process"
	if pg.WorldSize() > 1 {
		var parts []string
		for _, s := range res.Stages {
			parts = append(parts, fmt.Sprintf("%d..%d", s[0], s[1]))
		}
		mode = fmt.Sprintf("%d-stage pipeline, layers %s", len(res.Stages), strings.Join(parts, " | "))
		if cfg.TP > 1 {
			mode += fmt.Sprintf(", %d tensor-parallel ranks per stage", cfg.TP)
		}
	}
	fmt.Fprintf(stderr, "generate: %d tokens in %.2fs, %.1f tokens/s (%s; checkpoint step %d, temperature %g, seed %d)\n",
		res.Tokens, res.Elapsed.Seconds(), float64(res.Tokens)/res.Elapsed.Seconds(), mode+cacheNote(cfg), res.Step, cfg.Temperature, cfg.Seed)
	return nil
}

func cacheNote(cfg genConfig) string {
	if cfg.NoCache {
		return ", no cache"
	}
	return ", KV cache"
}
