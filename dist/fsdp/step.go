package fsdp

import (
	"context"
	"fmt"
	"time"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/internal/shard"
)

// Solver returns a gorgonia.Solver that finishes the reduce-scatters of the
// backward pass, averages the gradient pieces over the ranks, clips them
// (WithMaxGradNorm) and has inner step this rank's pieces of the
// parameters. It fits the usual loop:
//
//	vm.RunAll(); solver.Step(gorgonia.NodesToValueGrads(params)); vm.Reset()
//
// inner sees this rank's segments of the parameters (one
// gorgonia.ValueGrad per part of a parameter in a piece, see Segments), so
// its state covers 1/WorldSize of the model; any gorgonia.Solver works, and
// train/optim's solvers can save that state.
func (f *FSDP) Solver(inner gorgonia.Solver) *Solver { return &Solver{f: f, inner: inner} }

// Solver steps an FSDP's shards; see FSDP.Solver. Its Step has no context:
// waits use the group's default timeout (dist.WithTimeout).
type Solver struct {
	f     *FSDP
	inner gorgonia.Solver
}

var _ gorgonia.Solver = (*Solver)(nil)

// Step implements gorgonia.Solver. Every entry of model that is a
// *gorgonia.Node must be a parameter of the FSDP (else an error wrapping
// ErrNotParam); the inner solver steps the shards, not model.
func (s *Solver) Step(model []gorgonia.ValueGrad) error {
	for _, vg := range model {
		if n, ok := vg.(*gorgonia.Node); ok {
			if _, ok := s.f.index[n]; !ok {
				return fmt.Errorf("fsdp: solver step on %s: %w", n.Name(), ErrNotParam)
			}
		}
	}
	if err := s.f.checkBound(); err != nil {
		return err
	}
	views, err := s.f.sync(context.Background())
	if err != nil {
		return err
	}
	if err := s.inner.Step(views); err != nil {
		return fmt.Errorf("fsdp: step of this rank's shard: %w", err)
	}
	s.f.mu.Lock()
	s.f.version++
	s.f.mu.Unlock()
	return nil
}

// checkBound checks that every parameter node still has the value Wrap
// (or Hook) bound it to. A machine built with gorgonia.BindDualValues
// replaces it with a dual value holding a copy of the gathered parameters
// (and keeps a full gradient beside it), which FSDP does not read.
func (f *FSDP) checkBound() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, p := range f.params {
		// Without a dual value, Grad is the gradient node's value.
		g, err := p.Grad()
		dual := err == nil && (p.Deriv() == nil || g != p.Deriv().Value())
		if dual || p.Value() != f.bound[i] {
			return f.failLocked(fmt.Errorf("fsdp: parameter %s is no longer bound to its gather buffer (gorgonia.BindDualValues, or gorgonia.Let): %w", p.Name(), ErrRebound))
		}
	}
	return nil
}

// sync waits for the pass's reduce-scatters, averages and clips the
// gradient pieces and returns the views for the inner solver.
func (f *FSDP) sync(ctx context.Context) ([]gorgonia.ValueGrad, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.checkLocked("solver step"); err != nil {
		return nil, err
	}
	if f.passes == 0 {
		if f.inBack || f.fwdAt >= 0 {
			return nil, f.failLocked(fmt.Errorf("fsdp: step after a pass that did not finish its backward: %w", ErrIncompletePass))
		}
		return nil, ErrNoGradients
	}
	start := time.Now()
	for _, u := range f.units {
		if w := u.reduce; w != nil {
			f.mu.Unlock()
			select {
			case <-w.Done():
			case <-ctx.Done():
			}
			f.mu.Lock()
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("fsdp: step: %w", err)
			}
			if err := f.checkLocked("solver step"); err != nil {
				return nil, err
			}
			if err := w.Err(); err != nil {
				return nil, f.failLocked(fmt.Errorf("fsdp: reduce-scatter of unit %d: %w", u.k, err))
			}
			u.reduce = nil
		}
	}
	f.cur.ReduceWait = time.Since(start)
	div := float64(f.pg.WorldSize())
	for _, u := range f.units {
		if !u.reduced {
			// No gradient reached the unit (not used, or used without a
			// gradient): every rank knows it, and steps it with zeros.
			clear(u.g32)
			clear(u.g64)
			continue
		}
		shard.ScaleInto(u.g32, u.g32, float32(div))
		shard.ScaleInto(u.g64, u.g64, div)
	}
	for par := range f.gslots { // every reduce-scatter has finished
		f.gslots[par].owner, f.gslots[par].work = nil, nil
	}
	for _, u := range f.units {
		if u.own != nil {
			u.own.owner, u.own.work = nil, nil
		}
	}
	if f.cfg.maxGradNorm > 0 {
		if err := f.clipLocked(ctx); err != nil {
			return nil, f.failLocked(err)
		}
	}
	f.passes = 0
	f.last, f.cur = f.cur, Stats{}
	return f.viewsLocked()
}

