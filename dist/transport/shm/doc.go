// Package shm implements transport.Transport over shared memory between
// the ranks of one host (Linux only): ranks exchange messages through
// memory both processes map, not through the kernel's network stack.
//
// Experimental: the layout (spec.md) and the options may still change.
//
// # Setup
//
// Each pair of ranks has a Unix socket connection. Rendezvous makes them:
// every rank but the last listens on SocketName(name, rank) and dials the
// ranks below it, retrying until its context ends; prefer an abstract
// name ("@..."), which never touches the file system. New takes
// connections the caller already has, for any subset of the ranks — the
// building block of a hybrid transport that uses shared memory for the
// peers on its host and TCP for the others (ranks without a connection
// fail with ErrNoLink; HasLink tells them apart).
//
// Over each connection the two ranks first check that the other process
// runs as the same user (SO_PEERCRED) and authenticate with a mutual
// HMAC-SHA256 challenge-response over the job token (WithToken), as package
// tcp does. Only then does the lower rank create the pair's memory: an
// anonymous memfd (no name in /dev/shm or anywhere else), mode 0600, its
// size sealed so that neither side can shrink it under the other's
// mapping, sent over the socket with SCM_RIGHTS. The other rank checks
// the seals, size, owner and mode, maps it and both close their file
// descriptors: from then on the memory exists only in the two mappings and
// disappears with the last of them, whether the processes exit or are
// killed. Rendezvous closes its listener once every link is up.
//
// # Data path
//
// The memory holds one single-producer/single-consumer byte ring per
// direction, each with a control block whose producer-written,
// consumer-written and doorbell words sit on separate cache lines. A
// message is a 32-byte record header (tag, the opaque transport.Header,
// length) followed by its payload, streamed through the ring in chunks
// while the receiver consumes them, so a message of any size passes a ring
// of any size; the first 256 KiB of a record are published every 32 KiB,
// so that the receiver copies while the sender writes. A header's first
// 8 bytes, stored last, seal it with the record's full position (and mark
// a record of up to 32 KiB written at once as whole): a waiting receiver
// polls that word, on the cache line the record arrives in, rather than
// the ring's head. A sender that finds the ring drained before a record
// of 64 KiB or more goes on at the start of the ring's next lap (a lap
// mark tells the receiver), so that messages that each find the ring
// empty — the segments of an all-reduce, a pipeline's activations — reuse
// memory both processes' caches still hold instead of cycling through the
// whole ring. Smaller records do the same once the sender is 256 KiB into
// a lap (it looks every 64 KiB until it finds the ring drained): round
// trips and small all-reduces keep to the first few hundred KiB of the
// ring.
// A receive that has to wait (Recv, RecvInto, RecvReduce) first
// polls the ring itself and delivers what arrives — into its own buffer
// (straight from the ring when nothing for its source and tag is queued),
// or to another receive or the queue — on its own goroutine, with no
// hand-off. When no receive
// polls, the receiving rank's reader goroutine for that peer delivers:
// when a RecvInto is already waiting on the message's (source, tag) it
// copies the payload from the ring straight into the caller's buffer;
// otherwise into a pooled buffer queued for Recv. The two take turns under
// one lock, and the reader keeps out of the way while receivers poll.
// RecvReduce (transport.ReduceReceiver, which dist's reducing collectives
// use) goes further: the receiver combines
// the payload into the caller's buffer where it lies in the ring, a piece at
// a time as it arrives, without copying it anywhere (records are padded to
// 64 bytes, so that each starts on a cache line of its own and payloads are
// aligned for the typed kernels). With 8 MiB
// rings (WithRingSize) dist's 4 MiB segments fit whole, so a sender never
// waits for its peer's receive and the receive is posted by the time its
// segment is read; between 2 ranks dist's all-reduce sends 256 KiB
// segments, which the peer combines out of the ring as they arrive. Steady-state Send, Recv,
// RecvInto, RecvReduce and Release do not allocate.
//
// SendStream (transport.StreamSender) is Send with the payload written
// into the ring by non-temporal stores (internal/vec.CopyStream on amd64
// with AVX2), which go to memory past the sender's caches. Where the
// receiver's core shares no cache with the sender's, a plain copy first
// fetches each line of the ring from the receiver's cache, which read it
// last; streaming skips that. Where the two share a cache, Send is faster.
// dist's all-reduce between 2 members measures both and takes the faster.
//
// Each pair's memory is two rings and their control blocks, 16 MiB with
// the default ring size (n ranks on a host: n(n-1)/2 pairs, at most 448 MiB
// for 8). A ring's pages are allocated and mapped on both sides in one go
// the first time a record of 16 KiB or more goes through it (madvise
// MADV_POPULATE_WRITE and _READ), and until then 256 KiB at a time, ahead
// of where each side writes or reads: left to first use, every fresh page
// cost the sender and the receiver a page fault each, which made the first
// lap (the first 32 all-reduces of 256 KiB) three to six times slower than
// the rest. Rings that only ever carry small messages (the pairs a ring all-reduce
// does not use) stay almost unallocated.
//
// With WithSingleCopy (off by default: slower than streaming through the
// ring on the machine of BENCHMARKS.md), messages from the given size take
// one copy instead of two: the ring carries only a remote record with the
// address of the sender's buffer, which the receiver reads with
// process_vm_readv(2) straight into the caller's buffer (or a pooled one;
// for RecvReduce, through a small buffer that stays in cache) while Send
// waits for its acknowledgement. A link uses this only after the receiver
// has read a probe word of the sender's memory that way (the kernel allows
// it between processes of one user unless ptrace is restricted); otherwise
// large messages stream through the ring.
//
// Waiting polls the ring briefly (WithSpin), first a receiver waiting for
// a message, then the reader; each poll also yields the CPU once that
// stops paying — when the reply comes right after a yield (both ranks
// share a CPU, or the peer was descheduled by other load) the spin before
// yielding halves, when it comes while polling (the peer runs on another
// CPU) it doubles. Then the reader parks on a futex in the shared memory;
// the other side makes the futex system call only when someone is parked.
// A wait does not park while other goroutines of its process run between
// its polls: a goroutine in the futex call keeps its P until the runtime
// takes it back, up to 10 ms later, and with GOMAXPROCS=1 a runnable
// goroutine would wait that long. The reader polls longer than the spin
// while its waits keep a steady rhythm of a few milliseconds (a pipeline
// stage waiting for each micro-batch): about twice its recent waits, up to
// 4 ms, since waking a parked process costs tens of microseconds; a longer
// wait halves that, and a wait that has parked polls only the spin again.
// A sender reads its peer's consumer position and returned credit only
// when those it saw last leave too little room (and every 64 sends), so
// the consumer's updates of them stay in its own cache. An idle rank
// blocked in a receive uses almost no CPU (its heartbeat ticks).
//
// Flow control is credit based, as in package tcp: a sender never has more
// unconsumed bytes outstanding than the receiver's queue limit, so the
// reader never waits for queue space and always drains its ring, and two
// ranks streaming at each other cannot deadlock.
//
// # Failure
//
// A peer whose process ends without Close is noticed at once: the kernel
// closes its socket. A peer that stops (a frozen or stopped process) is
// noticed when its heartbeat counter in the shared memory has not moved
// for the heartbeat timeout (WithHeartbeat, default
// transport.DefaultHeartbeatTimeout, 10 s, as over TCP). Either way it is
// lost: pending and later calls involving it fail with a
// *transport.PeerError naming it and wrapping transport.ErrPeerLost
// (transport.ErrPeerUnresponsive for a frozen one), including a receive
// whose message it was in the middle of writing. A peer that calls Close
// is merely gone: what it wrote is still delivered (it stays in the
// mapping), then calls involving it return a *transport.PeerError
// wrapping transport.ErrPeerClosed. Links to other peers are not affected.
//
// Everything read from the shared memory is untrusted: indices are
// checked (monotone, within a ring of each other), lengths against the
// maximum frame before anything is allocated, and every access is masked
// to the ring, so a buggy or hostile peer scribbling on the memory makes
// this rank fail the link with a *transport.PeerError naming it and
// wrapping ErrProtocol — never crash or read out of bounds. (It can still
// corrupt payloads it sends, or stall the link, as any peer can.)
//
// # Usage
//
//	ctx := context.Background()
//	tok := []byte(os.Getenv("GDIST_TOKEN"))
//	name := "@gdist-" + jobID // unique to the job, the same on every rank
//	tr, err := shm.Rendezvous(ctx, rank, world, name, shm.WithToken(tok))
//	if err != nil {
//		return err
//	}
//	defer tr.Close()
//	pg, err := dist.New(tr)
package shm
