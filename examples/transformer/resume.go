package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"

	"github.com/gdist/gdist/internal/chaos"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist/ckpt"
	"github.com/gdist/gdist/models/transformer"
	"github.com/gdist/gdist/train/checkpoint"
	"github.com/gdist/gdist/train/optim"
)

// batchSampler draws each step's batch: Batch windows from the generator
// PCG(Seed, rank) (PCG(Seed, 0) with SameData or in a pipeline, where every
// stage draws the global batch), or with Shards > 1 the concatenation of
// Batch/Shards windows from each of PCG(Seed, 0..Shards-1). Its state — the
// generators' — is what a checkpoint saves as the RNG state.
type batchSampler struct {
	pcgs []*rand.PCG
	rngs []*rand.Rand
	per  int // windows per generator
	ctx  int
}

func newSampler(cfg trainConfig, rank int) *batchSampler {
	streams := []uint64{uint64(rank)}
	switch {
	case cfg.Shards > 1:
		streams = streams[:0]
		for k := range cfg.Shards {
			streams = append(streams, uint64(k))
		}
	case cfg.SameData:
		streams[0] = 0
	}
	s := &batchSampler{per: cfg.Batch / len(streams), ctx: cfg.Model.Ctx}
	for _, st := range streams {
		p := rand.NewPCG(cfg.Seed, st)
		s.pcgs = append(s.pcgs, p)
		s.rngs = append(s.rngs, rand.New(p))
	}
	return s
}

// sample returns the next batch's inputs and targets; the caller owns them.
func (s *batchSampler) sample(data []int) (in, tgt []int, err error) {
	for _, rng := range s.rngs {
		i, t, err := transformer.SampleBatch(rng, data, s.per, s.ctx)
		if err != nil {
			return nil, nil, err
		}
		in, tgt = append(in, i...), append(tgt, t...)
	}
	return in, tgt, nil
}

// MarshalBinary returns the generators' states, concatenated.
func (s *batchSampler) MarshalBinary() ([]byte, error) {
	var out []byte
	for _, p := range s.pcgs {
		b, err := p.MarshalBinary()
		if err != nil {
			return nil, err
		}
		out = append(out, b...)
	}
	return out, nil
}

// UnmarshalBinary restores states saved by MarshalBinary.
func (s *batchSampler) UnmarshalBinary(b []byte) error {
	if len(s.pcgs) == 0 || len(b)%len(s.pcgs) != 0 {
		return fmt.Errorf("transformer: RNG state of %d bytes for %d generators", len(b), len(s.pcgs))
	}
	n := len(b) / len(s.pcgs)
	for i, p := range s.pcgs {
		if err := p.UnmarshalBinary(b[i*n : (i+1)*n]); err != nil {
			return fmt.Errorf("transformer: RNG state: %w", err)
		}
	}
	return nil
}

// runConfig is what a training checkpoint records of the run: one of
// another run does not resume this one.
type runConfig struct {
	Format   string             `json:"format"`
	Model    transformer.Config `json:"model"`
	Batch    int                `json:"batch"`
	LR       float64            `json:"lr"`
	Seed     uint64             `json:"seed"`
	World    int                `json:"world"`
	SameData bool               `json:"same_data,omitempty"`
	Shards   int                `json:"shards,omitempty"`
	// Pipeline runs: the stage's layers and the micro-batches.
	Layers [2]int `json:"layers"`
	Micro  int    `json:"micro,omitempty"`
}

func (c runConfig) key() string {
	b, _ := json.Marshal(c)
	return string(b)
}

// resumable is what train and trainPipeline checkpoint: a stage's (or the
// whole model's) parameters, its solver, the batch sampler and the step.
type resumable struct {
	run     runConfig
	params  gorgonia.Nodes
	adam    *optim.Adam
	sampler *batchSampler
}

// state returns the live state after step. The parameter tensors are the
// model's own (Save copies them).
func (r *resumable) state(step int64) (*checkpoint.State, error) {
	rng, err := r.sampler.MarshalBinary()
	if err != nil {
		return nil, err
	}
	st := &checkpoint.State{Config: r.run, Optimizer: r.adam.State().Checkpoint(), Step: step, RNG: rng}
	for _, p := range r.params {
		st.Params = append(st.Params, checkpoint.Named{Name: p.Name(), Tensor: p.Value().(tensor.Tensor)})
	}
	return st, nil
}

// resume resumes from the checkpoint every rank agrees on, if any, checks
// that the ranks hold the same state and returns the step to go on from.
func (r *resumable) resume(ctx context.Context, m *ckpt.Manager, stage *transformer.Stage) (int64, *ckpt.Resumed, error) {
	res, err := m.Resume(ctx)
	if err != nil {
		return 0, nil, err
	}
	if !res.Fresh() {
		if err := r.restore(res, stage); err != nil {
			return 0, nil, fmt.Errorf("transformer: checkpoint %s: %w", res.Path, err)
		}
	}
	st, err := r.state(res.Step)
	if err != nil {
		return 0, nil, err
	}
	if err := m.Verify(ctx, st); err != nil {
		return 0, nil, err
	}
	return res.Step, res, nil
}

func (r *resumable) restore(res *ckpt.Resumed, stage *transformer.Stage) error {
	var got runConfig
	if err := res.File.Config(&got); err != nil {
		return err
	}
	if got.key() != r.run.key() {
		return fmt.Errorf("it is of another run (%s), not this one (%s): use another -ckpt-dir", got.key(), r.run.key())
	}
	if err := stage.SetWeights(res.File.Tensors()); err != nil {
		return err
	}
	st, err := optim.FromCheckpoint(res.State.Optimizer)
	if err != nil {
		return err
	}
	if err := r.adam.SetState(st); err != nil {
		return err
	}
	return r.sampler.UnmarshalBinary(res.State.RNG)
}

// chaosEnv makes the program SIGKILL itself, for the chaos test (see
// package internal/chaos).
const chaosEnv = chaos.Env

// finalSave saves the state of the last step unless its checkpoint was
// just taken, and waits for the write. Every rank calls it.
func finalSave(ctx context.Context, m *ckpt.Manager, rs *resumable, step, saved int) error {
	if step != saved && step > 0 {
		st, err := rs.state(int64(step))
		if err != nil {
			return err
		}
		if err := m.Save(ctx, int64(step), st); err != nil {
			return err
		}
	}
	return m.Close()
}
