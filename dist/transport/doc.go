// Package transport defines how gdist ranks exchange bytes: the Transport
// interface, the errors every transport shares, and Local, an in-process
// transport for tests and examples. Package tcp implements the interface
// over a TCP full mesh; package transporttest is the conformance suite both
// pass.
//
// A Transport delivers tagged messages matched on (source rank, tag), in send
// order per (source, tag). Receive queues are bounded in bytes: a full queue
// makes the sender wait (back-pressure), it never drops a message. At least one
// message is always admitted to an empty queue, so a single message larger
// than the bound still goes through.
//
// # Usage
//
//	ts := transport.NewLocal(2)      // two ranks in one process
//	defer ts[0].Close()
//	defer ts[1].Close()
//	go ts[0].Send(ctx, 1, 7, transport.Meta{}, []byte("hi"))
//	m, err := ts[1].Recv(ctx, 0, 7) // m.Payload == "hi"
//
// Most programs never use a Transport directly: they hand one to dist.New.
package transport
