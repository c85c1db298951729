package ckpt

// Sharded checkpoints: every rank writes its own parts of the parameters
// and of the optimizer state, and rank 0 an index (train/checkpoint's
// sharded format); a job of any world size and any layout (DDP, ZeRO-1,
// ZeRO-2, fully sharded) loads the parts it needs.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/internal/shard"
	"github.com/gdist/gdist/train/checkpoint"
	"github.com/gdist/gdist/train/optim"
)

// Sharded is a data-parallel wrapper whose state sharded checkpoints save
// and load: *ddp.DDP (plain or ZeRO) and *fsdp.FSDP.
type Sharded interface {
	// ProcessGroup is the group the wrapper runs on.
	ProcessGroup() *dist.ProcessGroup
	// Params are the wrapped parameters: their names (unique), dtypes and
	// shapes.
	Params() gorgonia.Nodes
	// Sharding names the layout ("ddp", "zero1", "zero2", "fsdp").
	Sharding() string
	// Segments are the parts of the parameters covered by the values the
	// inner solver steps, in order: its state for its i-th value is the
	// state of the i-th part.
	Segments() []checkpoint.Segment
	// SaveSegments are the parts this rank writes; the ranks' together
	// cover every parameter exactly once.
	SaveSegments() []checkpoint.Segment
	// HeldSegments are the parts whose values this rank holds.
	HeldSegments() []checkpoint.Segment
	// SegmentValues returns the values of a held part (or a part of
	// one), over the wrapper's memory, to read or to write.
	SegmentValues(s checkpoint.Segment) ([]float32, []float64, error)
}

// ErrIncompatible means a checkpoint cannot be loaded into this job: it
// holds another model or another optimizer. An *IncompatibleError names the
// part.
var ErrIncompatible = errors.New("ckpt: checkpoint incompatible with this job")

// IncompatibleError says which part of a checkpoint does not fit the job
// loading it, and how.
type IncompatibleError struct {
	Path string // the checkpoint
	Part string // "parameter w0", "optimizer", ...
	Want string // what the job has
	Got  string // what the checkpoint has
}

func (e *IncompatibleError) Error() string {
	return fmt.Sprintf("ckpt: %s: %s: the job has %s, the checkpoint %s", e.Path, e.Part, e.Want, e.Got)
}

// Unwrap returns ErrIncompatible.
func (e *IncompatibleError) Unwrap() error { return ErrIncompatible }

// SaveSharded saves the sharded checkpoint of st.Step under dir (as
// dir/ckpt-<step>, see train/checkpoint): every rank writes its parts of
// the parameters and of solver's state (the inner solver of w's Solver),
// rank 0 also the rest of st (Config, Epoch, Sampler, RNG, Meta; st.Params
// and st.Optimizer are ignored) and, once every rank's file is written, the
// index; it then keeps the keep newest (keep >= 1). Every rank saves its
// own st.RNG (ranks that draw their own random numbers each have one). It is a collective:
// every rank calls it with the same step and keep, and it returns, on every
// rank, once the checkpoint is complete or has failed. st is only read.
func SaveSharded(ctx context.Context, w Sharded, solver optim.Solver, dir string, st *checkpoint.State, keep int) error {
	if w == nil || solver == nil || st == nil || dir == "" || keep < 1 {
		return fmt.Errorf("ckpt: %w: SaveSharded(%v, %v, %q, state %p, keep %d)", ErrInvalidArgument, w, solver, dir, st, keep)
	}
	pg := w.ProcessGroup()
	params := w.Params()
	pos := make(map[string]int, len(params))
	for i, p := range params {
		pos[p.Name()] = i
	}
	path := checkpoint.ShardedPath(dir, st.Step)
	segs := w.SaveSegments()
	werr := writeRankFile(w, solver, path, st, segs, pos)
	meta := make([]float64, 0, 3*len(segs))
	for _, s := range segs {
		meta = append(meta, float64(pos[s.Name]), float64(s.Off), float64(s.Len))
	}
	all, err := allGatherV(ctx, pg, meta)
	if err != nil {
		return fmt.Errorf("ckpt: sharded save of step %d: %w", st.Step, err)
	}
	if err := agree(ctx, pg, werr); err != nil {
		return fmt.Errorf("ckpt: sharded save of step %d: %w", st.Step, err)
	}
	var ierr error
	if pg.Rank() == 0 {
		ierr = writeIndex(path, st.Step, pg.WorldSize(), w.Sharding(), params, solver.Kind().Slots(), all)
		if ierr == nil {
			ierr = checkpoint.PruneSharded(dir, keep)
		}
	}
	if err := agree(ctx, pg, ierr); err != nil {
		return fmt.Errorf("ckpt: sharded save of step %d: %w", st.Step, err)
	}
	return nil
}

