package dist

import (
	"context"
	"fmt"
	"hash/fnv"
	"time"
	"unsafe"
)

// call is one collective's arguments. Buffers are byte views of the
// caller's slices; the caller keeps owning them.
type call struct {
	kind  opKind
	dt    DType
	op    ReduceOp
	root  int
	count int    // elements, as fingerprinted (see CollectiveDesc)
	data  []byte // in and out: all_reduce, broadcast, reduce; dst of the others
	src   []byte // all_gather(_v), reduce_scatter, all_to_all(_v), gather, scatter
	// The uneven collectives' counts, in elements, per member
	// (all_gather_v: counts; all_to_all_v: send and receive counts).
	counts, recvCounts []int

	fed *fedCall // federated_average only

	site uint32 // call-site hash in debug detail mode (debug.go)
}

func (c *call) fingerprint() uint64 { return fingerprint(c.kind, c.dt, c.op, c.root, c.count) }

// checkCall validates the arguments of c that do not depend on other
// ranks, besides the buffers' own checks done by its maker.
func (g *ProcessGroup) checkCall(c *call) error {
	if c.kind.hasReduce() && !c.op.valid() {
		return fmt.Errorf("dist: %s: %w: reduce op %v", g.opName(c.kind), ErrInvalidArgument, c.op)
	}
	if c.kind.hasRoot() && (c.root < 0 || c.root >= g.size) {
		return fmt.Errorf("dist: %s: root: %w: %d not in [0, %d)", g.opName(c.kind), ErrInvalidRank, c.root, g.size)
	}
	if c.count < 0 || c.count > MaxCount {
		return fmt.Errorf("dist: %s: %w: %d elements (at most %d)", g.opName(c.kind), ErrInvalidArgument, c.count, MaxCount)
	}
	return nil
}

// dispatch runs the collective's algorithm over the group's members. ctx
// is the group's op context.
func (g *ProcessGroup) dispatch(ctx context.Context, c *call) error {
	nt, cm := &g.net, g.comm()
	red := reducer{c.dt, c.op}.asColl()
	switch c.kind {
	case kAllReduce:
		return nt.AllReduce(ctx, cm, c.data, red)
	case kAllGather:
		return nt.AllGather(ctx, cm, c.data, c.src)
	case kAllGatherV:
		return nt.AllGatherV(ctx, cm, c.data, c.src, c.counts, c.dt.Size())
	case kNewGroup, kSplit:
		return nt.AllGather(ctx, cm, c.data, c.src)
	case kReduceScatter:
		return nt.ReduceScatter(ctx, cm, c.data, c.src, red)
	case kBroadcast:
		return nt.Broadcast(ctx, cm, c.data, c.root)
	case kReduce:
		return nt.Reduce(ctx, cm, c.data, c.root, red)
	case kAllToAll, kAllToAllV:
		return nt.AllToAll(ctx, cm, c.data, c.src, c.counts, c.recvCounts, c.dt.Size())
	case kGather:
		return nt.Gather(ctx, cm, c.data, c.src, c.root)
	case kScatter:
		return nt.Scatter(ctx, cm, c.data, c.src, c.root)
	case kBarrier:
		return nt.Barrier(ctx, cm)
	case kFederated:
		return g.federated(ctx, c)
	}
	return fmt.Errorf("dist: unknown collective %v", c.kind)
}

// run checks c and runs it on the caller's goroutine.
func (g *ProcessGroup) run(ctx context.Context, c *call, check error) error {
	if check != nil {
		return check
	}
	if err := g.checkCall(c); err != nil {
		return err
	}
	c.site = g.callSite()
	return g.runSync(ctx, c)
}

// start checks c and queues it on the group's worker.
func (g *ProcessGroup) start(ctx context.Context, c call, check error) *Work {
	if check == nil {
		check = g.checkCall(&c)
	}
	return g.enqueue(ctx, c, check)
}

// The calls. Each returns the call and the error of its arguments, if any.

func (g *ProcessGroup) allReduceCall(buf Buffer, op ReduceOp) (call, error) {
	if err := buf.check(kAllReduce); err != nil {
		return call{}, err
	}
	return call{kind: kAllReduce, dt: buf.dt, op: op, count: buf.Len(), data: buf.b}, nil
}

// sameType checks that dst and src are valid and of one dtype.
func sameType(k opKind, dst, src Buffer) error {
	if err := dst.check(k); err != nil {
		return err
	}
	if err := src.check(k); err != nil {
		return err
	}
	if dst.dt != src.dt {
		return fmt.Errorf("dist: %s: %w: dst is %v, src %v", k, ErrInvalidArgument, dst.dt, src.dt)
	}
	return nil
}

