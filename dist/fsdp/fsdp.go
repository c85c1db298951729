package fsdp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/internal/shard"
	"github.com/gdist/gdist/internal/errs"
	"github.com/gdist/gdist/internal/options"
	"github.com/gdist/gdist/train/checkpoint"
)

// This file holds an FSDP's lifetime: Wrap, the sharding of the initial
// parameters, the accessors, its error state and Close. The hook ops are in
// hook.go, what they do when a machine runs them in run.go, and the
// optimiser step in step.go.

// Errors of package fsdp. Errors raised while a machine runs (in a hook op)
// reach RunAll wrapped by Gorgonia, which does not unwrap; the FSDP keeps
// the first one, and Err and Solver.Step return it matchably.
var (
	// ErrInvalidArgument is matched by the errors of a bad argument or
	// option. It is the value every gdist package exports under this name.
	ErrInvalidArgument = errs.ErrInvalidArgument
	// ErrNotParam is returned for a node that is not one of the wrapped
	// parameters.
	ErrNotParam = errors.New("fsdp: node is not a wrapped parameter")
	// ErrUnitOrder is returned when the forward pass uses a parameter of a
	// unit after another unit has begun: a unit's parameters are gathered
	// into a buffer that the unit after next reuses, so every unit must be
	// used in one stretch of the forward pass (put weights shared between
	// layers into one unit).
	ErrUnitOrder = errors.New("fsdp: parameter used outside its unit's stretch of the forward pass")
	// ErrNotResident is returned when an op of a unit runs while the
	// unit's parameters are not in their buffer: the machine ran the graph
	// in another order than the one it was built in.
	ErrNotResident = errors.New("fsdp: unit's parameters not gathered when its op ran")
	// ErrNoGradients is returned by Step when no backward pass ran since the
	// last step, and ErrIncompletePass when a backward pass did not reach
	// every unit that the forward pass used.
	ErrNoGradients    = errors.New("fsdp: no backward pass since the last step")
	ErrIncompletePass = errors.New("fsdp: backward pass incomplete")
	// ErrRebound is returned by Step when a parameter node is no longer
	// bound to its gather buffer: the machine was built with
	// gorgonia.BindDualValues for it (FSDP hands the solver its own
	// gradients; dual values would copy the parameters whole), or a value
	// was bound to it with gorgonia.Let.
	ErrRebound = errors.New("fsdp: parameter rebound")
	// ErrClosed is returned by every call of a closed FSDP and reaches
	// RunAll from a pass through its hooks. It wraps dist.ErrClosed.
	ErrClosed = fmt.Errorf("fsdp: closed: %w", dist.ErrClosed)
)

// ids numbers FSDP instances so that their hook ops hash differently.
var ids atomic.Uint64

// FSDP holds a model's parameters fully sharded over the ranks of a group:
// see the package documentation. It serves one TapeMachine running one
// graph; its methods are safe to call from any goroutine. Close it when
// training ends, before the group.
type FSDP struct {
	pg     *dist.ProcessGroup
	id     uint64
	cfg    config
	params gorgonia.Nodes
	index  map[*gorgonia.Node]int
	unitOf []int            // per parameter: its unit
	bound  []gorgonia.Value // per parameter: the value its node is bound to (guarded by mu)
	units  []*unit
	pslots [2]buffer // gathered parameters: units at even and odd forward positions
	gslots [2]buffer // their gradients, staged for the reduce-scatter

	mu sync.Mutex
	// Guarded by mu.
	hooks     gorgonia.Nodes // per parameter: its hook node, nil until created
	gradNodes gorgonia.Nodes // per parameter: the hook's gradient node
	order     []*unit        // units in forward order, as the hooks were built
	building  *unit          // the unit whose hooks are being created
	version   int            // optimiser steps taken: gathered parameters of an older one are stale
	fwdAt     int            // forward position of the unit running in this pass, -1 before the first
	passes    int            // complete backward passes since the last step
	inBack    bool           // a backward pass is under way
	err       error          // first hard failure; sticks
	closed    bool
	cur, last Stats
	views     []gorgonia.ValueGrad
	gradNorm  float64

	closeOnce sync.Once
	closeErr  error
}