// writeRankFile writes this rank's file of the checkpoint at path: its
// segments of the parameters and of the solver's slots.
func writeRankFile(w Sharded, solver optim.Solver, path string, st *checkpoint.State, segs []checkpoint.Segment, pos map[string]int) error {
	if err := os.MkdirAll(path, 0o755); err != nil {
		return fmt.Errorf("ckpt: %w", err)
	}
	ost := solver.State()
	views := w.Segments()
	if len(ost.Params) == 0 && ost.Iter == 0 {
		ost.Params = freshSlots(ost.Kind, w, views)
	}
	if len(ost.Params) != len(views) {
		return fmt.Errorf("ckpt: %w: the solver holds state for %d values, the wrapper hands it %d (step it through the wrapper's Solver)", ErrInvalidArgument, len(ost.Params), len(views))
	}
	rec := &checkpoint.State{Step: st.Step, RNG: st.RNG, Optimizer: optim.State{Kind: ost.Kind, Hyper: ost.Hyper, Iter: ost.Iter}.Checkpoint()}
	if w.ProcessGroup().Rank() == 0 {
		rec.Config, rec.Epoch, rec.Sampler, rec.Meta = st.Config, st.Epoch, st.Sampler, st.Meta
	}
	if rec.Config == nil {
		rec.Config = struct{}{}
	}
	for _, s := range segs {
		f32, f64, err := w.SegmentValues(s)
		if err != nil {
			return err
		}
		rec.Params = append(rec.Params, checkpoint.Named{Name: checkpoint.ChunkName(s.Name, s.Off), Tensor: vector(f32, f64)})
		v := slices.IndexFunc(views, func(v checkpoint.Segment) bool {
			return v.Name == s.Name && v.Off <= s.Off && s.Off+s.Len <= v.Off+v.Len
		})
		if v < 0 {
			return fmt.Errorf("ckpt: %w: part [%d, %d) of %s is in none of the solver's values", ErrInvalidArgument, s.Off, s.Off+s.Len, s.Name)
		}
		for _, sl := range ost.Params[v].Slots {
			lo := s.Off - views[v].Off
			var t tensor.Tensor
			if sl.F32 != nil {
				t = vector(sl.F32[lo:lo+s.Len], nil)
			} else {
				t = vector(nil, sl.F64[lo:lo+s.Len])
			}
			name := checkpoint.ChunkName(checkpoint.SlotTensor(s.Name, sl.Name), s.Off)
			rec.Optimizer.Slots = append(rec.Optimizer.Slots, checkpoint.Named{Name: name, Tensor: t})
		}
	}
	return checkpoint.SaveState(filepath.Join(path, checkpoint.RankFile(w.ProcessGroup().Rank())), rec)
}

// freshSlots returns the zero slots of a solver of kind that has not
// stepped yet, one per view.
func freshSlots(kind optim.Kind, w Sharded, views []checkpoint.Segment) []optim.ParamState {
	dts := make(map[string]tensor.Dtype)
	for _, p := range w.Params() {
		dts[p.Name()] = p.Dtype()
	}
	out := make([]optim.ParamState, len(views))
	for i, v := range views {
		for _, name := range kind.Slots() {
			sl := optim.Slot{Name: name}
			if dts[v.Name] == tensor.Float32 {
				sl.F32 = make([]float32, v.Len)
			} else {
				sl.F64 = make([]float64, v.Len)
			}
			out[i].Slots = append(out[i].Slots, sl)
		}
	}
	return out
}

