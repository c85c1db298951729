package main

// -shard: the trainer's data-parallel wrapper (DDP, ZeRO-1, ZeRO-2 or fully
// sharded), and the sharded checkpoints of the sharded modes.

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/ckpt"
	"github.com/gdist/gdist/dist/ddp"
	"github.com/gdist/gdist/dist/fsdp"
	"github.com/gdist/gdist/train/checkpoint"
	mdata "github.com/gdist/gdist/train/data"
)

// wrapper is what the trainer needs of a *ddp.DDP or an *fsdp.FSDP.
type wrapper interface {
	ckpt.Sharded
	Hook(p *gorgonia.Node) (*gorgonia.Node, error)
	Err() error
}

// sharding returns cfg.Shard checked, "none" for DDP.
func sharding(cfg config) string {
	if cfg.Shard == "" {
		return "none"
	}
	return cfg.Shard
}

// checkShard refuses an unknown -shard and flags that do not go with it.
func checkShard(cfg config) error {
	switch sharding(cfg) {
	case "none", "zero1", "zero2":
	case "full":
		if cfg.Compress != "" || cfg.BucketCap != 0 {
			return fmt.Errorf("mnist: -shard full has no buckets to compress or cap (-compress, -bucket-cap)")
		}
	default:
		return fmt.Errorf("mnist: -shard %q: want none, zero1, zero2 or full", cfg.Shard)
	}
	if sharding(cfg) != "none" && cfg.Compress != "" {
		return fmt.Errorf("mnist: -shard %s reduce-scatters in float32: no -compress", cfg.Shard)
	}
	return nil
}

// wrap wraps the parameters for -shard: in a DDP (with WithZeRO for zero1
// and zero2) or an FSDP with one unit per layer. Every rank calls it.
func (t *trainer) wrap(ctx context.Context, opts []ddp.Option) error {
	switch s := sharding(t.cfg); s {
	case "full":
		var units []gorgonia.Nodes
		for l := 0; l+1 < len(t.params); l += 2 {
			units = append(units, t.params[l:l+2])
		}
		f, err := fsdp.Wrap(ctx, t.pg, units)
		if err != nil {
			return err
		}
		t.f, t.w = f, f
	default:
		if s != "none" {
			opts = append(opts, ddp.WithZeRO(int(s[4]-'0')))
		}
		d, err := ddp.Wrap(ctx, t.pg, t.params, opts...)
		if err != nil {
			return err
		}
		t.d, t.w = d, d
	}
	return nil
}

// buckets is the number of DDP buckets, or of FSDP units.
func (t *trainer) buckets() int {
	if t.d != nil {
		return len(t.d.Buckets())
	}
	return len(t.f.Units())
}

// commStats returns the last step's communication time (-1 when not
// measured: under full sharding the collectives overlap the passes unit by
// unit) and the time spent waiting for it.
func (t *trainer) commStats() (comm, exposed time.Duration) {
	if t.d != nil {
		st := t.d.Stats()
		return st.Comm, st.Exposed + st.Gather
	}
	st := t.f.Stats()
	return -1, st.GatherWait + st.ReduceWait
}

// weights returns the whole parameters, in order: the model's own tensors,
// or under full sharding the units gathered (a collective: every rank
// calls it).
func (t *trainer) weights(ctx context.Context) ([]tensor.Tensor, error) {
	if t.f != nil {
		return t.f.FullParams(ctx)
	}
	out := make([]tensor.Tensor, len(t.params))
	for i, p := range t.params {
		out[i] = p.Value().(tensor.Tensor)
	}
	return out, nil
}

// shardedKeep is how many sharded checkpoints a run keeps.
const shardedKeep = 3

// resumeSharded loads the newest sharded checkpoint under cfg.CkptDir, if
// any (a collective), and returns the step, the epoch's loss sum so far
// and the world size and layout that saved it.
func (t *trainer) resumeSharded(ctx context.Context, sampler *mdata.DistributedSampler) (*ckpt.ShardedResumed, float64, error) {
	r, err := ckpt.ResumeSharded(ctx, t.w, t.adam, t.cfg.CkptDir, nil)
	if err != nil || r.Fresh() {
		return r, 0, err
	}
	lossSum, err := t.restoreMeta(r.Path, r.State, sampler)
	return r, lossSum, err
}

// maybeSaveSharded saves a sharded checkpoint after step every
// cfg.CkptEvery steps (a collective) and reports whether it did.
func (t *trainer) maybeSaveSharded(ctx context.Context, step int64, epoch int, sampler *mdata.DistributedSampler, lossSum float64) (bool, error) {
	if t.cfg.CkptEvery == 0 || step%t.cfg.CkptEvery != 0 {
		return false, nil
	}
	return true, t.saveSharded(ctx, step, epoch-1, sampler, lossSum)
}

// shardedSaves counts a run's sharded saves and their time.
type shardedSaves struct {
	n    int
	took time.Duration
}

// saveSharded saves the sharded checkpoint of step (a collective): the ranks
// first add up their loss sums.
func (t *trainer) saveSharded(ctx context.Context, step int64, epoch int, sampler *mdata.DistributedSampler, lossSum float64) error {
	sum := []float64{lossSum}
	if err := t.pg.AllReduce(ctx, dist.F64(sum), dist.Sum); err != nil {
		return fmt.Errorf("mnist: step %d: adding up the loss for the checkpoint: %w", step, err)
	}
	pos, err := sampler.MarshalBinary()
	if err != nil {
		return err
	}
	st := &checkpoint.State{Config: t.ckptConfig(), Step: step, Epoch: int64(epoch), Sampler: pos,
		Meta: map[string]string{metaLossSum: strconv.FormatFloat(sum[0], 'g', -1, 64)}}
	start := time.Now()
	if err := ckpt.SaveSharded(ctx, t.w, t.adam, t.cfg.CkptDir, st, shardedKeep); err != nil {
		return err
	}
	t.saves.n++
	t.saves.took += time.Since(start)
	return nil
}