func (g *ProcessGroup) allGatherCall(dst, src Buffer) (call, error) {
	if err := sameType(kAllGather, dst, src); err != nil {
		return call{}, err
	}
	if dst.Len() != g.size*src.Len() {
		return call{}, &LengthMismatchError{Op: g.opName(kAllGather), Want: g.size * src.Len(), Got: dst.Len()}
	}
	return call{kind: kAllGather, dt: dst.dt, count: src.Len(), data: dst.b, src: src.b}, nil
}

func (g *ProcessGroup) reduceScatterCall(dst, src Buffer, op ReduceOp) (call, error) {
	if err := sameType(kReduceScatter, dst, src); err != nil {
		return call{}, err
	}
	if src.Len() != g.size*dst.Len() {
		return call{}, &LengthMismatchError{Op: g.opName(kReduceScatter), Want: g.size * dst.Len(), Got: src.Len()}
	}
	if overlap(dst.b, src.b) {
		return call{}, fmt.Errorf("dist: %s: %w: dst and src overlap", g.opName(kReduceScatter), ErrInvalidArgument)
	}
	return call{kind: kReduceScatter, dt: dst.dt, op: op, count: dst.Len(), data: dst.b, src: src.b}, nil
}

// uintptrOf returns p's address, for comparing.
func uintptrOf(p *byte) uintptr { return uintptr(unsafe.Pointer(p)) }

// overlap reports whether a and b share memory.
func overlap(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	a0, b0 := &a[0], &b[0]
	return uintptrOf(a0) < uintptrOf(b0)+uintptr(len(b)) && uintptrOf(b0) < uintptrOf(a0)+uintptr(len(a))
}

// AllReduce combines buf element by element across the group's members
// with op and leaves the result in buf on every member, bitwise identical
// everywhere (except for the payload bits of NaNs). Float32 and Float64
// buffers reduce in their own precision (which for Float32 gives the same
// bits as a float64 computation rounded back); Float16 and BFloat16
// elements travel in their own width and are combined in float64 and
// rounded back at every combination. buf stays the caller's and must not
// be touched until AllReduce returns.
//
// Every member must call the same collectives in the same order, with the
// same length, dtype, op and root: a member that does not gets a
// *DesyncError (and so do the others) instead of wrong numbers or a hang.
// A collective that fails aborts the job: later collectives fail too, in
// every group (see ErrAborted).
func (g *ProcessGroup) AllReduce(ctx context.Context, buf Buffer, op ReduceOp) error {
	c, err := g.allReduceCall(buf, op)
	return g.run(ctx, &c, err)
}

// AllReduceAsync starts AllReduce on the group's worker and returns at
// once; buf must not be touched until the Work is done. The collective
// takes its place in the group's order now, so a later sync collective
// waits for it.
//
// ctx governs the collective exactly as it governs AllReduce: if it ends
// while the collective is queued or running, the collective fails with an
// error wrapping ctx.Err() and the job is aborted; a ctx without a
// deadline gets the group's default timeout (WithTimeout). A ctx that is
// already done fails the Work at once without aborting anything. Watching
// a cancellable ctx costs a few small allocations per call;
// context.Background() costs none.
func (g *ProcessGroup) AllReduceAsync(ctx context.Context, buf Buffer, op ReduceOp) *Work {
	c, err := g.allReduceCall(buf, op)
	return g.start(ctx, c, err)
}

// AllGather concatenates every member's src into dst, in member order:
// member r's src lands at dst elements [r*src.Len(), (r+1)*src.Len()).
// dst.Len() must be WorldSize*src.Len() (else a *LengthMismatchError),
// both of one dtype. src may be that part of dst. Both stay the caller's.
func (g *ProcessGroup) AllGather(ctx context.Context, dst, src Buffer) error {
	c, err := g.allGatherCall(dst, src)
	return g.run(ctx, &c, err)
}

// AllGatherAsync is AllGather run like AllReduceAsync: dst and src must
// not be touched until the Work is done.
func (g *ProcessGroup) AllGatherAsync(ctx context.Context, dst, src Buffer) *Work {
	c, err := g.allGatherCall(dst, src)
	return g.start(ctx, c, err)
}

