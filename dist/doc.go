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
// Overlap communication with computation with the async variants:
//
//	w := g.AllReduceAsync(bucket, dist.Sum) // bucket is in use until w is done
//	// ... compute the next bucket ...
//	if err := w.Wait(ctx); err != nil { ... }
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
// group's default timeout (WithTimeout).
//
// Buffers passed to collectives stay the caller's: the group reads and writes
// them only until the call returns (or, for async calls, until the Work is
// done) and keeps no reference. Steady-state collectives allocate nothing on
// the in-process and TCP transports. Watching a cancellable context costs two
// small allocations, once per context: a loop of collectives under one
// context allocates nothing after the first call.
//
// # Choosing algorithms
//
// All-reduce uses recursive doubling below DefaultSmallThreshold (128 KiB,
// measured: see its documentation) and a ring — reduce-scatter, then
// all-gather, each rank moving 2(n-1)/n of the vector — above it. Broadcast
// and reduce use a binomial tree below the threshold and a pipelined chain
// above it; all-gather and reduce-scatter always use the ring. Large messages
// travel in 1 MiB segments. Every algorithm fixes its reduction order, so all
// ranks get the same bits; it may differ from a sequential sum in the last
// place (F16 and BF16 round at every combination).
package dist
