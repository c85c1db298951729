// Package dist is gdist's communication layer: a ProcessGroup (a rank, a
// world size and a transport) with tagged point-to-point messages and
// collectives — all-reduce, all-gather, reduce-scatter, broadcast, reduce,
// barrier — plus FederatedAverage for rounds that tolerate stragglers.
//
// # Usage
//
// Launch N processes with cmd/gdistrun (or torchrun, mpirun, srun) and let
// each one join the job from its environment:
//
//	g, err := dist.InitFromEnv(ctx)
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer g.Close()
//	grad := make([]float32, n) // filled by backprop
//	if err := g.AllReduce(ctx, grad, dist.Mean); err != nil {
//		log.Fatal(err) // a *dist.PeerError names the rank that failed
//	}
//
// Tests and examples run every rank in one process on the in-process
// transport:
//
//	ts, err := transport.NewLocal(4)
//	g0, err := dist.New(ts[0]) // one per rank, each used by its own goroutine
//
// Overlap communication with computation with the async variants. Their ctx
// governs the collective as it does a sync one's (see Semantics); Wait's ctx
// only bounds the wait:
//
//	w := g.AllReduceAsync(ctx, bucket, dist.Sum) // bucket is in use until w is done
//	// ... compute the next bucket ...
//	if err := w.Wait(ctx); err != nil { ... }
//	took := w.Finished().Sub(start) // when it finished, recorded by the group
//
// Options (WithTimeout, WithSmallThreshold, WithLogger) are checked when New
// or InitFromEnv applies them; an invalid one makes the constructor fail with
// an error matching ErrInvalidArgument that names it.
//
// # Semantics
//
// Every rank must call the same collectives in the same order, with the same
// length, dtype, reduce op and root. Collectives run one at a time in call
// order — a sync call issued after an async one waits for it. Each message
// carries the collective's sequence number and a fingerprint of its
// parameters, so ranks that disagree get a *DesyncError (which unwraps to a
// *LengthMismatchError when only the lengths differ) instead of a hang or
// wrong numbers: every algorithm starts by exchanging a message with its ring
// neighbours, so some rank sees the disagreement before anyone can wait
// forever. Every rank's call fails, except that of a rank whose part needs
// nothing from the disagreeing ones (a broadcast root, say): its next
// collective fails instead. FederatedAverage, which waits for nobody, is the
// exception (see there). Results are bitwise identical on every rank (NaN
// payloads aside).
//
// A collective that fails — desync, lost peer, timeout, cancelled context —
// aborts the group, like an NCCL communicator: the rank tells every peer, so
// that their collectives fail promptly too, and every later collective fails
// with an error wrapping the first failure (ErrAborted). A lost peer shows up
// as a *PeerError whose Op is the collective's name. Point-to-point messages
// and Close keep working. A collective whose context has no deadline gets the
// group's default timeout (WithTimeout). All of this holds for async
// collectives too, under the context they were started with: one whose
// context ends while it is queued behind others gives up its turn and aborts
// the group, as a sync call waiting for its turn does.
//
// Buffers passed to collectives stay the caller's: the group reads and writes
// them only until the call returns (or, for async calls, until the Work is
// done) and keeps no reference. Steady-state sync collectives allocate
// nothing on the in-process and TCP transports. Watching a cancellable
// context costs a few small allocations (context.AfterFunc's), once per
// context for sync calls: a loop of sync collectives under one context
// allocates nothing after the first call. An async call allocates its Work
// and Done channel, plus the watch of its context if that is cancellable
// (context.Background() needs none).
//
// # Choosing algorithms
//
// All-reduce uses recursive doubling below DefaultSmallThreshold (128 KiB,
// measured: see its documentation) and a ring — reduce-scatter, then
// all-gather, each rank moving 2(n-1)/n of the vector — above it. Broadcast
// and reduce use a binomial tree below the threshold and a pipelined chain
// above it; all-gather and reduce-scatter always use the ring. Large messages
// travel in segments of at most 4 MiB, so that reduction overlaps transfer
// and no message nears a transport's frame limit (4 MiB rather than 1 MiB
// cut the exposed communication of bench/ddp's overlapped run by more than
// half). Every algorithm fixes its reduction order, so all ranks get the
// same bits; it may differ from a sequential sum in the last place (F16 and
// BF16 round at every combination).
//
// # Methods, not generic functions
//
// Each collective on typed slices exists as a float32 method and an F64
// twin (AllReduce and AllReduceF64, ...), plus AllReduceTyped for raw
// F16/BF16/F32/F64 bytes and an Async form of the all-reduces. Generic
// package functions such as AllReduce[T float32 | float64](ctx, g, data, op)
// would replace each pair by one name, and cost nothing: the methods are
// thin wrappers around exactly such generic bodies, and every collective,
// float32 and float64, allocates nothing in steady state
// (TestCollectivesZeroAllocs; BenchmarkAllReduce4096: 0 B/op, 0 allocs/op).
// The exported API keeps the methods anyway:
//
//   - Go has no generic methods, so the generic form has to be a package
//     function taking the group, dist.AllReduce(ctx, g, x, op), beside
//     g.Barrier(ctx), g.Send(ctx, ...) and g.FederatedAverage(ctx, ...),
//     which stay methods: two calling conventions for one object.
//   - A caller that wants an interface for the group (to fake it in a
//     test) can list methods, never generic functions.
//   - It would fold only the F32/F64 pairs: the group's 30 methods would
//     become 21 names (six collective twins and three point-to-point ones,
//     SendF64, RecvF64, RecvF64Into). The Typed forms stay, since their
//     dtype is a run-time value (F16 and BF16 have no Go type). Added
//     beside the methods, which other code calls, generic functions would
//     make the surface larger, not smaller.
//
// So the duplication is kept to one line per method; a later major version
// can revisit this if Go gains generic methods.
package dist
