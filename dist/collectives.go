package dist

import (
	"context"
	"fmt"
	"time"
	"unsafe"

	"github.com/gdist/gdist/dist/transport"
)

// call is one collective's arguments. Buffers are byte views of the
// caller's slices; the caller keeps owning them.
type call struct {
	kind  opKind
	dt    DType
	op    ReduceOp
	root  int
	count int    // elements, as fingerprinted (see CollectiveDesc)
	data  []byte // in and out: all_reduce, broadcast, reduce; dst: all_gather, reduce_scatter
	src   []byte // all_gather, reduce_scatter

	fed *fedCall // federated_average only

	site uint32 // call-site hash in debug detail mode (debug.go)
}

func (c *call) fingerprint() uint64 { return fingerprint(c.kind, c.dt, c.op, c.root, c.count) }

// check validates the arguments that do not depend on other ranks.
func (c *call) check(g *ProcessGroup) error {
	if !c.dt.valid() && c.kind != kBarrier {
		return fmt.Errorf("dist: %s: %w: %v", c.kind, ErrUnsupportedDType, c.dt)
	}
	if c.kind.hasReduce() && !c.op.valid() {
		return fmt.Errorf("dist: %s: %w: reduce op %v", c.kind, ErrInvalidArgument, c.op)
	}
	if c.kind.hasRoot() {
		if err := transport.CheckRank(c.root, g.world); err != nil {
			return fmt.Errorf("dist: %s: root: %w", c.kind, err)
		}
	}
	if c.count < 0 || c.count > MaxCount {
		return fmt.Errorf("dist: %s: %w: %d elements (at most %d)", c.kind, ErrInvalidArgument, c.count, MaxCount)
	}
	return nil
}

// dispatch runs the collective's algorithm. ctx is the group's op context.
// With a topology plan (hier.go), AllReduce and Broadcast run hierarchically.
func (g *ProcessGroup) dispatch(ctx context.Context, c *call) error {
	red := reducer{c.dt, c.op}
	if g.world == 1 {
		switch c.kind {
		case kAllGather, kReduceScatter:
			copy(c.data, c.src)
		case kFederated:
			c.fed.n = 1
		}
		return nil
	}
	small := len(c.data) < g.cfg.small
	fl := g.flat()
	switch c.kind {
	case kAllReduce:
		if g.hier != nil {
			return g.allReduceHier(ctx, g.hier, c.data, c.dt.Size(), red)
		}
		if small {
			return g.allReduceRD(ctx, fl, c.data, red)
		}
		return g.allReduceRing(ctx, fl, c.data, c.dt.Size(), red)
	case kAllGather:
		return g.allGatherRing(ctx, fl, c.data, c.src)
	case kReduceScatter:
		return g.reduceScatterRing(ctx, fl, c.data, c.src, red)
	case kBroadcast:
		if g.hier != nil {
			return g.broadcastHier(ctx, g.hier, c.data, c.root)
		}
		if small {
			return g.broadcastTree(ctx, fl, c.data, c.root)
		}
		return g.broadcastChain(ctx, fl, c.data, c.root)
	case kReduce:
		if small {
			return g.reduceTree(ctx, fl, c.data, c.root, red)
		}
		return g.reduceChain(ctx, fl, c.data, c.root, red)
	case kBarrier:
		return g.barrier(ctx)
	case kFederated:
		return g.federated(ctx, c)
	}
	return fmt.Errorf("dist: unknown collective %v", c.kind)
}

// elem is the element types of the collectives on typed slices. One generic
// body per collective serves the float32 methods and their F64 twins (see
// the package documentation on why the exported API keeps methods).
type elem interface{ float32 | float64 }

// elemBytes returns s's dtype and its bytes (no copy).
func elemBytes[T elem](s []T) (DType, []byte) {
	size := int(unsafe.Sizeof(*new(T)))
	dt := F64
	if size == 4 {
		dt = F32
	}
	if len(s) == 0 {
		return dt, []byte{}
	}
	return dt, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), size*len(s))
}

// run checks c and runs it on the caller's goroutine.
func (g *ProcessGroup) run(ctx context.Context, c *call) error {
	if err := c.check(g); err != nil {
		return err
	}
	c.site = g.callSite()
	return g.runSync(ctx, c)
}

func allReduceCall[T elem](data []T, op ReduceOp) call {
	dt, b := elemBytes(data)
	return call{kind: kAllReduce, dt: dt, op: op, count: len(data), data: b}
}

func allReduce[T elem](ctx context.Context, g *ProcessGroup, data []T, op ReduceOp) error {
	c := allReduceCall(data, op)
	return g.run(ctx, &c)
}

