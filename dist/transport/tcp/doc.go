// Package tcp implements transport.Transport over a full mesh of TCP
// connections, one per pair of ranks.
//
// # Setup
//
// New connects ranks whose listen addresses are all known in advance;
// Rendezvous lets rank 0 collect the other ranks' addresses on a master
// address (as torchrun's MASTER_ADDR/MASTER_PORT) and hand out the table.
// Dials are retried until the caller's context ends, so ranks may start in
// any order. Options are validated by New and Rendezvous, which return an
// error matching ErrInvalidArgument for a bad one; New takes its listener from the
// caller and refuses WithListenAddr.
//
// Every connection is authenticated with a mutual HMAC-SHA256
// challenge-response over the job token (WithToken, at least 128 bits; both
// sides contribute a nonce from crypto/rand and the MACs cover both ranks,
// the world size and both sides' limits). The connecting side proves the
// token first, and the accepting side sends nothing that depends on the
// token before that proof checks out, so connecting teaches an outsider
// nothing to test a guess against offline. A connection with a wrong token,
// a wrong world size, a rank out of range or already connected, garbage
// bytes or a stalled handshake is refused and logged at once on the
// accepting rank, with the peer's address and the reason in words
// ("authentication failed: wrong GDIST_TOKEN?", "world size 3, this job
// has 2"); a burst of five lines, then one per 10 s, each saying how many
// were left out. An unauthenticated connection holds one of 64 handshake
// slots for at most 3 s (WithHandshakeTimeout), and when all are taken the
// oldest is dropped, so a flood cannot keep a rank out. The setup has a
// deadline (WithInitTimeout, default 5 minutes) after which every waiting
// rank fails with an *InitTimeoutError naming the ranks that never joined
// and the connections it refused. Listeners default to loopback.
//
// # TLS
//
// With WithTLS, every connection runs a TLS 1.3 handshake (crypto/tls) with
// mutual authentication before the token's: each side presents a
// certificate the other's CA pool accepts, then proves the token inside
// TLS, and everything after travels encrypted and integrity-protected.
// A dialing rank checks its peer's certificate against the host it dials
// (or the configuration's ServerName). The accepting rank refuses and logs
// a connection whose TLS handshake fails ("TLS handshake failed: tls:
// failed to verify certificate: ..."), like any other refusal; the dialing
// rank fails at once with an error matching ErrTLS. LoadTLS reads the PEM
// files (gdist.InitFromEnv's GDIST_TLS_CERT, GDIST_TLS_KEY, GDIST_TLS_CA).
//
// # Links
//
// Listen and Dial make links of a star instead of a mesh: the listener is
// rank 0, each dialer proves, with the token, its rank in a star of world
// ranks, and each link becomes a Transport of two ranks of its own (the
// listener 0, the dialer 1). A link that breaks fails only its own
// Transport, and the same rank may dial again: package dist/fed builds its
// federation on them. A lost link is logged at debug level only: the layer
// above reports it.
//
// # Data path
//
// Each link has one reader goroutine that parses frames (the header is
// checked against the maximum frame size before any payload memory is
// taken). When a RecvInto is already waiting on the frame's (source, tag),
// nothing is queued there and the payload is at most 1 MiB, the reader
// reads the payload from the socket straight into the caller's buffer (a
// posted receive, as in MPI); otherwise it reads it into a buffer from the
// transport's pool and queues
// it in a bounded per-(source, tag) queue, from which Recv hands it out
// (Release takes it back) and RecvInto copies it. Send writes the header
// and payload with one write (a copy for small payloads, one writev for
// large ones) under a per-link lock; steady-state Send, Recv, RecvInto and
// Release do not allocate.
//
// A RecvInto whose buffer the reader has started to fill returns only once
// the reader is done with it, even if its context ends meanwhile: it then
// returns the message. The wait is bounded by the peer's sending and, if
// the peer stalls or dies, by the heartbeat timeout.
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
// timeout is lost: pending and later calls involving it (sends to it,
// receives from it) fail with a *transport.PeerError naming that rank and
// wrapping transport.ErrPeerLost, and what it sent that was not received
// yet is dropped. A silent peer (a stopped process, a machine gone, a cut
// link) is reported as transport.ErrPeerUnresponsive and ErrHeartbeatTimeout:
// every link sends a heartbeat each interval (default 1 s) and the peer
// echoes it (WithHeartbeatObserver sees the round trips); after 10 s
// (WithHeartbeat; transport.DefaultHeartbeatTimeout, the same on every
// transport) without a byte from a peer, it is named, within about 10.25 s
// of the last bytes it sent. A pause shorter than the timeout by
// transport.PauseMargin is never taken for a death. The heartbeat goroutines do no work but post a
// frame, and every read that returns bytes counts as liveness, also in the
// middle of a long frame: a rank computing with GOMAXPROCS=1 keeps
// answering (TestBusyComputeNotDeclaredDead: 10 s of Gorgonia matrix
// products), and a large frame crossing a slow link does not make its
// sender look dead. The links to the other ranks are not affected: the layer
// above decides what a lost peer means for the job (dist aborts the group
// and tells the survivors why, over those links). A peer that calls Close
// is merely gone: what it sent is still delivered, then calls involving it
// return a *transport.PeerError wrapping transport.ErrPeerClosed.
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