// AllGatherV is AllGather with contributions of different lengths
// (MPI_Allgatherv): member r contributes counts[r] elements, its src
// (src.Len() == counts[Rank()]), and dst, of the sum of counts, receives
// them in member order. Every member passes the same counts (a member
// whose counts differ gets a *DesyncError). Both buffers stay the
// caller's.
func (g *ProcessGroup) AllGatherV(ctx context.Context, dst, src Buffer, counts []int) error {
	if err := sameType(kAllGatherV, dst, src); err != nil {
		return err
	}
	name := g.opName(kAllGatherV)
	if len(counts) != g.size {
		return fmt.Errorf("dist: %s: %w: %d counts for %d members", name, ErrInvalidArgument, len(counts), g.size)
	}
	total := 0
	for r, n := range counts {
		if n < 0 {
			return fmt.Errorf("dist: %s: %w: counts[%d] = %d", name, ErrInvalidArgument, r, n)
		}
		total += n
	}
	if src.Len() != counts[g.rank] {
		return &LengthMismatchError{Op: name, Want: counts[g.rank], Got: src.Len()}
	}
	if dst.Len() != total {
		return &LengthMismatchError{Op: name, Want: total, Got: dst.Len()}
	}
	c := call{kind: kAllGatherV, dt: dst.dt, count: total, root: countsHash(counts), data: dst.b, src: src.b, counts: counts}
	return g.run(ctx, &c, nil)
}

// countsHash folds counts into the root field of a fingerprint, so that
// members that pass different counts (of one total) disagree.
func countsHash(counts []int) int {
	h := fnv.New32a()
	var b [8]byte
	for _, n := range counts {
		for i := range b {
			b[i] = byte(n >> (8 * i))
		}
		h.Write(b[:])
	}
	s := h.Sum32()
	return int(s>>16^s) & (1<<fpRootBits - 1)
}

// ReduceScatter reduces src element by element across the members with op
// and gives member r block r of the result: src.Len() must be
// WorldSize*dst.Len() (else a *LengthMismatchError), and dst receives the
// reduction of every member's src elements [r*dst.Len(), (r+1)*dst.Len()).
// src is not modified. Both stay the caller's and must not overlap.
func (g *ProcessGroup) ReduceScatter(ctx context.Context, dst, src Buffer, op ReduceOp) error {
	c, err := g.reduceScatterCall(dst, src, op)
	return g.run(ctx, &c, err)
}

// ReduceScatterAsync is ReduceScatter run like AllReduceAsync: dst and
// src must not be touched until the Work is done.
func (g *ProcessGroup) ReduceScatterAsync(ctx context.Context, dst, src Buffer, op ReduceOp) *Work {
	c, err := g.reduceScatterCall(dst, src, op)
	return g.start(ctx, c, err)
}

// Broadcast copies member root's buf into buf on every other member. buf
// stays the caller's; on the root it is only read.
func (g *ProcessGroup) Broadcast(ctx context.Context, buf Buffer, root int) error {
	if err := buf.check(kBroadcast); err != nil {
		return err
	}
	c := call{kind: kBroadcast, dt: buf.dt, root: root, count: buf.Len(), data: buf.b}
	return g.run(ctx, &c, nil)
}

// Reduce combines buf across the members with op and leaves the result in
// root's buf. Other members' buf is left unchanged. buf stays the
// caller's.
func (g *ProcessGroup) Reduce(ctx context.Context, buf Buffer, op ReduceOp, root int) error {
	if err := buf.check(kReduce); err != nil {
		return err
	}
	c := call{kind: kReduce, dt: buf.dt, op: op, root: root, count: buf.Len(), data: buf.b}
	return g.run(ctx, &c, nil)
}

// AllToAll sends block j of src to member j and receives member j's block
// for this member into block j of dst (torch's all_to_all_single with
// equal splits): src and dst have the same length, a multiple of
// WorldSize, cut into WorldSize equal blocks. Both stay the caller's and
// must not overlap.
func (g *ProcessGroup) AllToAll(ctx context.Context, dst, src Buffer) error {
	if err := sameType(kAllToAll, dst, src); err != nil {
		return err
	}
	name := g.opName(kAllToAll)
	if src.Len()%g.size != 0 {
		return fmt.Errorf("dist: %s: %w: %d elements do not split into %d equal blocks", name, ErrInvalidArgument, src.Len(), g.size)
	}
	if dst.Len() != src.Len() {
		return &LengthMismatchError{Op: name, Want: src.Len(), Got: dst.Len()}
	}
	if overlap(dst.b, src.b) {
		return fmt.Errorf("dist: %s: %w: dst and src overlap", name, ErrInvalidArgument)
	}
	c := call{kind: kAllToAll, dt: src.dt, count: src.Len() / g.size, data: dst.b, src: src.b}
	return g.run(ctx, &c, nil)
}

