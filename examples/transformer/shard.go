package main

// -shard: the data-parallel wrapper of train (DDP, ZeRO-1, ZeRO-2 or fully
// sharded) and the sharded checkpoints of the sharded modes.

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/ckpt"
	"github.com/gdist/gdist/dist/ddp"
	"github.com/gdist/gdist/dist/fsdp"
	"github.com/gdist/gdist/models/transformer"
	"github.com/gdist/gdist/train/checkpoint"
)

// sharding returns the -shard mode, "none" for DDP.
func (c trainConfig) sharding() string {
	if c.Shard == "" {
		return "none"
	}
	return c.Shard
}

// checkShard refuses an unknown -shard, and sharding with a pipeline.
func (c trainConfig) checkShard() error {
	switch c.sharding() {
	case "none":
		return nil
	case "zero1", "zero2", "full":
	default:
		return fmt.Errorf("transformer: -shard %q: want none, zero1, zero2 or full", c.Shard)
	}
	switch {
	case c.Pipeline:
		return fmt.Errorf("transformer: -shard %s shards data-parallel training, not a pipeline", c.Shard)
	case c.Shards > 1:
		return fmt.Errorf("transformer: -shard %s with %d data shards in one process", c.Shard, c.Shards)
	}
	return nil
}

// wrapper is what train needs of a *ddp.DDP or an *fsdp.FSDP.
type wrapper interface {
	ckpt.Sharded
	Hook(p *gorgonia.Node) (*gorgonia.Node, error)
	Err() error
	Close() error
}

// dataParallel is train's data-parallel wrapper, if any.
type dataParallel struct {
	cfg trainConfig
	w   wrapper    // d or f; nil in one process without -shard
	d   *ddp.DDP   // DDP or ZeRO
	f   *fsdp.FSDP // -shard full
}

// wrap wraps st's parameters for cfg.Shard: in a DDP (with WithZeRO for
// zero1 and zero2) or in an FSDP with one unit per layer. A collective.
func (p *dataParallel) wrap(ctx context.Context, pg *dist.ProcessGroup, st *transformer.Stage) error {
	switch s := p.cfg.sharding(); s {
	case "full":
		var units []gorgonia.Nodes
		for _, n := range st.Learnables() {
			l, _ := transformer.LayerOf(n.Name())
			if len(units) <= l {
				units = append(units, make([]gorgonia.Nodes, l+1-len(units))...)
			}
			units[l] = append(units[l], n)
		}
		f, err := fsdp.Wrap(ctx, pg, units)
		if err != nil {
			return err
		}
		p.f, p.w = f, f
	default:
		var opts []ddp.Option
		if p.cfg.BucketCap > 0 {
			opts = append(opts, ddp.WithFirstBucketCap(p.cfg.BucketCap), ddp.WithBucketCap(p.cfg.BucketCap))
		}
		if s != "none" {
			opts = append(opts, ddp.WithZeRO(int(s[4]-'0')))
		}
		d, err := ddp.Wrap(ctx, pg, st.Learnables(), opts...)
		if err != nil {
			return err
		}
		p.d, p.w = d, d
	}
	return nil
}

// solver wraps the inner solver.
func (p *dataParallel) solver(inner gorgonia.Solver) gorgonia.Solver {
	if p.f != nil {
		return p.f.Solver(inner)
	}
	return p.d.Solver(inner)
}

// buckets is the number of DDP buckets or FSDP units (0 without a wrapper).
func (p *dataParallel) buckets() int {
	switch {
	case p.d != nil:
		return len(p.d.Buckets())
	case p.f != nil:
		return len(p.f.Units())
	}
	return 0
}

// addStats adds the last step's FSDP statistics to res.
func (p *dataParallel) addStats(res *trainResult) {
	if p.f == nil {
		return
	}
	s := p.f.Stats()
	res.FSDP.Gathers += s.Gathers
	res.FSDP.Reduces += s.Reduces
	res.FSDP.Bytes += s.Bytes
	res.FSDP.GatherWait += s.GatherWait
	res.FSDP.ReduceWait += s.ReduceWait
}

// weights returns the whole model's parameters: the trainer's own, or
// gathered from every rank's pieces under full sharding (a collective).
func (p *dataParallel) weights(ctx context.Context, tr *transformer.Trainer) ([]checkpoint.Named, error) {
	if p.f == nil {
		return tr.Weights(), nil
	}
	ts, err := p.f.FullParams(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]checkpoint.Named, len(ts))
	for i, n := range p.f.Params() {
		out[i] = checkpoint.Named{Name: n.Name(), Tensor: ts[i].(*tensor.Dense)}
	}
	return out, nil
}

func (p *dataParallel) close() {
	if p.w != nil {
		_ = p.w.Close()
	}
}

// shardedKeep is how many sharded checkpoints a run keeps.
const shardedKeep = 3

// resumeSharded resumes from the newest sharded checkpoint under
// cfg.CkptDir, if any (a collective), and returns the step to go on from.
// Each rank's batch generator comes back when the number of ranks is the
// one that saved; on another number every rank starts its stream afresh
// from (Seed, rank), which the log says.
func (p *dataParallel) resumeSharded(ctx context.Context, rs *resumable, h trainHooks) (int64, error) {
	r, err := ckpt.ResumeSharded(ctx, p.w, rs.adam, p.cfg.CkptDir, nil)
	if err != nil || r.Fresh() {
		return 0, err
	}
	var got runConfig
	if err := json.Unmarshal(r.State.Config.(json.RawMessage), &got); err != nil {
		return 0, fmt.Errorf("transformer: checkpoint %s: %w", r.Path, err)
	}
	want := rs.run
	got.World, want.World = 0, 0
	if got.key() != want.key() {
		return 0, fmt.Errorf("transformer: checkpoint %s is of another run (%s), not this one (%s): use another -ckpt-dir", r.Path, got.key(), want.key())
	}
	if r.State.RNG != nil {
		if err := rs.sampler.UnmarshalBinary(r.State.RNG); err != nil {
			return 0, fmt.Errorf("transformer: checkpoint %s: %w", r.Path, err)
		}
	}
	if p.w.ProcessGroup().Rank() == 0 && h.resumedSharded != nil {
		h.resumedSharded(r)
	}
	return r.Step, nil
}

// saveSharded saves the sharded checkpoint of step (a collective).
func (p *dataParallel) saveSharded(ctx context.Context, rs *resumable, step int64, res *trainResult) error {
	rng, err := rs.sampler.MarshalBinary()
	if err != nil {
		return err
	}
	start := time.Now()
	st := &checkpoint.State{Config: rs.run, Step: step, RNG: rng}
	if err := ckpt.SaveSharded(ctx, p.w, rs.adam, p.cfg.CkptDir, st, shardedKeep); err != nil {
		return err
	}
	res.Sharded++
	res.ShardedTime += time.Since(start)
	return nil
}

// fsdpSummary describes rank 0's collectives per step under full sharding.
func fsdpSummary(res *trainResult) string {
	n := float64(max(res.Steps-res.Start, 1))
	s := res.FSDP
	return fmt.Sprintf("train: FSDP per step: %.0f all-gathers and %.0f reduce-scatters (%.1f KB), the passes waited %.2f ms for gathers, the step %.2f ms for reduce-scatters",
		float64(s.Gathers)/n, float64(s.Reduces)/n, float64(s.Bytes)/n/1e3, s.GatherWait.Seconds()*1e3/n, s.ReduceWait.Seconds()*1e3/n)
}
