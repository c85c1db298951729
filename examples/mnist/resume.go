package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"strconv"

	"github.com/gdist/gdist/internal/chaos"

	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/ckpt"
	"github.com/gdist/gdist/train/checkpoint"
	mdata "github.com/gdist/gdist/train/data"
	"github.com/gdist/gdist/train/optim"
)

// ckptConfig is what a checkpoint records of the run's configuration; a
// checkpoint of another configuration does not resume this run.
type ckptConfig struct {
	Format string `json:"format"`
	Sizes  []int  `json:"sizes"`
	Batch  int    `json:"batch"`
	World  int    `json:"world"`
	LR     float64
	Seed   int64
}

// metaLossSum is the metadata key of the epoch's running loss sum over all
// ranks, so that a resumed epoch reports the mean loss of an uninterrupted
// one (up to rounding: each rank resumes with the sum / world).
const metaLossSum = "mnist.loss_sum"

// position encodes a sampler's position (epoch, next index) without its
// rank, for Verify: every rank is at the same position, while the
// sampler's MarshalBinary also records the rank.
func position(s *mdata.DistributedSampler) []byte {
	e, n := s.Pos()
	b := binary.LittleEndian.AppendUint64(nil, uint64(e))
	return binary.LittleEndian.AppendUint64(b, uint64(n))
}

// liveState is the trainer's state after step: parameters (shared, not
// copied: Save copies them), the solver's state, where the sampler is and
// the epoch's loss sum so far.
func (t *trainer) liveState(step int64, epoch int, sampler *mdata.DistributedSampler, lossSum float64) (*checkpoint.State, error) {
	pos, err := sampler.MarshalBinary()
	if err != nil {
		return nil, err
	}
	st := &checkpoint.State{
		Config:    t.ckptConfig(),
		Optimizer: t.adam.State().Checkpoint(),
		Step:      step,
		Epoch:     int64(epoch),
		Sampler:   pos,
		Meta:      map[string]string{metaLossSum: strconv.FormatFloat(lossSum, 'g', -1, 64)},
	}
	for _, p := range t.params {
		st.Params = append(st.Params, checkpoint.Named{Name: p.Name(), Tensor: p.Value().(tensor.Tensor)})
	}
	return st, nil
}

func (t *trainer) ckptConfig() ckptConfig {
	return ckptConfig{Format: "gdist.mnist", Sizes: sizes, Batch: t.cfg.Batch, World: t.pg.WorldSize(), LR: t.cfg.LR, Seed: t.cfg.Seed}
}

// maybeSave saves a checkpoint after step if one is due and reports
// whether it was. Every rank calls it: the ranks first add up their loss
// sums (a collective).
func (t *trainer) maybeSave(ctx context.Context, m *ckpt.Manager, step int64, epoch int, sampler *mdata.DistributedSampler, lossSum float64) (bool, error) {
	due, err := m.Due(ctx, step)
	if err != nil || !due {
		return false, err
	}
	sum := []float64{lossSum}
	if err := t.pg.AllReduce(ctx, dist.F64(sum), dist.Sum); err != nil {
		return false, fmt.Errorf("mnist: step %d: adding up the loss for the checkpoint: %w", step, err)
	}
	if !m.Writer() {
		return true, nil
	}
	st, err := t.liveState(step, epoch-1, sampler, sum[0])
	if err != nil {
		return false, err
	}
	return true, m.Save(ctx, step, st)
}

// restore loads a checkpoint into the trainer, the solver and the sampler
// and returns the epoch's loss sum so far.
func (t *trainer) restore(r *ckpt.Resumed, sampler *mdata.DistributedSampler) (float64, error) {
	f := r.File
	lossSum, err := t.restoreMeta(r.Path, r.State, sampler)
	if err != nil {
		return 0, err
	}
	for _, p := range t.params {
		src, err := f.Tensor(p.Name())
		if err != nil {
			return 0, fmt.Errorf("mnist: checkpoint %s: %w", r.Path, err)
		}
		dst := p.Value().Data().([]float32)
		data, ok := src.Data().([]float32)
		if !ok || len(data) != len(dst) {
			return 0, fmt.Errorf("mnist: checkpoint %s: parameter %s is %v %v, want %v float32", r.Path, p.Name(), src.Shape(), src.Dtype(), p.Shape())
		}
		copy(dst, data)
	}
	st, err := optim.FromCheckpoint(r.State.Optimizer)
	if err != nil {
		return 0, fmt.Errorf("mnist: checkpoint %s: %w", r.Path, err)
	}
	if err := t.adam.SetState(st); err != nil {
		return 0, fmt.Errorf("mnist: checkpoint %s: %w", r.Path, err)
	}
	return lossSum, nil
}

// restoreMeta checks that the checkpoint at path (whose state record is st)
// is of this run, restores the sampler — from a job of another world size
// too: the rest of the epoch is dealt among this job's ranks — and returns
// this rank's share of the epoch's loss sum so far.
func (t *trainer) restoreMeta(path string, st *checkpoint.State, sampler *mdata.DistributedSampler) (float64, error) {
	var got ckptConfig
	raw, _ := st.Config.(json.RawMessage)
	if err := json.Unmarshal(raw, &got); err != nil {
		return 0, fmt.Errorf("mnist: checkpoint %s: configuration: %w", path, err)
	}
	want := t.ckptConfig()
	t.savedWorld = got.World
	got.World, want.World = 0, 0 // a job may resume on another number of ranks
	if fmt.Sprint(got) != fmt.Sprint(want) {
		return 0, fmt.Errorf("mnist: checkpoint %s is of another run (%+v), not this one (%+v): use another -ckpt-dir", path, got, want)
	}
	if _, err := sampler.Resume(st.Sampler); err != nil {
		return 0, fmt.Errorf("mnist: checkpoint %s: %w", path, err)
	}
	lossSum, err := strconv.ParseFloat(st.Meta[metaLossSum], 64)
	if err != nil || math.IsNaN(lossSum) {
		return 0, fmt.Errorf("mnist: checkpoint %s: bad %s %q", path, metaLossSum, st.Meta[metaLossSum])
	}
	if t.savedWorld != 0 && t.savedWorld != t.pg.WorldSize() {
		// The rest of the epoch has another number of steps: its mean
		// loss is over the steps taken from here.
		return 0, nil
	}
	return lossSum / float64(t.pg.WorldSize()), nil
}

// verifyState checks that every rank holds the same state before training
// (a collective).
func (t *trainer) verifyState(ctx context.Context, m *ckpt.Manager, step int64, sampler *mdata.DistributedSampler, lossSum float64) error {
	st, err := t.liveState(step, sampler.Epoch(), sampler, lossSum)
	if err != nil {
		return err
	}
	st.Sampler = position(sampler)
	return m.Verify(ctx, st)
}

// chaosEnv makes the program SIGKILL itself, for the chaos test (see
// package internal/chaos).
const chaosEnv = chaos.Env