// AllToAllV is AllToAll with blocks of different lengths (torch's
// all_to_all_single with input and output splits, MPI_Alltoallv): this
// member sends sendCounts[j] elements of src (in member order) to member j
// and receives recvCounts[j] elements from member j into dst (in member
// order). src.Len() must be the sum of sendCounts and dst.Len() that of
// recvCounts; recvCounts[j] must equal member j's sendCounts for this
// member (else the members get a *PeerError wrapping ErrProtocol). Both
// buffers stay the caller's and must not overlap.
func (g *ProcessGroup) AllToAllV(ctx context.Context, dst, src Buffer, sendCounts, recvCounts []int) error {
	if err := sameType(kAllToAllV, dst, src); err != nil {
		return err
	}
	name := g.opName(kAllToAllV)
	if len(sendCounts) != g.size || len(recvCounts) != g.size {
		return fmt.Errorf("dist: %s: %w: %d send and %d receive counts for %d members", name, ErrInvalidArgument, len(sendCounts), len(recvCounts), g.size)
	}
	var ns, nr int
	for j := range g.size {
		if sendCounts[j] < 0 || recvCounts[j] < 0 {
			return fmt.Errorf("dist: %s: %w: negative count for member %d", name, ErrInvalidArgument, j)
		}
		ns += sendCounts[j]
		nr += recvCounts[j]
	}
	if sendCounts[g.rank] != recvCounts[g.rank] {
		return fmt.Errorf("dist: %s: %w: this member sends itself %d elements and receives %d", name, ErrInvalidArgument, sendCounts[g.rank], recvCounts[g.rank])
	}
	if src.Len() != ns {
		return &LengthMismatchError{Op: name, Want: ns, Got: src.Len()}
	}
	if dst.Len() != nr {
		return &LengthMismatchError{Op: name, Want: nr, Got: dst.Len()}
	}
	if overlap(dst.b, src.b) {
		return fmt.Errorf("dist: %s: %w: dst and src overlap", name, ErrInvalidArgument)
	}
	c := call{kind: kAllToAllV, dt: src.dt, data: dst.b, src: src.b, counts: sendCounts, recvCounts: recvCounts}
	return g.run(ctx, &c, nil)
}

// Gather concatenates every member's src into root's dst, in member order
// (MPI_Gather): on root dst.Len() must be WorldSize*src.Len(); elsewhere
// dst is not used (pass Buffer{}). Both stay the caller's.
func (g *ProcessGroup) Gather(ctx context.Context, dst, src Buffer, root int) error {
	if err := src.check(kGather); err != nil {
		return err
	}
	if g.rank == root {
		if err := sameType(kGather, dst, src); err != nil {
			return err
		}
		if dst.Len() != g.size*src.Len() {
			return &LengthMismatchError{Op: g.opName(kGather), Want: g.size * src.Len(), Got: dst.Len()}
		}
	}
	c := call{kind: kGather, dt: src.dt, root: root, count: src.Len(), data: dst.b, src: src.b}
	return g.run(ctx, &c, nil)
}

// Scatter sends block r of root's src to member r, into its dst
// (MPI_Scatter): on root src.Len() must be WorldSize*dst.Len(); elsewhere
// src is not used (pass Buffer{}). Both stay the caller's.
func (g *ProcessGroup) Scatter(ctx context.Context, dst, src Buffer, root int) error {
	if err := dst.check(kScatter); err != nil {
		return err
	}
	if g.rank == root {
		if err := sameType(kScatter, dst, src); err != nil {
			return err
		}
		if src.Len() != g.size*dst.Len() {
			return &LengthMismatchError{Op: g.opName(kScatter), Want: g.size * dst.Len(), Got: src.Len()}
		}
	}
	c := call{kind: kScatter, dt: dst.dt, root: root, count: dst.Len(), data: dst.b, src: src.b}
	return g.run(ctx, &c, nil)
}

// Barrier returns once every member has entered it.
func (g *ProcessGroup) Barrier(ctx context.Context) error {
	c := call{kind: kBarrier}
	return g.run(ctx, &c, nil)
}

// Work is the handle of an async collective.
type Work struct {
	c    call
	name string // the collective, as errors name it
	ctx  context.Context
	seq  uint64
	stop func() bool // unregisters the watch on ctx; nil if none
	done chan struct{}
	err  error
	at   time.Time // when it finished; set before done is closed

	queued time.Time // when it was issued, if observability is on
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
// (its buffers are still in use until Done is closed): to stop the
// collective itself, cancel the context it was started with.
func (w *Work) Wait(ctx context.Context) error {
	select {
	case <-w.done:
		return w.err
	case <-ctx.Done():
		return fmt.Errorf("dist: wait for %s: %w", w.name, ctx.Err())
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