// unit is one group of parameters sharded together.
type unit struct {
	k      int   // its index among the units given to Wrap
	params []int // parameter indices, in the order given
	spans  []shard.Span
	dt     tensor.Dtype
	n      int // elements
	piece  int // this rank's share: padded / world size
	padded int
	w32    []float32 // this rank's piece of the parameters
	w64    []float64
	g32    []float32 // this rank's piece of the averaged gradient
	g64    []float64
	segs   []shard.Segment

	pos     int // forward position, -1 until its first hook is built
	first   int // the parameter of its first hook
	nGrad   int // parameters with a gradient node
	pending int // of those, gradients not yet arrived in this pass

	gather  *dist.Work // all-gather of the parameters into pslots[slot(pos)], in flight or done
	gatherV int        // the version it gathers
	reduce  *dist.Work // reduce-scatter of the gradients, nil before launch (and at world size 1)
	reduced bool       // its gradient pieces hold this pass's (launched)
	own     *buffer    // gradient staging of its own (see acquireGrads)
}

// buffer is a full-size buffer shared by the units of one parity: gathered
// parameters or staged gradients. owner is the unit whose data it holds
// (of version ver, for parameters), work the collective writing or reading
// it.
type buffer struct {
	f32   []float32
	f64   []float64
	owner *unit
	ver   int
	work  *dist.Work
	// views caches, per parameter, the tensors over this buffer that the
	// hooks return.
	views map[int]gorgonia.Value
}

// Wrap shards params, grouped into units, over the ranks of pg. units[k]
// holds the parameters of unit k (a model's layer or block): all in one
// graph, one dtype per unit (Float32 or Float64), with values. Every rank
// must call Wrap with the same units and options; it broadcasts rank 0's
// values, keeps this rank's piece of every unit and rebinds each parameter
// node to a tensor over a shared gather buffer (gorgonia.Let), so the
// parameters' own tensors can be freed. From then on a parameter's value
// is meaningful only while its unit is gathered; read the parameters with
// FullParams.
//
// Use Hook at every use of a parameter in the forward pass, and step
// through Solver. The nodes stay the caller's; units is copied.
func Wrap(ctx context.Context, pg *dist.ProcessGroup, units []gorgonia.Nodes, opts ...Option) (*FSDP, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if pg == nil {
		return nil, fmt.Errorf("fsdp: nil process group: %w", ErrInvalidArgument)
	}
	if len(units) == 0 {
		return nil, fmt.Errorf("fsdp: no units: %w", ErrInvalidArgument)
	}
	f := &FSDP{pg: pg, id: ids.Add(1), cfg: cfg, index: make(map[*gorgonia.Node]int), fwdAt: -1}
	for k, ps := range units {
		if len(ps) == 0 {
			return nil, fmt.Errorf("fsdp: unit %d has no parameters: %w", k, ErrInvalidArgument)
		}
		u := &unit{k: k, pos: -1, dt: ps[0].Dtype()}
		for _, p := range ps {
			if err := f.checkParam(p, k, u.dt); err != nil {
				return nil, err
			}
			i := len(f.params)
			f.index[p] = i
			f.params = append(f.params, p)
			f.unitOf = append(f.unitOf, k)
			n := shard.Numel(p)
			u.params = append(u.params, i)
			u.spans = append(u.spans, shard.Span{Param: i, Off: u.n, Len: n})
			u.n += n
		}
		f.layout(u)
		f.units = append(f.units, u)
	}
	f.hooks = make(gorgonia.Nodes, len(f.params))
	f.bound = make([]gorgonia.Value, len(f.params))
	f.gradNodes = make(gorgonia.Nodes, len(f.params))
	if err := f.shardValues(ctx); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *FSDP) checkParam(p *gorgonia.Node, k int, dt tensor.Dtype) error {
	switch {
	case p == nil:
		return fmt.Errorf("fsdp: unit %d: nil node: %w", k, ErrInvalidArgument)
	case !p.IsVar():
		return fmt.Errorf("fsdp: unit %d: %s is not an input (variable) node: %w", k, p.Name(), ErrInvalidArgument)
	case len(f.params) > 0 && p.Graph() != f.params[0].Graph():
		return fmt.Errorf("fsdp: unit %d: %s is in another graph than %s: %w", k, p.Name(), f.params[0].Name(), ErrInvalidArgument)
	case p.Dtype() != tensor.Float32 && p.Dtype() != tensor.Float64:
		return fmt.Errorf("fsdp: unit %d: %s is %v: %w", k, p.Name(), p.Dtype(), dist.ErrUnsupportedDType)
	case p.Dtype() != dt:
		return fmt.Errorf("fsdp: unit %d mixes %v and %v (%s): one dtype per unit: %w", k, dt, p.Dtype(), p.Name(), ErrInvalidArgument)
	case p.Value() == nil:
		return fmt.Errorf("fsdp: unit %d: %s has no value: %w", k, p.Name(), ErrInvalidArgument)
	}
	if _, dup := f.index[p]; dup {
		return fmt.Errorf("fsdp: unit %d: %s appears twice: %w", k, p.Name(), ErrInvalidArgument)
	}
	f32, f64, err := shard.Floats(p.Value())
	if err != nil {
		return fmt.Errorf("fsdp: unit %d: %s: %w", k, p.Name(), err)
	}
	if len(f32)+len(f64) != shard.Numel(p) {
		return fmt.Errorf("fsdp: unit %d: %s: value has %d elements, shape %v: %w", k, p.Name(), len(f32)+len(f64), p.Shape(), ErrInvalidArgument)
	}
	return nil
}

