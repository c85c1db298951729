// Package transport defines how gdist ranks exchange bytes: the Transport
// interface, the errors every transport shares, and Local, an in-process
// transport for tests and examples. Packages tcp (a TCP full mesh), shm
// (shared memory between the ranks of a host) and hybrid (shm within a
// host, TCP across) implement the interface; package transporttest is the
// conformance suite every one of them passes.
//
// A Transport moves tagged bytes and nothing else: a message is a tag, a
// 16-byte Header the transport carries without looking at it, and a
// payload. What tags and headers mean is the layer above's business (dist
// puts a collective's sequence number and fingerprint in the header, and
// reserves a range of tags for itself).
//
// Messages are matched on (source rank, tag) and delivered in send order
// per (source, tag). Receive queues are bounded in bytes: a full queue makes
// the sender wait (back-pressure), it never drops a message. At least one
// message is always admitted to an empty queue, so a single message larger
// than the bound still goes through. A queue exists only while it holds
// messages or has a waiting receiver, so a job may use any number of
// distinct tags without the transport's memory growing.
//
// Two ways to receive: Recv returns a payload the caller owns (and may
// hand back with Release, which returns it to the transport's buffer
// pool); RecvInto receives into the caller's buffer. A RecvInto that waits
// before its message arrives is posted: the sender (Local) or the peer's
// socket reader (tcp) writes the payload straight into it, with no
// intermediate buffer.
//
// A peer that is lost (or closes) fails only the calls involving it, with a
// *PeerError naming it; the other links keep working.
//
// # Usage
//
//	ts, err := transport.NewLocal(2) // two ranks in one process
//	if err != nil { ... }
//	defer ts[0].Close()
//	defer ts[1].Close()
//	go ts[0].Send(ctx, 1, 7, transport.Header{}, []byte("hi"))
//	buf := make([]byte, 64)
//	_, n, err := ts[1].RecvInto(ctx, 0, 7, buf) // buf[:n] == "hi"
//
// Most programs never use a Transport directly: they hand one to dist.New.
package transport