// clipLocked clips the gradient pieces to the global norm: each rank sums
// the squares of its segments (not the padding) and all-reduces the sum.
func (f *FSDP) clipLocked(ctx context.Context) error {
	var grads []shard.Grad
	for _, u := range f.units {
		for _, s := range u.segs {
			if u.g32 != nil {
				grads = append(grads, shard.Grad{F32: u.g32[s.Off : s.Off+s.Len]})
			} else {
				grads = append(grads, shard.Grad{F64: u.g64[s.Off : s.Off+s.Len]})
			}
		}
	}
	norm, err := shard.ClipByGlobalNorm(ctx, f.pg, grads, f.cfg.maxGradNorm)
	if err != nil {
		return fmt.Errorf("fsdp: %w", err)
	}
	f.gradNorm = norm
	return nil
}

// GradNorm returns the global L2 norm of the averaged gradients before
// clipping, as of the last step (WithMaxGradNorm; 0 without it).
func (f *FSDP) GradNorm() float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gradNorm
}

// viewsLocked returns the inner solver's views of this rank's segments,
// unit by unit, made once.
func (f *FSDP) viewsLocked() ([]gorgonia.ValueGrad, error) {
	if f.views != nil {
		return f.views, nil
	}
	var views []gorgonia.ValueGrad
	for _, u := range f.units {
		for _, s := range u.segs {
			p := f.params[s.Param]
			v, err := shard.SegmentView(p, s, sliceOrNil(u.w32, s), sliceOrNil(u.g32, s), sliceOrNil(u.w64, s), sliceOrNil(u.g64, s))
			if err != nil {
				return nil, err
			}
			views = append(views, v)
		}
	}
	f.views = views
	return views, nil
}

// sliceOrNil returns segment s of a piece, nil for a nil piece (of the
// other dtype).
func sliceOrNil[T float32 | float64](piece []T, s shard.Segment) []T {
	if piece == nil {
		return nil
	}
	return piece[s.Off : s.Off+s.Len]
}

// FullParams gathers every unit and returns copies of the whole parameters,
// in Params order, with their shapes: what a single process would hold.
// Every rank must call it (it is a collective); it does not disturb
// training. The caller owns the tensors.
func (f *FSDP) FullParams(ctx context.Context) ([]tensor.Tensor, error) {
	out := make([]tensor.Tensor, len(f.params))
	for _, u := range f.units {
		f.mu.Lock()
		err := f.checkLocked("full parameters")
		w32, w64 := u.w32, u.w64
		f.mu.Unlock()
		if err != nil {
			return nil, err
		}
		var full32 []float32
		var full64 []float64
		if u.dt == tensor.Float32 {
			full32 = make([]float32, u.padded)
			err = f.pg.AllGather(ctx, dist.F32(full32), dist.F32(w32))
		} else {
			full64 = make([]float64, u.padded)
			err = f.pg.AllGather(ctx, dist.F64(full64), dist.F64(w64))
		}
		if err != nil {
			return nil, fmt.Errorf("fsdp: gathering unit %d: %w", u.k, err)
		}
		for _, s := range u.spans {
			shape := f.params[s.Param].Shape().Clone()
			if full32 != nil {
				out[s.Param] = tensor.New(tensor.WithShape(shape...), tensor.WithBacking(full32[s.Off:s.Off+s.Len:s.Off+s.Len]))
			} else {
				out[s.Param] = tensor.New(tensor.WithShape(shape...), tensor.WithBacking(full64[s.Off:s.Off+s.Len:s.Off+s.Len]))
			}
		}
	}
	return out, nil
}
