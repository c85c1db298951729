// Package dist is gdist's communication layer: a ProcessGroup (a rank, a
// world size and a transport) with tagged point-to-point messages and
// collectives — all-reduce, all-gather, reduce-scatter, broadcast, reduce,
// barrier — plus FederatedAverage for rounds that tolerate stragglers.
//
// A program launched by gdistrun, torchrun, srun, mpirun or a Kubernetes
// Indexed Job gets its group from gdist.InitFromEnv (package
// github.com/gdist/gdist), which reads the launcher's environment and
// builds the transport. Tests and programs that bring their own transport
// call New.
//
// # Usage
//
// Every rank runs:
//
//	pg, err := gdist.InitFromEnv(ctx)
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer pg.Close()
//	grad := make([]float32, n) // filled by backprop
//	if err := pg.AllReduce(ctx, grad, dist.Mean); err != nil {
//		log.Fatal(err) // a *dist.PeerError names the rank that failed
//	}
//
// Several ranks in one process, over the in-process transport:
//
//	ts, err := transport.NewLocal(4)
//	pg0, err := dist.New(ts[0]) // one group per rank, each used by its own goroutine
//
// Overlap communication with computation with the async variants; their
// ctx governs the collective as a sync call's does, Wait's ctx only bounds
// the wait:
//
//	w := pg.AllReduceAsync(ctx, bucket, dist.Sum) // bucket is in use until w is done
//	// ... compute the next bucket ...
//	if err := w.Wait(ctx); err != nil { ... }
//
// Options (WithTimeout, WithLogger, WithStallThreshold, WithDebug,
// WithHierarchical, WithTimeline, WithMetricsAddr, ...) are checked by New;
// an invalid one makes it fail with an error matching ErrInvalidArgument
// that names it. New also reads GDIST_DEBUG, GDIST_STALL_THRESHOLD and
// GDIST_HIERARCHICAL; options win over them, and a malformed value fails
// with ErrEnv.
//
// # Rules
//
// Every rank calls the same collectives in the same order, with the same
// length, dtype, reduce op and root. Collectives run one at a time in call
// order: a sync call issued after an async one waits for it. Results are
// bitwise identical on every rank (NaN payloads aside). Buffers stay the
// caller's: the group uses them only until the call returns (or the Work is
// done) and keeps no reference. Steady-state sync collectives under one
// context allocate nothing. Point-to-point tags must be below
// TagReservedBase.
//
// Each collective message carries a sequence number and a fingerprint of
// the call, so ranks that call different collectives, or the same one with
// other parameters, get a *DesyncError naming both sides instead of a hang.
// Two identical collectives look the same on the wire: a rank that skips
// one of two identical consecutive calls makes the ranks combine unrelated
// data without an error. GDIST_DEBUG=detail on every rank (or
// WithDebug(DebugDetail)) adds each collective's call site to its
// fingerprint, so ranks that reach an identical collective from different
// lines fail there naming both call sites; a skipped call of the same line
// (a loop that runs once more on one rank) stays invisible.
//
// # Failure
//
// The group is one failure domain for every layer above it (collectives,
// point-to-point calls, dist/ddp, dist/pipeline). The first failure — a
// lost or frozen peer, a desync, a cancelled context, a timeout, a protocol
// violation, or Abort — is recorded once as the group's cause, an
// *AbortError (culprit rank, reporting rank, operation, sequence number,
// FailureKind), sent to every peer, and every pending and later call fails
// with an error derived from it. The group cannot be resumed; restart the
// job (gdistrun -max-restarts). The errors to match:
//
//   - *PeerError{Rank, Op, Err}: the culprit rank; errors.Is with
//     ErrPeerLost (died, or its link broke), ErrPeerUnresponsive (froze),
//     ErrPeerClosed, ErrProtocol, or, on the ranks that learned of it,
//     ErrCanceled, ErrTimeout or ErrAborted.
//   - *DesyncError, naming both sides (and both call sites in detail mode).
//   - *TimeoutError on the rank whose collective ran out of time, naming the
//     ranks it waited for and where they were: "all_reduce #12 timed out
//     after 5s waiting for rank 2 (rank 2 last finished all_reduce #11,
//     4.9 s ago)".
//   - errors.As with *AbortError reads the cause from any of them; after
//     Close every call returns an error matching ErrClosed.
//
// A collective whose context has no deadline gets the group's default
// timeout (WithTimeout). One that waits longer than the stall threshold
// (WithStallThreshold, GDIST_STALL_THRESHOLD, default 60 s) logs a report
// once per threshold, naming the ranks it waits for.
//
// # Design
//
// All-reduce uses recursive doubling below DefaultSmallThreshold and a ring
// (reduce-scatter, then all-gather) above it; broadcast and reduce a
// binomial tree or a pipelined chain; large messages travel in segments of
// at most 4 MiB. When the transport reports which ranks share a host
// (transport.Topology) and the job spans hosts, AllReduce and Broadcast go
// hierarchical: within each host, across hosts once per host, within again.
// Every algorithm fixes its reduction order. Typed slices have a float32
// method and an F64 twin (AllReduce, AllReduceF64), because Go has no
// generic methods.
package dist