// vector wraps f32 or f64 in a 1-D tensor (sharing it).
func vector(f32 []float32, f64 []float64) tensor.Tensor {
	if f32 != nil {
		return tensor.New(tensor.WithShape(len(f32)), tensor.WithBacking(f32))
	}
	return tensor.New(tensor.WithShape(len(f64)), tensor.WithBacking(f64))
}

// writeIndex writes the index of the checkpoint at path from every rank's
// segments, all[r] holding rank r's as (parameter, offset, length) triples.
func writeIndex(path string, step int64, world int, layout string, params gorgonia.Nodes, slots []string, all [][]float64) error {
	x := &checkpoint.Index{Format: checkpoint.ShardedFormat, Version: checkpoint.ShardedVersion, Step: step,
		World: world, Layout: layout, Slots: slots}
	for r := range world {
		x.Files = append(x.Files, checkpoint.RankFile(r))
	}
	chunks := make([][]checkpoint.Chunk, len(params))
	for r, m := range all {
		for k := 0; k+2 < len(m); k += 3 {
			i := int(m[k])
			chunks[i] = append(chunks[i], checkpoint.Chunk{File: r, Off: int(m[k+1]), Len: int(m[k+2])})
		}
	}
	for i, p := range params {
		slices.SortFunc(chunks[i], func(a, b checkpoint.Chunk) int { return a.Off - b.Off })
		var shape []int
		if !p.IsScalar() {
			shape = slices.Clone([]int(p.Shape()))
		}
		x.Tensors = append(x.Tensors, checkpoint.IndexTensor{Name: p.Name(), Dtype: checkpoint.DtypeName(p.Dtype()), Shape: shape, Chunks: chunks[i]})
	}
	return checkpoint.WriteIndex(path, x)
}

// allGatherV gathers every rank's vals (of any length) on every rank.
func allGatherV(ctx context.Context, pg *dist.ProcessGroup, vals []float64) ([][]float64, error) {
	n := pg.WorldSize()
	lens := make([]float64, n)
	if err := pg.AllGather(ctx, dist.F64(lens), dist.F64([]float64{float64(len(vals))})); err != nil {
		return nil, err
	}
	counts := make([]int, n)
	total := 0
	for r, l := range lens {
		counts[r] = int(l)
		total += counts[r]
	}
	flat := make([]float64, total)
	if err := pg.AllGatherV(ctx, dist.F64(flat), dist.F64(vals), counts); err != nil {
		return nil, err
	}
	out := make([][]float64, n)
	for r, c := range counts {
		out[r], flat = flat[:c:c], flat[c:]
	}
	return out, nil
}

// agree tells every rank whether every rank succeeded: it returns err if
// this rank failed, an error naming the first rank that failed if another
// did, and nil if none did.
func agree(ctx context.Context, pg *dist.ProcessGroup, err error) error {
	v := []float64{math.Inf(1)}
	if err != nil {
		v[0] = float64(pg.Rank())
	}
	if cerr := pg.AllReduce(ctx, dist.F64(v), dist.Min); cerr != nil {
		return errors.Join(err, cerr)
	}
	switch {
	case err != nil:
		return err
	case !math.IsInf(v[0], 1):
		return fmt.Errorf("%w: rank %d failed", ErrRankFailed, int(v[0]))
	}
	return nil
}

// ErrRankFailed is matched by the error another rank's failure gives a rank
// in a collective save or load.
var ErrRankFailed = errors.New("ckpt: another rank failed")

// ShardedResumed is the sharded checkpoint a job resumed from.
type ShardedResumed struct {
	// Step is the step resumed from, or -1 for a fresh start.
	Step int64
	// Path is the checkpoint's directory.
	Path string
	// State is the rest of the state rank 0 saved: Config (the raw JSON),
	// Epoch, Sampler, Meta and the optimizer's kind, iteration count and
	// hyper-parameters; and RNG, this rank's own RNG state if the world
	// size is the one that saved (nil otherwise). Nil for a fresh start.
	State *checkpoint.State
	// World and Layout are those of the job that saved.
	World  int
	Layout string
}

// Fresh reports whether there was nothing to resume.
func (r *ShardedResumed) Fresh() bool { return r.Step < 0 }

