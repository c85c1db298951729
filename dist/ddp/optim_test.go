package ddp_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/ddp"
	"github.com/gdist/gdist/dist/disttest"
	"github.com/gdist/gdist/dist/internal/dptest"
	"github.com/gdist/gdist/models/mlp"
	"github.com/gdist/gdist/train/optim"
)

// optimBuildMu serialises Gorgonia graph construction across the rank
// goroutines of these tests (it touches package globals).
var optimBuildMu sync.Mutex

// TestOptimSolvers trains the MLP with DDP on 2 in-process ranks for a few
// steps with Gorgonia's solver and with train/optim's of the same settings:
// the parameters are bitwise equal on every rank. A third run exports the
// optim solver's state half way, through its flat (checkpoint) form, and
// continues in a fresh solver: bitwise equal too.
func TestOptimSolvers(t *testing.T) {
	const ranks, rows, steps, resumeAt = 2, 4, 6, 3
	sizes := []int{6, 8, 4}
	type solvers struct {
		name   string
		theirs func() gorgonia.Solver
		ours   func() (optim.Solver, error)
	}
	kinds := []solvers{
		{"adam", func() gorgonia.Solver {
			return gorgonia.NewAdamSolver(gorgonia.WithLearnRate(0.05), gorgonia.WithL2Reg(1e-3), gorgonia.WithClip(2))
		}, func() (optim.Solver, error) {
			return optim.NewAdam(optim.WithLearnRate(0.05), optim.WithL2Reg(1e-3), optim.WithClip(2))
		}},
		{"momentum", func() gorgonia.Solver {
			return gorgonia.NewMomentum(gorgonia.WithLearnRate(0.1), gorgonia.WithMomentum(0.8))
		}, func() (optim.Solver, error) {
			return optim.NewMomentum(optim.WithLearnRate(0.1), optim.WithMomentum(0.8))
		}},
		{"sgd", func() gorgonia.Solver {
			return gorgonia.NewVanillaSolver(gorgonia.WithLearnRate(0.1), gorgonia.WithBatchSize(2))
		}, func() (optim.Solver, error) {
			return optim.NewSGD(optim.WithLearnRate(0.1), optim.WithBatchSize(2))
		}},
	}
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		for _, k := range kinds {
			t.Run(k.name+"/"+dt.String(), func(t *testing.T) {
				// run trains on every rank; mode is "gorgonia", "optim" or
				// "resume". It returns each rank's parameter bits.
				run := func(mode string) [][]uint64 {
					groups := disttest.Cluster(t, ranks, dist.WithTimeout(30*time.Second))
					out, errs := disttest.Results(t, groups, func(rank int, pg *dist.ProcessGroup) ([]uint64, error) {
						return trainOptim(pg, mode, dt, sizes, rows, steps, resumeAt, k.theirs, k.ours)
					})
					for r, err := range errs {
						require.NoError(t, err, "%s rank %d", mode, r)
					}
					return out
				}
				want := run("gorgonia")
				got := run("optim")
				resumed := run("resume")
				for r := range ranks {
					assert.Equal(t, want[0], want[r], "gorgonia: rank %d differs from rank 0", r)
					assert.Equal(t, want[r], got[r], "optim differs from gorgonia on rank %d", r)
					assert.Equal(t, want[r], resumed[r], "resumed optim differs from gorgonia on rank %d", r)
				}
			})
		}
	}
}

// trainOptim trains the MLP on this rank's rows of a deterministic global
// batch and returns the final parameters' bits.
func trainOptim(pg *dist.ProcessGroup, mode string, dt tensor.Dtype, sizes []int, rows, steps, resumeAt int,
	theirs func() gorgonia.Solver, ours func() (optim.Solver, error)) ([]uint64, error) {
	optimBuildMu.Lock()
	g := gorgonia.NewGraph()
	m, err := mlp.New(g, mlp.Config{Sizes: sizes, Batch: rows, Dtype: dt, Seed: 11})
	optimBuildMu.Unlock()
	if err != nil {
		return nil, err
	}
	params := m.Learnables()
	d, err := ddp.Wrap(context.Background(), pg, params, ddp.WithBucketCap(64))
	if err != nil {
		return nil, err
	}
	optimBuildMu.Lock()
	x, y := m.NewInputs()
	var logits, loss *gorgonia.Node
	fw, err := d.Hooked()
	if err == nil {
		logits, err = m.ForwardWith(x, fw)
	}
	if err == nil {
		loss, err = mlp.Loss(logits, y)
	}
	if err == nil {
		_, err = gorgonia.Grad(loss, params...)
	}
	optimBuildMu.Unlock()
	if err != nil {
		return nil, err
	}
	vm := gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(params...))
	defer vm.Close()
	start := paramBits(params)

	var inner gorgonia.Solver
	var own optim.Solver
	if mode == "gorgonia" {
		inner = theirs()
	} else {
		if own, err = ours(); err != nil {
			return nil, err
		}
		inner = own
	}
	solver := d.Solver(inner)
	lo := pg.Rank() * rows
	for step := range steps {
		if mode == "resume" && step == resumeAt {
			// Save and restore as a checkpoint would, into a fresh solver.
			st, err := optim.Unflatten(own.State().Flatten())
			if err != nil {
				return nil, err
			}
			if own, err = optim.New(st); err != nil {
				return nil, err
			}
			solver = d.Solver(own)
		}
		xv, yv := dptest.Batch(dt, step, lo, lo+rows, sizes[0], sizes[len(sizes)-1])
		if err := gorgonia.Let(x, xv); err != nil {
			return nil, err
		}
		if err := gorgonia.Let(y, yv); err != nil {
			return nil, err
		}
		if err := vm.RunAll(); err != nil {
			return nil, err
		}
		if err := solver.Step(gorgonia.NodesToValueGrads(params)); err != nil {
			return nil, err
		}
		vm.Reset()
	}
	out := paramBits(params)
	if slices.Equal(out, start) {
		return nil, fmt.Errorf("%s: the parameters did not move", mode)
	}
	return out, nil
}

func paramBits(params gorgonia.Nodes) []uint64 {
	var out []uint64
	for _, p := range params {
		switch v := p.Value().Data().(type) {
		case []float32:
			for _, e := range v {
				out = append(out, uint64(math.Float32bits(e)))
			}
		case []float64:
			for _, e := range v {
				out = append(out, math.Float64bits(e))
			}
		}
	}
	return out
}
