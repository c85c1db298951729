package ckpt_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/ckpt"
	"github.com/gdist/gdist/dist/ddp"
	"github.com/gdist/gdist/dist/disttest"
	"github.com/gdist/gdist/dist/fsdp"
	"github.com/gdist/gdist/dist/internal/dptest"
	"github.com/gdist/gdist/models/mlp"
	"github.com/gdist/gdist/train/checkpoint"
	"github.com/gdist/gdist/train/optim"
)

// layouts are the ways a job can hold its state.
var layouts = []string{"ddp", "zero1", "zero2", "fsdp"}

// shardJob is one rank's model under a layout.
type shardJob struct {
	w      ckpt.Sharded
	hook   func(*gorgonia.Node) (*gorgonia.Node, error)
	solver gorgonia.Solver // the wrapper's
	adam   *optim.Adam     // its inner solver
	close  func() error
	step   func(rank, step int) error
}

// newShardJob builds rank pg.Rank()'s MLP of the given sizes under layout.
func newShardJob(ctx context.Context, pg *dist.ProcessGroup, layout string, sizes []int, dt tensor.Dtype) (*shardJob, error) {
	const rows = 2
	dptest.BuildMu.Lock()
	g := gorgonia.NewGraph()
	m, err := mlp.New(g, mlp.Config{Sizes: sizes, Batch: rows, Dtype: dt, Seed: 3})
	dptest.BuildMu.Unlock()
	if err != nil {
		return nil, err
	}
	ps := m.Learnables()
	j := &shardJob{}
	if j.adam, err = optim.NewAdam(optim.WithLearnRate(0.01)); err != nil {
		return nil, err
	}
	bind := false
	switch layout {
	case "fsdp":
		var units []gorgonia.Nodes
		for l := 0; l+1 < len(ps); l += 2 {
			units = append(units, ps[l:l+2])
		}
		f, err := fsdp.Wrap(ctx, pg, units)
		if err != nil {
			return nil, err
		}
		j.w, j.hook, j.solver, j.close = f, f.Hook, f.Solver(j.adam), f.Close
	default:
		stage := map[string]int{"ddp": 0, "zero1": 1, "zero2": 2}[layout]
		d, err := ddp.Wrap(ctx, pg, ps, ddp.WithZeRO(stage), ddp.WithBucketCap(256), ddp.WithFirstBucketCap(128))
		if err != nil {
			return nil, err
		}
		j.w, j.hook, j.solver, j.close = d, d.Hook, d.Solver(j.adam), d.Close
		bind = stage == 0
	}
	x, y, _, err := dptest.Build(m, j.hook)
	if err != nil {
		return nil, errors.Join(err, j.close())
	}
	var vmOpts []gorgonia.VMOpt
	if bind {
		vmOpts = append(vmOpts, gorgonia.BindDualValues(ps...))
	}
	vm := gorgonia.NewTapeMachine(g, vmOpts...)
	closeW := j.close
	j.close = func() error { return errors.Join(vm.Close(), closeW()) }
	j.step = func(rank, step int) error {
		xv, yv := dptest.Batch(dt, step, rank*rows, (rank+1)*rows, sizes[0], sizes[len(sizes)-1])
		if err := errors.Join(gorgonia.Let(x, xv), gorgonia.Let(y, yv)); err != nil {
			return err
		}
		defer vm.Reset()
		if err := vm.RunAll(); err != nil {
			return err
		}
		return j.solver.Step(gorgonia.NodesToValueGrads(ps))
	}
	return j, nil
}

// fullBits is a job's whole state, every number as its bits.
type fullBits struct {
	params []uint64
	opt    []uint64
	iter   int
	hyper  optim.Hyper
	epoch  int64
}