// ResumeSharded loads the newest sharded checkpoint under dir that every
// rank can read into w (the parameter values it holds) and solver (the
// state of the values w hands it), whatever world size and layout saved
// it: each rank reads, from each rank's file, only the chunks it needs. A
// checkpoint that fails on any rank (a corrupt file) is passed over by
// every rank, logged to logger if not nil. It is a collective. With no
// checkpoint it returns a fresh ShardedResumed and changes nothing.
//
// A checkpoint of another model (a parameter missing, or of another dtype
// or shape) or another optimizer kind fails with an *IncompatibleError; a
// change of world size or layout is logged.
func ResumeSharded(ctx context.Context, w Sharded, solver optim.Solver, dir string, logger *slog.Logger) (*ShardedResumed, error) {
	if w == nil || solver == nil || dir == "" {
		return nil, fmt.Errorf("ckpt: %w: ResumeSharded(%v, %v, %q)", ErrInvalidArgument, w, solver, dir)
	}
	pg := w.ProcessGroup()
	steps, lerr := checkpoint.ShardedSteps(dir)
	// Rank 0's list decides, so that every rank tries the same steps.
	n := []float64{float64(len(steps))}
	if err := pg.Broadcast(ctx, dist.F64(n), 0); err != nil {
		return nil, err
	}
	cand := make([]float64, int(n[0]))
	for i := range cand {
		if pg.Rank() == 0 {
			cand[i] = float64(steps[i])
		}
	}
	if err := pg.Broadcast(ctx, dist.F64(cand), 0); err != nil {
		return nil, err
	}
	if err := agree(ctx, pg, lerr); err != nil {
		return nil, err
	}
	var skipped []error
	for _, s := range cand {
		step := int64(s)
		path := checkpoint.ShardedPath(dir, step)
		r, err := loadSharded(w, solver, path)
		// Every rank takes the same way: on if all loaded, stop if any
		// found another job's checkpoint (rather than fall back to an
		// older one of it), else try the next step.
		code := []float64{0}
		switch {
		case errors.Is(err, ErrIncompatible):
			code[0] = 2
		case err != nil:
			code[0] = 1
		}
		if cerr := pg.AllReduce(ctx, dist.F64(code), dist.Max); cerr != nil {
			return nil, errors.Join(err, cerr)
		}
		switch {
		case code[0] == 0:
			if logger != nil && (r.World != pg.WorldSize() || r.Layout != w.Sharding()) {
				logger.Info("ckpt: resharding", "rank", pg.Rank(), "step", step, "saved_world", r.World, "saved_layout", r.Layout,
					"world", pg.WorldSize(), "layout", w.Sharding())
			}
			return r, nil
		case code[0] == 2 && err != nil:
			return nil, err
		case code[0] == 2:
			return nil, fmt.Errorf("%w: another rank found %s incompatible", ErrIncompatible, path)
		case err == nil:
			err = fmt.Errorf("%w: another rank could not load %s", ErrRankFailed, path)
		}
		if logger != nil {
			logger.Warn("ckpt: passing over a sharded checkpoint", "rank", pg.Rank(), "path", path, "err", err)
		}
		skipped = append(skipped, err)
	}
	if len(skipped) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrNoCommonStep, errors.Join(skipped...))
	}
	return &ShardedResumed{Step: -1}, nil
}

