// Package dist is gdist's communication layer: a ProcessGroup (a rank, a
// world size and a transport) with tagged point-to-point messages and
// collectives — all-reduce, all-gather, reduce-scatter, broadcast, reduce,
// barrier — plus FederatedAverage for rounds that tolerate stragglers.
//
// # Usage
//
// Launch N processes with cmd/gdistrun (or torchrun, mpirun, srun) and let
// each one join the job from its environment with package gdist (the module
// root), which picks the transport:
//
//	g, err := gdist.InitFromEnv(ctx)
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
// Options (WithTimeout, WithSmallThreshold, WithLogger, WithStallThreshold,
// WithDebug, WithHierarchical, ...) are checked when New applies them; an
// invalid one makes it fail with an error matching ErrInvalidArgument that
// names it. New also reads GDIST_DEBUG, GDIST_STALL_THRESHOLD and
// GDIST_HIERARCHICAL (options win over them); gdist.InitFromEnv reads,
// besides the launcher's variables, GDIST_TRANSPORT (auto, tcp or shm) and
// GDIST_HOST_ID (a host identity replacing the default, to simulate hosts),
// among others listed there. A malformed value fails them with ErrEnv.
//
// Package dist imports no concrete transport: New takes any
// transport.Transport, and gdist.InitFromEnv chooses among tcp, shm and
// hybrid.
//
// # Semantics
//
// Every rank must call the same collectives in the same order, with the same
// length, dtype, reduce op and root. Collectives run one at a time in call
// order — a sync call issued after an async one waits for it. Each message
// carries the collective's sequence number and a fingerprint of its
// parameters, so ranks that disagree about a collective's parameters, or
// call different collectives, get a *DesyncError (matching ErrDesync, and
// unwrapping to a *LengthMismatchError when only the lengths differ)
// instead of a hang: every algorithm starts by exchanging a message with
// its ring neighbours, so some rank sees the disagreement before anyone can
// wait forever. Every rank's call fails, except that of a rank whose part
// needs nothing from the disagreeing ones (a broadcast root, say): its next
// collective fails instead. FederatedAverage, which waits for nobody, is the
// exception (see there). Results are bitwise identical on every rank (NaN
// payloads aside).
//
// What sequence numbers cannot see. Two collectives with the same
// parameters look the same on the wire. If a rank skips one of two
// identical consecutive collectives (say, a metrics all-reduce of the same
// length as a gradient all-reduce), the ranks combine unrelated data and
// get wrong sums without any error; the disagreement shows only at the
// next collective whose parameters differ, if any. The same holds when
// ranks reach an identical collective from different lines of code. No
// sequence-number scheme can detect this. The debug mode
// (WithDebug(DebugDetail), or GDIST_DEBUG=detail on every rank) adds each
// collective's call site (the file and line of the first caller outside
// this package) to its fingerprint, so ranks that reach the same
// collective from different lines fail at that call with a *DesyncError
// naming both call sites (LocalSite, RemoteSite). Finding the call site
// costs 0.26-0.4 µs per collective and no allocations once a line has been
// seen; a 16 KiB all-reduce between two in-process ranks took 8.3-11.5 µs
// with it against 5.9-7.2 µs without (BenchmarkDebugDetail, one noisy
// 2-core machine, both ranks in one process sharing the call-site cache).
// It cannot see a skipped call of the same line
// (a loop that runs once more on one rank); keep the control flow of the
// ranks identical.
//
// # Failure
//
// The group is one failure domain, used by every layer: collectives,
// point-to-point calls, dist/ddp (through its collectives) and
// dist/pipeline (through Abort). The first failure — a lost peer (its
// process died or its connection broke), a frozen peer (it stopped
// answering heartbeats), a desync, a cancelled context, a timeout, a peer
// that closed in the middle of an operation, a protocol violation, or a
// layer above calling Abort — is recorded once as the group's cause, an
// *AbortError: the culprit rank, the rank that found it, the operation
// and its sequence number, the kind (FailureKind) and a message. It wakes
// every blocked collective and point-to-point call of the group and is
// sent, encoded (versioned binary, not error text), to every peer, and
// every rank that records a cause passes it on. Like an NCCL communicator,
// the group cannot be resumed: every later call fails with the error
// derived from the cause.
//
// The errors to match, on every rank:
//
//   - *PeerError{Rank, Op, Err}: Rank is the culprit — the rank that died
//     (errors.Is ErrPeerLost), froze (ErrPeerUnresponsive, which also
//     matches ErrPeerLost), closed mid-operation (ErrPeerClosed) or broke
//     the protocol (ErrProtocol) — or, on the other ranks, the rank whose
//     notice explained the failure (its context was cancelled: ErrCanceled;
//     it timed out: ErrTimeout; a layer above aborted: ErrAborted). Op is
//     the operation that reports it.
//   - *DesyncError, naming both sides (and both call sites in detail mode).
//   - *TimeoutError, on the rank whose collective ran out of time: the ranks
//     it was waiting for and where each of them was, as in
//     "all_reduce #12 timed out after 5s waiting for rank 2 (rank 2 last
//     finished all_reduce #11, 4.9 s ago)". It matches ErrTimeout and
//     context.DeadlineExceeded. Its peers get a *PeerError naming the first
//     rank it waited for.
//   - Errors of later calls also match ErrAborted; errors.As with
//     *AbortError reads the cause from any of them.
//
// The first cause wins: a survivor never blames a healthy rank that only
// closed after failing. A rank sends its notice on every link before
// anything else it does about the failure, and Close waits for those sends
// (each bounded by 5 s) before it says goodbye, so per-link order puts the
// notice ahead of the goodbye; notices are received into a receive posted
// for the group's life, so one that has arrived is handed over even if the
// link breaks right after; and a rank that finds a peer closed or lost waits
// until it has handled what that peer sent before it records anything. No
// grace period is involved.
//
// A collective whose context has no deadline gets the group's default
// timeout (WithTimeout). All of this holds for async collectives too, under
// the context they were started with: one whose context ends while it is
// queued behind others gives up its turn and aborts the group, as a sync
// call waiting for its turn does. A call refused at once because its
// context had already ended takes no turn and fails nothing.
//
// # Progress and stall reports
//
// Every rank tells its peers, on a reserved tag, the last collective it
// started and the last it finished (sequence number, operation, how long
// ago), at most every half second and only when that changed; the messages
// are 28 bytes and allocate nothing. Progress returns what a rank knows of
// the others. A collective that waits longer than the stall threshold
// (WithStallThreshold, GDIST_STALL_THRESHOLD, default 60 s) without any
// timeout logs a report once per threshold, like Horovod's stall inspector:
//
//	level=WARN msg="dist: all_reduce #5 stalled: waiting 1.1s for rank 2 (rank 2 last finished all_reduce #4, 1.1 s ago)"
//
// # Logging and debugging
//
// The group logs aborts (WARN), stall reports (WARN) and details (DEBUG) to
// the logger of WithLogger. Without one it is silent except for stall
// reports, which go to stderr. GDIST_DEBUG=info or debug (WithDebug) sends
// the group's log to stderr at that level; GDIST_DEBUG=detail does too and
// adds call sites to the fingerprints (above).
//
// Buffers passed to collectives stay the caller's: the group reads and writes
// them only until the call returns (or, for async calls, until the Work is
// done) and keeps no reference. Steady-state sync collectives allocate
// nothing on the in-process and TCP transports. Watching a cancellable
// context costs a few small allocations (context.AfterFunc's), once per
// context for sync calls: a loop of sync collectives under one context
// allocates nothing after the first call. An async call allocates its Work
// and Done channel, plus the watch of its context if that is cancellable
// (context.Background() needs none). Send and RecvInto under a context
// that cannot end allocate nothing either; under a cancellable one each call
// costs about five small allocations, joining it with the group's failure.
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
// When the transport tells which ranks share a host (transport.Topology, as
// the hybrid transport of gdist.InitFromEnv does) and the job spans several
// hosts, one of them at least with several ranks, AllReduce and Broadcast
// are hierarchical (WithHierarchical, GDIST_HIERARCHICAL; on by default):
// each host reduces to its lowest rank, those leaders all-reduce among
// themselves with the algorithms above, and each leader passes the result
// on within its host; a broadcast crosses to each host's leader once. Large
// vectors go through the phases block by block, so they overlap. With h
// hosts, 2(h-1)/h of the vector leaves each host, against 2(n-1)/n of it on
// each link where the flat ring crosses hosts: 2/3 of the flat bytes for
// two hosts of two ranks, where bench/hier measured 0.67-0.75x the flat
// time from 1 MiB to 16 MiB over a 1 Gbit/s link between two network
// namespaces (over TCP and over the hybrid transport, two runs).
// The sums are bitwise identical on every rank but may differ from the flat
// algorithms' in the last place (another order of additions).
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
