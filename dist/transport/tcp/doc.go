// Package tcp implements transport.Transport over a full mesh of TCP
// connections, one per pair of ranks.
//
// # Setup
//
// New connects ranks whose listen addresses are all known in advance;
// Rendezvous lets rank 0 collect the other ranks' addresses on a master
// address (as torchrun's MASTER_ADDR/MASTER_PORT) and hand out the table.
// Dials are retried until the caller's context ends, so ranks may start in
// any order.
//
// Every connection is authenticated with a mutual HMAC-SHA256
// challenge-response over the job token (WithToken; both sides contribute a
// nonce from crypto/rand and the MACs cover both ranks, the world size and
// both sides' limits). A connection with a wrong token, a wrong world size, a
// rank out of range or already connected, garbage bytes or a stalled
// handshake is refused and logged, and the job goes on. Listeners default to
// loopback.
//
// # Data path
//
// Each link has one reader goroutine that parses frames (the header is
// checked against the maximum frame size before any payload memory is
// taken) into bounded per-(source, tag) queues; payload buffers come from a
// shared pool and go back to it through Release. Send writes the header and
// payload with one write (a copy for small payloads, one writev for large
// ones) under a per-link lock; steady-state Send, Recv and Release do not
// allocate.
//
// Flow control is credit based: a sender never has more unacknowledged bytes
// outstanding than the receiver's queue limit, so a full queue makes Send
// wait — under its context, without writing anything — instead of stalling
// the connection. The reader therefore never waits for queue space, and it
// never writes either (credits and heartbeats go out through a small
// per-link control goroutine), so it always keeps reading: heartbeats and
// goodbyes get through, and two ranks streaming at each other cannot
// deadlock. The wire format is in internal/wire/spec.md.
//
// # Failure
//
// A peer whose connection ends without a goodbye (crash, reset), that sends
// something the protocol forbids, or that stays silent past the heartbeat
// timeout is lost: like an aborted NCCL communicator, the transport then
// fails every pending and later call with a *transport.PeerError naming that
// rank and wrapping transport.ErrPeerLost. Its links to the other ranks stay
// up until Close, which says goodbye on them, and messages on reserved tags
// (transport.TagReservedBase and above: the process group's abort notices)
// still go out on them, so the survivors learn which rank was lost rather
// than blaming the rank that told them. A peer that calls Close is merely
// gone: what it sent is still delivered, then calls involving it return a
// *transport.PeerError wrapping transport.ErrPeerClosed.
//
// # Usage
//
//	ctx := context.Background()
//	tok := []byte(os.Getenv("GDIST_TOKEN"))
//	tr, err := tcp.Rendezvous(ctx, rank, world, "10.0.0.1:29500",
//		tcp.WithToken(tok), tcp.WithListenAddr("0.0.0.0:0"))
//	if err != nil {
//		return err
//	}
//	defer tr.Close()
//	pg, err := dist.New(tr)
package tcp