// layout sizes unit u's pieces and segments and grows the gather buffers
// it may use (that of position k when units are used in the order given,
// and the other, where Hook moves it if not) and the staging buffers.
func (f *FSDP) layout(u *unit) {
	n := f.pg.WorldSize()
	u.piece = shard.Piece(u.n, n)
	u.padded = u.piece * n
	if u.dt == tensor.Float32 {
		u.w32, u.g32 = make([]float32, u.piece), make([]float32, u.piece)
	} else {
		u.w64, u.g64 = make([]float64, u.piece), make([]float64, u.piece)
	}
	u.segs = shard.Segments(u.spans, u.piece, f.pg.Rank())
	for _, b := range []*buffer{&f.pslots[f.slot(u.k)], &f.pslots[f.slot(u.k+1)], &f.gslots[0], &f.gslots[1]} {
		if u.dt == tensor.Float32 && len(b.f32) < u.padded {
			b.f32 = make([]float32, u.padded)
		}
		if u.dt == tensor.Float64 && len(b.f64) < u.padded {
			b.f64 = make([]float64, u.padded)
		}
	}
}

// slot returns the gather buffer of the unit at forward position pos: one
// for the even positions and one for the odd with prefetching, one for
// all without.
func (f *FSDP) slot(pos int) int {
	if f.cfg.prefetch {
		return pos % 2
	}
	return 0
}

// shardValues broadcasts rank 0's parameter values unit by unit through a
// gather buffer, keeps this rank's piece and binds every parameter node to
// its place in the buffer of its unit's parity.
func (f *FSDP) shardValues(ctx context.Context) error {
	lo := f.pg.Rank()
	for _, u := range f.units {
		b := &f.pslots[f.slot(u.k)]
		for _, s := range u.spans {
			f32, f64, _ := shard.Floats(f.params[s.Param].Value())
			if f32 != nil {
				copy(b.f32[s.Off:s.Off+s.Len], f32)
			} else {
				copy(b.f64[s.Off:s.Off+s.Len], f64)
			}
		}
		var err error
		if f.pg.WorldSize() > 1 {
			if u.dt == tensor.Float32 {
				err = f.pg.Broadcast(ctx, dist.F32(b.f32[:u.n]), 0)
			} else {
				err = f.pg.Broadcast(ctx, dist.F64(b.f64[:u.n]), 0)
			}
		}
		if err != nil {
			return fmt.Errorf("fsdp: broadcast of unit %d: %w", u.k, err)
		}
		clear(b.f32[min(u.n, len(b.f32)):])
		clear(b.f64[min(u.n, len(b.f64)):])
		if u.dt == tensor.Float32 {
			copy(u.w32, b.f32[lo*u.piece:])
		} else {
			copy(u.w64, b.f64[lo*u.piece:])
		}
		if err := f.bindUnit(u, f.slot(u.k)); err != nil {
			return err
		}
	}
	for par := range f.pslots {
		f.pslots[par].owner = nil
	}
	return nil
}

// bindUnit binds unit u's parameter nodes to their places in parameter
// buffer par.
func (f *FSDP) bindUnit(u *unit, par int) error {
	for _, s := range u.spans {
		v, err := f.pslots[par].view(f.params[s.Param], s)
		if err != nil {
			return err
		}
		if err := gorgonia.Let(f.params[s.Param], v); err != nil {
			return fmt.Errorf("fsdp: binding %s: %w", f.params[s.Param].Name(), err)
		}
		f.bound[s.Param] = v
	}
	return nil
}

