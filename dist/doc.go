// Package dist is gdist's communication layer: a ProcessGroup (a rank, a
// group size and a transport) with tagged point-to-point messages and
// collectives on typed Buffers — all-reduce, all-gather (even and uneven),
// reduce-scatter, all-to-all (even and uneven), broadcast, reduce, gather,
// scatter, barrier — subgroups and meshes of ranks, and FederatedAverage
// for rounds that tolerate stragglers.
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
//	if err := pg.AllReduce(ctx, dist.F32(grad), dist.Mean); err != nil {
//		log.Fatal(err) // a *dist.PeerError names the rank that failed
//	}
//
// A Buffer is a typed view of the caller's slice (F32, F64, F16, or Typed
// for raw little-endian elements such as BFloat16): one method per
// collective serves every element type, and the elements travel in their
// own width.
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
//	w := pg.AllReduceAsync(ctx, dist.F32(bucket), dist.Sum) // bucket is in use until w is done
//	// ... compute the next bucket ...
//	if err := w.Wait(ctx); err != nil { ... }
//
// Subgroups for data, pipeline and tensor parallelism:
//
//	mesh, err := dist.NewMesh(ctx, pg, dist.Dim{Name: "dp", Size: 2}, dist.Dim{Name: "pp", Size: 2})
//	dp := mesh.Group("dp") // also pg.NewGroup(ctx, ranks) and pg.Split(ctx, color, key)
//	err = dp.AllReduce(ctx, dist.F32(grad), dist.Mean)
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
// Every member of a group calls the same collectives in the same order,
// with the same length, dtype, reduce op and root. A group's collectives
// run one at a time in call order (a sync call issued after an async one
// waits for it); different groups run theirs at the same time. Groups are
// created (NewGroup, Split, NewMesh) by every member of the parent, in the
// same order on every rank, from one goroutine per rank. Results are
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
// The job is one failure domain for every group and every layer above them
// (collectives, point-to-point calls, dist/ddp, dist/pipeline). The first
// failure — a
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
//   - *MemberError around any of them on a subgroup: the culprit's rank in
//     the job (Rank) and as a member of the subgroup (Member).
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
// All-reduce uses recursive doubling below DefaultSmallThreshold
// (DefaultPairThreshold between 2 members) and a ring (reduce-scatter,
// then all-gather) above it. Between 2 members that share memory
// (transport.SharedMemory) it interleaves the reduce-scatter and the
// all-gather in 256 KiB segments from DefaultSmallThreshold up, so that
// each combined segment goes back while it is in the cache; it sends them
// plainly or streamed past the caches (transport.StreamSender), whichever
// it measures faster for the size (the first calls of each size try both,
// and every 32nd the way not chosen: which is faster depends on whether
// the two processes' cores share a cache, which can change as they run).
// Broadcast and reduce use a
// binomial tree or a pipelined chain; large messages travel in segments of
// at most 4 MiB. When the transport reports which ranks share a host
// (transport.Topology) and the job spans hosts, AllReduce and Broadcast go
// hierarchical: within each host, across hosts once per host, within again.
// Every algorithm fixes its reduction order. The algorithms are functions
// of package dist/internal/coll over a narrow exchange (send a segment to a
// member, receive or combine one from a member), with no access to a
// group's state, tested against naive references on a simulated network
// that reorders deliveries; a ProcessGroup is the front that validates,
// sequences and fingerprints the calls, and the job's shared domain holds
// the transport and the failure state. A subgroup has its own sequence
// numbers and a block of the reserved tags, so its messages never mix with
// another group's.
package dist
