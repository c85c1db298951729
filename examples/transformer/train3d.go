package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/parallel"
	"github.com/gdist/gdist/train/checkpoint"
)

// train3D trains cfg.Model on the Layout (package parallel): DP replicas of
// a PP-stage pipeline of TP-member stages. Every rank draws the same global
// batch of cfg.Batch windows from PCG(Seed, 0) (replica d trains on its
// share), so the run trains what one process with batch cfg.Batch would,
// up to rounding. It logs the loss every logEvery steps on w (rank 0) and
// returns the whole model's weights, gathered on every rank.
func train3D(ctx context.Context, pg *dist.ProcessGroup, c *corpus, cfg trainConfig, l parallel.Layout, w io.Writer, logEvery int) ([]checkpoint.Named, int, time.Duration, error) {
	tr, err := parallel.NewTrainer(ctx, pg, cfg.Model, l, cfg.Batch, parallel.WithMicroBatches(cfg.MicroBatches),
		parallel.WithAdam(cfg.LR, 1), parallel.WithBuildLock(&graphMu))
	if err != nil {
		return nil, 0, 0, err
	}
	defer tr.Close()
	pcfg := cfg
	pcfg.SameData = true
	sampler := newSampler(pcfg, 0)
	begin := time.Now()
	deadline := []float64{0}
	step := 0
	for ; cfg.Steps == 0 || step < cfg.Steps; step++ {
		// The ranks agree on stopping: rank 0's clock decides.
		if cfg.Duration > 0 {
			deadline[0] = 0
			if time.Since(begin) > cfg.Duration {
				deadline[0] = 1
			}
			if err := pg.Broadcast(ctx, dist.F64(deadline), 0); err != nil {
				return nil, step, 0, err
			}
			if deadline[0] == 1 {
				break
			}
		}
		in, tgt, err := sampler.sample(c.Train)
		if err != nil {
			return nil, step, 0, err
		}
		loss, err := tr.Step(ctx, in, tgt)
		if err != nil {
			return nil, step, 0, err
		}
		if logEvery > 0 && (step%logEvery == 0 || step+1 == cfg.Steps) {
			fmt.Fprintf(w, "train: step %d loss %.4f (%.1fs)\n", step+1, loss, time.Since(begin).Seconds())
		}
	}
	elapsed := time.Since(begin)
	ws, err := tr.Weights(ctx)
	return ws, step, elapsed, err
}