func allGather[T elem](ctx context.Context, g *ProcessGroup, dst, src []T) error {
	if len(dst) != g.world*len(src) {
		return &LengthMismatchError{Op: kAllGather.String(), Want: g.world * len(src), Got: len(dst)}
	}
	dt, d := elemBytes(dst)
	_, s := elemBytes(src)
	c := call{kind: kAllGather, dt: dt, count: len(src), data: d, src: s}
	return g.run(ctx, &c)
}

func reduceScatter[T elem](ctx context.Context, g *ProcessGroup, dst, src []T, op ReduceOp) error {
	if len(src) != g.world*len(dst) {
		return &LengthMismatchError{Op: kReduceScatter.String(), Want: g.world * len(dst), Got: len(src)}
	}
	dt, d := elemBytes(dst)
	_, s := elemBytes(src)
	c := call{kind: kReduceScatter, dt: dt, op: op, count: len(dst), data: d, src: s}
	return g.run(ctx, &c)
}

func broadcast[T elem](ctx context.Context, g *ProcessGroup, data []T, root int) error {
	dt, b := elemBytes(data)
	c := call{kind: kBroadcast, dt: dt, root: root, count: len(data), data: b}
	return g.run(ctx, &c)
}

func reduce[T elem](ctx context.Context, g *ProcessGroup, data []T, op ReduceOp, root int) error {
	dt, b := elemBytes(data)
	c := call{kind: kReduce, dt: dt, op: op, root: root, count: len(data), data: b}
	return g.run(ctx, &c)
}

// AllReduce combines data element by element across all ranks with op and
// leaves the result in data on every rank, bitwise identical everywhere
// (except for the payload bits of NaNs). It accumulates in float32. data is
// the caller's and must not be touched until AllReduce returns.
//
// Every rank must call the same collectives in the same order, with the same
// length, dtype, op and root: a rank that does not gets a *DesyncError (and
// so do its peers) instead of wrong numbers or a hang. A collective that
// fails aborts the group: later collectives fail too (see ErrAborted).
func (g *ProcessGroup) AllReduce(ctx context.Context, data []float32, op ReduceOp) error {
	return allReduce(ctx, g, data, op)
}

// AllReduceF64 is AllReduce for float64 data, accumulating in float64.
func (g *ProcessGroup) AllReduceF64(ctx context.Context, data []float64, op ReduceOp) error {
	return allReduce(ctx, g, data, op)
}

// AllReduceTyped is AllReduce on raw little-endian elements of type dt (see
// EncodeFloat32 and DecodeFloat32). Messages carry dt's own width; each
// combination is computed in float64 and rounded back to dt (for F32 this
// gives exactly the float32 result). len(data) must be a multiple of
// dt.Size() (else ErrInvalidArgument); an unknown dt gives
// ErrUnsupportedDType. data is the caller's and must not be touched until
// AllReduceTyped returns.
func (g *ProcessGroup) AllReduceTyped(ctx context.Context, data []byte, dt DType, op ReduceOp) error {
	c, err := typedCall(data, dt, op)
	if err != nil {
		return err
	}
	return g.run(ctx, &c)
}

func typedCall(data []byte, dt DType, op ReduceOp) (call, error) {
	if !dt.valid() {
		return call{}, fmt.Errorf("dist: all_reduce: %w: %v", ErrUnsupportedDType, dt)
	}
	if len(data)%dt.Size() != 0 {
		return call{}, fmt.Errorf("dist: all_reduce: %w: %d bytes is not a whole number of %v elements", ErrInvalidArgument, len(data), dt)
	}
	return call{kind: kAllReduce, dt: dt, op: op, count: len(data) / dt.Size(), data: data}, nil
}

// AllReduceAsync starts AllReduce on the group's worker and returns at once.
// data must not be touched until the Work is done. The collective takes its
// place in the group's order now, so a later sync collective waits for it.
//
// ctx governs the collective exactly as it governs AllReduce: if it ends
// while the collective is queued or running, the collective fails with an
// error wrapping ctx.Err() and the group is aborted; a ctx without a
// deadline gets the group's default timeout (WithTimeout). A ctx that is
// already done fails the Work at once without aborting the group. Watching
// a cancellable ctx costs a few small allocations per call;
// context.Background() costs none.
func (g *ProcessGroup) AllReduceAsync(ctx context.Context, data []float32, op ReduceOp) *Work {
	return g.enqueue(ctx, allReduceCall(data, op))
}

// AllReduceF64Async is AllReduceAsync for float64 data.
func (g *ProcessGroup) AllReduceF64Async(ctx context.Context, data []float64, op ReduceOp) *Work {
	return g.enqueue(ctx, allReduceCall(data, op))
}