// loadSharded loads the checkpoint at path into w and solver.
func loadSharded(w Sharded, solver optim.Solver, path string) (*ShardedResumed, error) {
	x, err := checkpoint.ReadIndex(path)
	if err != nil {
		return nil, err
	}
	incompatible := func(part, want, got string) error {
		return &IncompatibleError{Path: path, Part: part, Want: want, Got: got}
	}
	params := w.Params()
	byName := make(map[string]*gorgonia.Node, len(params))
	for _, p := range params {
		byName[p.Name()] = p
		t, ok := x.Tensor(p.Name())
		if !ok {
			return nil, incompatible("parameter "+p.Name(), "it", "none")
		}
		var shape []int
		if !p.IsScalar() {
			shape = []int(p.Shape())
		}
		if t.Dtype != checkpoint.DtypeName(p.Dtype()) || !slices.Equal(t.Shape, shape) {
			return nil, incompatible("parameter "+p.Name(), fmt.Sprintf("%v %v", p.Dtype(), shape), fmt.Sprintf("%s %v", t.Dtype, t.Shape))
		}
	}
	for _, t := range x.Tensors {
		if byName[t.Name] == nil {
			return nil, incompatible("parameter "+t.Name, "none", "it")
		}
	}
	f0, err := checkpoint.LoadSubset(filepath.Join(path, x.Files[0]), func(string) bool { return false })
	if err != nil {
		return nil, err
	}
	rec := f0.State()
	if rec.Step != x.Step {
		return nil, fmt.Errorf("ckpt: %s: %w: %s is of step %d, the index of step %d", path, checkpoint.ErrCorrupt, x.Files[0], rec.Step, x.Step)
	}
	ost, err := optim.FromCheckpoint(rec.Optimizer)
	if err != nil {
		return nil, fmt.Errorf("ckpt: %s: %w", path, err)
	}
	if ost.Kind != solver.Kind() || !slices.Equal(x.Slots, ost.Kind.Slots()) {
		return nil, incompatible("optimizer", string(solver.Kind()), fmt.Sprintf("%s with slots %v", ost.Kind, x.Slots))
	}
	var wants []checkpoint.Want
	for _, s := range w.HeldSegments() {
		f32, f64, err := w.SegmentValues(s)
		if err != nil {
			return nil, err
		}
		wants = append(wants, checkpoint.Want{Tensor: s.Name, Off: s.Off, F32: f32, F64: f64})
	}
	for i, s := range w.Segments() {
		p := byName[s.Name]
		ps := optim.ParamState{Index: i, Dtype: p.Dtype(), Shape: shard.ViewShape(p, s.Off, s.Len)}
		for _, name := range ost.Kind.Slots() {
			sl := optim.Slot{Name: name}
			if p.Dtype() == tensor.Float32 {
				sl.F32 = make([]float32, s.Len)
			} else {
				sl.F64 = make([]float64, s.Len)
			}
			ps.Slots = append(ps.Slots, sl)
			wants = append(wants, checkpoint.Want{Tensor: s.Name, Slot: name, Off: s.Off, F32: sl.F32, F64: sl.F64})
		}
		ost.Params = append(ost.Params, ps)
	}
	if err := x.Read(path, wants); err != nil {
		return nil, err
	}
	if err := solver.SetState(ost); err != nil {
		return nil, fmt.Errorf("ckpt: %s: restoring the solver: %w", path, err)
	}
	rec.Optimizer.Slots = nil
	rng := rec.RNG // rank 0's
	rec.RNG = nil
	if r := w.ProcessGroup().Rank(); x.World == w.ProcessGroup().WorldSize() {
		if r > 0 {
			f, err := checkpoint.LoadSubset(filepath.Join(path, x.Files[r]), func(string) bool { return false })
			if err != nil {
				return nil, err
			}
			rng = f.RNG
		}
		rec.RNG = rng
	}
	return &ShardedResumed{Step: x.Step, Path: path, State: rec, World: x.World, Layout: x.Layout}, nil
}