func bitsOf(ctx context.Context, w ckpt.Sharded, s optim.Solver) (fullBits, error) {
	params, st, err := ckpt.FullState(ctx, w, s)
	if err != nil {
		return fullBits{}, err
	}
	var fb fullBits
	add := func(dst *[]uint64, data any) {
		switch v := data.(type) {
		case []float32:
			for _, x := range v {
				*dst = append(*dst, uint64(math.Float32bits(x)))
			}
		case []float64:
			for _, x := range v {
				*dst = append(*dst, math.Float64bits(x))
			}
		}
	}
	for _, p := range params {
		add(&fb.params, p.Tensor.Data())
	}
	for _, p := range st.Params {
		for _, sl := range p.Slots {
			add(&fb.opt, sl.F32)
			add(&fb.opt, sl.F64)
		}
	}
	fb.iter, fb.hyper = st.Iter, st.Hyper
	return fb, nil
}

// TestReshard saves at 2 ranks under each layout and loads at 1, 2, 3 and
// 4 ranks under every layout: the whole state gathered after the load is
// bitwise the state gathered before the save.
func TestReshard(t *testing.T) {
	sizes := []int{11, 16, 12, 7, 5}
	ctx := context.Background()
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		for _, saver := range layouts {
			dir := t.TempDir()
			groups := disttest.Cluster(t, 2, dist.WithTimeout(30*time.Second))
			saved, errs := disttest.Results(t, groups, func(rank int, pg *dist.ProcessGroup) (fullBits, error) {
				j, err := newShardJob(ctx, pg, saver, sizes, dt)
				if err != nil {
					return fullBits{}, err
				}
				defer j.close()
				for s := range 3 {
					if err := j.step(rank, s); err != nil {
						return fullBits{}, err
					}
				}
				fb, err := bitsOf(ctx, j.w, j.adam)
				if err != nil {
					return fullBits{}, err
				}
				st := &checkpoint.State{Step: 3, Epoch: 1, Sampler: []byte("pos"), Meta: map[string]string{"k": "v"}, RNG: []byte{byte('a' + rank)}}
				return fb, ckpt.SaveSharded(ctx, j.w, j.adam, dir, st, 2)
			})
			require.NoError(t, errors.Join(errs...), "%v save under %s", dt, saver)
			require.Equal(t, saved[0], saved[1])
			require.Equal(t, 3, saved[0].iter)
			for _, n := range []int{1, 2, 3, 4} {
				for _, loader := range layouts {
					groups := disttest.Cluster(t, n, dist.WithTimeout(30*time.Second))
					got, errs := disttest.Results(t, groups, func(rank int, pg *dist.ProcessGroup) (fullBits, error) {
						j, err := newShardJob(ctx, pg, loader, sizes, dt)
						if err != nil {
							return fullBits{}, err
						}
						defer j.close()
						r, err := ckpt.ResumeSharded(ctx, j.w, j.adam, dir, nil)
						if err != nil {
							return fullBits{}, err
						}
						if r.Step != 3 || r.World != 2 || r.Layout != saver || r.State.Epoch != 1 || string(r.State.Sampler) != "pos" || r.State.Meta["k"] != "v" {
							return fullBits{}, fmt.Errorf("resumed %+v, state %+v", r, r.State)
						}
						// Each rank's own RNG state comes back when the world
						// size is the one that saved.
						if wantRNG := []byte{byte('a' + rank)}; (n == 2) != (string(r.State.RNG) == string(wantRNG)) || (n != 2 && r.State.RNG != nil) {
							return fullBits{}, fmt.Errorf("rank %d of %d: RNG %q", rank, n, r.State.RNG)
						}
						return bitsOf(ctx, j.w, j.adam)
					})
					require.NoError(t, errors.Join(errs...), "%v saved under %s at 2, loaded under %s at %d", dt, saver, loader, n)
					for r := range n {
						assert.Equal(t, saved[0], got[r], "%v saved under %s at 2, loaded under %s at %d: rank %d", dt, saver, loader, n, r)
					}
				}
			}
		}
	}
}