// view returns the value of parameter p, placed at s, over the buffer: a
// tensor of p's shape (or a scalar), made once.
func (b *buffer) view(p *gorgonia.Node, s shard.Span) (gorgonia.Value, error) {
	if v, ok := b.views[s.Param]; ok {
		return v, nil
	}
	if b.views == nil {
		b.views = make(map[int]gorgonia.Value)
	}
	var v gorgonia.Value
	switch {
	case p.IsScalar() && p.Dtype() == tensor.Float32:
		v = (*gorgonia.F32)(&b.f32[s.Off])
	case p.IsScalar():
		v = (*gorgonia.F64)(&b.f64[s.Off])
	case p.Dtype() == tensor.Float32:
		v = tensor.New(tensor.WithShape(p.Shape().Clone()...), tensor.WithBacking(b.f32[s.Off:s.Off+s.Len]))
	default:
		v = tensor.New(tensor.WithShape(p.Shape().Clone()...), tensor.WithBacking(b.f64[s.Off:s.Off+s.Len]))
	}
	b.views[s.Param] = v
	return v, nil
}

// Params returns the wrapped parameters, unit after unit. The slice is new;
// the nodes are the caller's.
func (f *FSDP) Params() gorgonia.Nodes { return append(gorgonia.Nodes(nil), f.params...) }

// Units returns the parameter indices (into Params) of every unit. The
// slices are new.
func (f *FSDP) Units() [][]int {
	out := make([][]int, len(f.units))
	for k, u := range f.units {
		out[k] = append([]int(nil), u.params...)
	}
	return out
}

// ProcessGroup returns the group the FSDP communicates on.
func (f *FSDP) ProcessGroup() *dist.ProcessGroup { return f.pg }

// Err returns the first error that broke the FSDP, or nil. Once set, every
// later Step returns it.
func (f *FSDP) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

func (f *FSDP) failLocked(err error) error {
	if f.err == nil {
		f.err = err
	}
	return f.err
}

func (f *FSDP) closedLocked(op string) error {
	if f.closed {
		return fmt.Errorf("fsdp: %s: %w", op, ErrClosed)
	}
	return nil
}

// Close releases the FSDP: it waits for the collectives in flight (bounded
// by the group's timeout, or ended sooner if the group fails) and drops its
// buffers. From then on every call fails with an error matching ErrClosed.
// Close returns the error of a collective in flight that failed. It does
// not close the group; it is idempotent.
func (f *FSDP) Close() error {
	first := false
	f.closeOnce.Do(func() {
		first = true
		f.mu.Lock()
		f.closed = true
		var inFlight []*dist.Work
		for _, u := range f.units {
			for _, w := range []*dist.Work{u.gather, u.reduce} {
				if w != nil {
					inFlight = append(inFlight, w)
				}
			}
		}
		f.mu.Unlock()
		for _, w := range inFlight {
			<-w.Done()
			if err := w.Err(); err != nil && f.closeErr == nil {
				f.closeErr = fmt.Errorf("fsdp: close: collective in flight: %w", err)
			}
		}
		f.mu.Lock()
		for _, u := range f.units {
			u.w32, u.w64, u.g32, u.g64, u.own = nil, nil, nil, nil, nil
		}
		f.pslots, f.gslots = [2]buffer{}, [2]buffer{}
		f.views = nil
		f.mu.Unlock()
	})
	if !first {
		return nil
	}
	return f.closeErr
}

// Stats describes one optimiser step of an FSDP as seen by this rank.
type Stats struct {
	// Gathers is the number of unit all-gathers of the step (forward and
	// backward), Reduces the number of reduce-scatters.
	Gathers, Reduces int
	// Bytes is what the collectives gathered and reduced (full unit sizes).
	Bytes int64
	// GatherWait is the time the forward and backward passes waited for
	// all-gathers: gathering not hidden behind computation (prefetch
	// hides the rest).
	GatherWait time.Duration
	// ReduceWait is the time Step waited for the reduce-scatters.
	ReduceWait time.Duration
}

// Stats returns the statistics of the last step (zero before the first).
func (f *FSDP) Stats() Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last
}

// Memory is what an FSDP holds on this rank, in bytes counted from its
// buffers.
type Memory struct {
	// ParamShards and GradShards are this rank's pieces of the parameters
	// and of their averaged gradients: each 1/WorldSize of the model (and
	// its padding).
	ParamShards, GradShards int64
	// Gathered is the two buffers the units are gathered into (the units
	// at even and at odd forward positions take turns, so each is the size
	// of the largest unit that uses it; one buffer with
	// WithPrefetch(false)), Staged the two buffers their gradients are
	// staged in for the reduce-scatter, plus a buffer of its own for any
	// unit whose gradients began to arrive before the unit that had its
	// staging buffer had all of its own (gradients out of unit order).
	Gathered, Staged int64
}