// FullState gathers the whole of w's parameters and of solver's state onto
// every rank: the parameters in w.Params order, and the state a solver
// stepping those parameters whole in one process would hold (its Params[i]
// for parameter i, of the parameter's name and shape). What a sharded job
// needs to write a single-process checkpoint, or to compare with one. It
// is a collective; the caller owns the results.
func FullState(ctx context.Context, w Sharded, solver optim.Solver) ([]checkpoint.Named, optim.State, error) {
	pg := w.ProcessGroup()
	params := w.Params()
	pos := make(map[string]int, len(params))
	for i, p := range params {
		pos[p.Name()] = i
	}
	ost := solver.State()
	views := w.Segments()
	if len(ost.Params) == 0 && ost.Iter == 0 {
		ost.Params = freshSlots(ost.Kind, w, views)
	}
	if len(ost.Params) != len(views) {
		return nil, optim.State{}, fmt.Errorf("ckpt: %w: the solver holds state for %d values, the wrapper hands it %d", ErrInvalidArgument, len(ost.Params), len(views))
	}
	slotNames := ost.Kind.Slots()
	// Each of this rank's segments goes as its values and then each slot's,
	// all widened to float64 (exactly).
	var meta, data []float64
	for _, s := range w.SaveSegments() {
		f32, f64, err := w.SegmentValues(s)
		if err != nil {
			return nil, optim.State{}, err
		}
		v := slices.IndexFunc(views, func(v checkpoint.Segment) bool {
			return v.Name == s.Name && v.Off <= s.Off && s.Off+s.Len <= v.Off+v.Len
		})
		if v < 0 {
			return nil, optim.State{}, fmt.Errorf("ckpt: %w: part [%d, %d) of %s is in none of the solver's values", ErrInvalidArgument, s.Off, s.Off+s.Len, s.Name)
		}
		meta = append(meta, float64(pos[s.Name]), float64(s.Off), float64(s.Len))
		data = appendWide(data, f32, f64)
		lo := s.Off - views[v].Off
		for _, sl := range ost.Params[v].Slots {
			data = appendWide(data, sliceOrNil(sl.F32, lo, s.Len), sliceOrNil(sl.F64, lo, s.Len))
		}
	}
	allMeta, err := allGatherV(ctx, pg, meta)
	if err != nil {
		return nil, optim.State{}, fmt.Errorf("ckpt: gathering the state: %w", err)
	}
	allData, err := allGatherV(ctx, pg, data)
	if err != nil {
		return nil, optim.State{}, fmt.Errorf("ckpt: gathering the state: %w", err)
	}
	full := make([][]float64, len(params)*(1+len(slotNames)))
	for i, p := range params {
		for k := range 1 + len(slotNames) {
			full[i*(1+len(slotNames))+k] = make([]float64, shard.Numel(p))
		}
	}
	for r := range allMeta {
		d := allData[r]
		for k := 0; k+2 < len(allMeta[r]); k += 3 {
			i, off, n := int(allMeta[r][k]), int(allMeta[r][k+1]), int(allMeta[r][k+2])
			for j := range 1 + len(slotNames) {
				copy(full[i*(1+len(slotNames))+j][off:off+n], d[:n])
				d = d[n:]
			}
		}
	}
	out := make([]checkpoint.Named, len(params))
	st := optim.State{Kind: ost.Kind, Hyper: ost.Hyper, Iter: ost.Iter}
	for i, p := range params {
		var shape []int
		if !p.IsScalar() {
			shape = slices.Clone([]int(p.Shape()))
		}
		vals := full[i*(1+len(slotNames))]
		if p.Dtype() == tensor.Float32 {
			out[i] = checkpoint.Named{Name: p.Name(), Tensor: tensor.New(tensor.WithShape(shape...), tensor.WithBacking(narrow(vals)))}
		} else {
			out[i] = checkpoint.Named{Name: p.Name(), Tensor: tensor.New(tensor.WithShape(shape...), tensor.WithBacking(vals))}
		}
		ps := optim.ParamState{Index: i, Name: p.Name(), Dtype: p.Dtype(), Shape: shape}
		for j, name := range slotNames {
			sl := optim.Slot{Name: name}
			if v := full[i*(1+len(slotNames))+1+j]; p.Dtype() == tensor.Float32 {
				sl.F32 = narrow(v)
			} else {
				sl.F64 = v
			}
			ps.Slots = append(ps.Slots, sl)
		}
		st.Params = append(st.Params, ps)
	}
	return out, st, nil
}

func sliceOrNil[T float32 | float64](s []T, lo, n int) []T {
	if s == nil {
		return nil
	}
	return s[lo : lo+n]
}

// appendWide appends f32 (widened, exactly) or f64 to dst.
func appendWide(dst []float64, f32 []float32, f64 []float64) []float64 {
	for _, v := range f32 {
		dst = append(dst, float64(v))
	}
	return append(dst, f64...)
}

// narrow returns v as float32 (exact for values widened from float32).
func narrow(v []float64) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(x)
	}
	return out
}