// TestReshardContinues: a run saved at 2 ranks under ZeRO-2 and continued at
// 3 ranks fully sharded trains on as a 3-rank DDP run started from the
// same checkpoint does.
func TestReshardContinues(t *testing.T) {
	sizes := []int{11, 16, 12, 7, 5}
	ctx := context.Background()
	dir := t.TempDir()
	groups := disttest.Cluster(t, 2, dist.WithTimeout(30*time.Second))
	errs := disttest.Run(t, groups, func(rank int, pg *dist.ProcessGroup) error {
		j, err := newShardJob(ctx, pg, "zero2", sizes, tensor.Float64)
		if err != nil {
			return err
		}
		defer j.close()
		for s := range 5 {
			if err := j.step(rank, s); err != nil {
				return err
			}
		}
		return ckpt.SaveSharded(ctx, j.w, j.adam, dir, &checkpoint.State{Step: 5}, 1)
	})
	require.NoError(t, errors.Join(errs...))
	cont := func(layout string) []uint64 {
		groups := disttest.Cluster(t, 3, dist.WithTimeout(30*time.Second))
		out, errs := disttest.Results(t, groups, func(rank int, pg *dist.ProcessGroup) ([]uint64, error) {
			j, err := newShardJob(ctx, pg, layout, sizes, tensor.Float64)
			if err != nil {
				return nil, err
			}
			defer j.close()
			if _, err := ckpt.ResumeSharded(ctx, j.w, j.adam, dir, nil); err != nil {
				return nil, err
			}
			for s := 5; s < 10; s++ {
				if err := j.step(rank, s); err != nil {
					return nil, err
				}
			}
			fb, err := bitsOf(ctx, j.w, j.adam)
			return fb.params, err
		})
		require.NoError(t, errors.Join(errs...))
		return out[0]
	}
	want := cont("ddp")
	got := cont("fsdp")
	var d, m float64
	for i := range want {
		a, b := math.Float64frombits(got[i]), math.Float64frombits(want[i])
		d, m = d+(a-b)*(a-b), m+b*b
	}
	assert.LessOrEqual(t, math.Sqrt(d/m), 1e-12)
}

// TestShardedFallsBack: a checkpoint with a damaged rank file is passed
// over on every rank for the one before; a checkpoint of another model or
// another optimizer is refused naming the part.
func TestShardedFallsBack(t *testing.T) {
	sizes := []int{11, 16, 12, 7, 5}
	ctx := context.Background()
	dir := t.TempDir()
	groups := disttest.Cluster(t, 2, dist.WithTimeout(30*time.Second))
	errs := disttest.Run(t, groups, func(rank int, pg *dist.ProcessGroup) error {
		j, err := newShardJob(ctx, pg, "fsdp", sizes, tensor.Float32)
		if err != nil {
			return err
		}
		defer j.close()
		for s := range 2 {
			if err := j.step(rank, s); err != nil {
				return err
			}
			if err := ckpt.SaveSharded(ctx, j.w, j.adam, dir, &checkpoint.State{Step: int64(s + 1)}, 3); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, errors.Join(errs...))
	// Damage rank 1's file of step 2.
	p := filepath.Join(checkpoint.ShardedPath(dir, 2), checkpoint.RankFile(1))
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	b[len(b)/2] ^= 0xFF
	require.NoError(t, os.WriteFile(p, b, 0o644))

	resume := func(n int, layout string, sizes []int, kind string) []error {
		groups := disttest.Cluster(t, n, dist.WithTimeout(30*time.Second))
		_, errs := disttest.Results(t, groups, func(rank int, pg *dist.ProcessGroup) (int64, error) {
			j, err := newShardJob(ctx, pg, layout, sizes, tensor.Float32)
			if err != nil {
				return 0, err
			}
			defer j.close()
			var s optim.Solver = j.adam
			if kind == "sgd" {
				if s, err = optim.NewSGD(); err != nil {
					return 0, err
				}
			}
			r, err := ckpt.ResumeSharded(ctx, j.w, s, dir, nil)
			if err != nil {
				return 0, err
			}
			if r.Step != 1 {
				return r.Step, fmt.Errorf("resumed step %d, want 1", r.Step)
			}
			return r.Step, nil
		})
		return errs
	}
	require.NoError(t, errors.Join(resume(3, "zero1", sizes, "adam")...))
	for _, errs := range [][]error{resume(2, "fsdp", []int{11, 16, 12, 5}, "adam"), resume(2, "ddp", sizes, "sgd")} {
		for r, err := range errs {
			var inc *ckpt.IncompatibleError
			require.ErrorAs(t, err, &inc, "rank %d", r)
			t.Logf("rank %d: %v", r, err)
		}
	}
}