// Memory returns the bytes of the FSDP's buffers on this rank.
func (f *FSDP) Memory() Memory {
	f.mu.Lock()
	defer f.mu.Unlock()
	var m Memory
	for _, u := range f.units {
		m.ParamShards += int64(4*cap(u.w32) + 8*cap(u.w64))
		m.GradShards += int64(4*cap(u.g32) + 8*cap(u.g64))
		if u.own != nil {
			m.Staged += int64(4*cap(u.own.f32) + 8*cap(u.own.f64))
		}
	}
	for par := range 2 {
		m.Gathered += int64(4*cap(f.pslots[par].f32) + 8*cap(f.pslots[par].f64))
		m.Staged += int64(4*cap(f.gslots[par].f32) + 8*cap(f.gslots[par].f64))
	}
	return m
}

// Option configures Wrap. Each option checks its value when Wrap applies
// it; a refusal (or a nil Option) is an error matching ErrInvalidArgument.
type Option func(*config) error

type config struct {
	prefetch    bool
	maxGradNorm float64
}

func newConfig(opts []Option) (config, error) {
	cfg := config{prefetch: true}
	if err := options.Apply(&cfg, opts, "fsdp", ErrInvalidArgument); err != nil {
		return config{}, err
	}
	return cfg, nil
}

// WithPrefetch chooses whether the next unit's all-gather starts while the
// current unit computes (true, the default: torch's forward_prefetch and
// BACKWARD_PRE) or only when the unit is reached (false: the baseline that
// shows what prefetching hides).
func WithPrefetch(on bool) Option {
	return func(c *config) error {
		c.prefetch = on
		return nil
	}
}

// WithMaxGradNorm clips the averaged gradients before every step so that
// their global L2 norm is at most max (torch's clip_grad_norm_): each rank
// sums the squares of its pieces and one all-reduce gives the norm. max
// must be positive and finite; the default is no clipping.
func WithMaxGradNorm(max float64) Option {
	return func(c *config) error {
		if !(max > 0) || max > 1e308 {
			return fmt.Errorf("fsdp: WithMaxGradNorm(%v): must be positive and finite: %w", max, ErrInvalidArgument)
		}
		c.maxGradNorm = max
		return nil
	}
}

// Sharding names the FSDP's mode as sharded checkpoints record it: "fsdp".
func (f *FSDP) Sharding() string { return "fsdp" }

// Segments returns the parts of the parameters in this rank's pieces, unit
// by unit, in the order the Solver hands them to the inner solver: its
// state for its i-th value is the state of the i-th part. The slice is new.
func (f *FSDP) Segments() []checkpoint.Segment {
	var out []checkpoint.Segment
	for _, u := range f.units {
		for _, s := range u.segs {
			out = append(out, checkpoint.Segment{Name: f.params[s.Param].Name(), Off: s.ParamOff, Len: s.Len})
		}
	}
	return out
}

// SaveSegments returns the parts this rank writes in a sharded checkpoint:
// its pieces (Segments).
func (f *FSDP) SaveSegments() []checkpoint.Segment { return f.Segments() }

// HeldSegments returns the parts of the parameters whose values this rank
// holds: its pieces (Segments).
func (f *FSDP) HeldSegments() []checkpoint.Segment { return f.Segments() }

// SegmentValues returns the values of a part of this rank's pieces (one of
// Segments, or a part of one), over the FSDP's memory: f32 or f64 after the
// parameter's dtype. A caller may write them (a checkpoint being loaded):
// the FSDP then gathers every unit afresh before its next use.
func (f *FSDP) SegmentValues(s checkpoint.Segment) ([]float32, []float64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.closedLocked("segment values"); err != nil {
		return nil, nil, err
	}
	for _, u := range f.units {
		for _, g := range u.segs {
			if f.params[g.Param].Name() != s.Name || s.Off < g.ParamOff || s.Off+s.Len > g.ParamOff+g.Len || s.Len < 0 {
				continue
			}
			for par := range f.pslots {
				f.pslots[par].owner = nil
			}
			lo := g.Off + s.Off - g.ParamOff
			if u.dt == tensor.Float32 {
				return u.w32[lo : lo+s.Len], nil, nil
			}
			return nil, u.w64[lo : lo+s.Len], nil
		}
	}
	return nil, nil, fmt.Errorf("fsdp: elements [%d, %d) of %q are not in this rank's pieces: %w", s.Off, s.Off+s.Len, s.Name, ErrNotParam)
}