// AllReduceTypedAsync is AllReduceTyped run like AllReduceAsync.
func (g *ProcessGroup) AllReduceTypedAsync(ctx context.Context, data []byte, dt DType, op ReduceOp) *Work {
	c, err := typedCall(data, dt, op)
	if err != nil {
		return doneWork(err)
	}
	return g.enqueue(ctx, c)
}

// AllGather concatenates every rank's src into dst, in rank order: rank r's
// src lands at dst[r*len(src):]. len(dst) must be WorldSize*len(src) (else a
// *LengthMismatchError). src may be that part of dst. Both slices stay the
// caller's.
func (g *ProcessGroup) AllGather(ctx context.Context, dst, src []float32) error {
	return allGather(ctx, g, dst, src)
}

// AllGatherF64 is AllGather for float64 data.
func (g *ProcessGroup) AllGatherF64(ctx context.Context, dst, src []float64) error {
	return allGather(ctx, g, dst, src)
}

// ReduceScatter reduces src element by element across ranks with op and
// gives rank r block r of the result: len(src) must be WorldSize*len(dst)
// (else a *LengthMismatchError), and dst receives the reduction of every
// rank's src[r*len(dst):(r+1)*len(dst)]. src is not modified. Both slices
// stay the caller's and must not overlap.
func (g *ProcessGroup) ReduceScatter(ctx context.Context, dst, src []float32, op ReduceOp) error {
	return reduceScatter(ctx, g, dst, src, op)
}

// ReduceScatterF64 is ReduceScatter for float64 data.
func (g *ProcessGroup) ReduceScatterF64(ctx context.Context, dst, src []float64, op ReduceOp) error {
	return reduceScatter(ctx, g, dst, src, op)
}

// Broadcast copies root's data into data on every other rank. data stays the
// caller's; on the root it is only read.
func (g *ProcessGroup) Broadcast(ctx context.Context, data []float32, root int) error {
	return broadcast(ctx, g, data, root)
}

// BroadcastF64 is Broadcast for float64 data.
func (g *ProcessGroup) BroadcastF64(ctx context.Context, data []float64, root int) error {
	return broadcast(ctx, g, data, root)
}

// Reduce combines data across ranks with op and leaves the result in root's
// data. Other ranks' data is left unchanged. data stays the caller's.
func (g *ProcessGroup) Reduce(ctx context.Context, data []float32, op ReduceOp, root int) error {
	return reduce(ctx, g, data, op, root)
}

// ReduceF64 is Reduce for float64 data.
func (g *ProcessGroup) ReduceF64(ctx context.Context, data []float64, op ReduceOp, root int) error {
	return reduce(ctx, g, data, op, root)
}

// Barrier returns once every rank has entered it.
func (g *ProcessGroup) Barrier(ctx context.Context) error {
	c := call{kind: kBarrier, site: g.callSite()}
	return g.runSync(ctx, &c)
}

// Work is the handle of an async collective.
type Work struct {
	c    call
	ctx  context.Context
	seq  uint64
	stop func() bool // unregisters the watch on ctx; nil if none
	done chan struct{}
	err  error
	at   time.Time // when it finished; set before done is closed

	queued time.Time // when it was issued, if observability is on
}

func doneWork(err error) *Work {
	w := &Work{done: make(chan struct{})}
	w.finish(err)
	return w
}

// finish records the outcome and the finish time and closes done. It is
// called once, by whoever removed w from the group's queue (the worker, or
// the watch on w's context).
func (w *Work) finish(err error) {
	if w.stop != nil {
		w.stop()
	}
	w.err = err
	w.at = time.Now()
	close(w.done)
}

// Wait waits for the collective to finish and returns its error. If ctx ends
// first, Wait returns an error wrapping ctx.Err() but the collective goes on
// (its buffer is still in use until Done is closed): to stop the collective
// itself, cancel the context it was started with.
func (w *Work) Wait(ctx context.Context) error {
	select {
	case <-w.done:
		return w.err
	case <-ctx.Done():
		return fmt.Errorf("dist: wait for %s: %w", w.c.kind, ctx.Err())
	}
}

// Done is closed when the collective has finished, successfully or not.
func (w *Work) Done() <-chan struct{} { return w.done }

// Err returns the collective's error once it has finished, and nil before.
func (w *Work) Err() error {
	select {
	case <-w.done:
		return w.err
	default:
		return nil
	}
}

// Finished returns when the collective finished (successfully or not), as
// recorded just before Done was closed, and the zero time while it runs. It
// spares a caller that times collectives a goroutine waiting on Done.
func (w *Work) Finished() time.Time {
	select {
	case <-w.done:
		return w.at
	default:
		return time.Time{}
	}
}
