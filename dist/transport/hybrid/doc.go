// Package hybrid implements transport.Transport over shared memory between
// the ranks of one host and TCP between hosts, behind one Transport: the
// transport gdist.InitFromEnv uses.
//
// Experimental: the setup messages and the options may still change.
//
// # Setup
//
// Rendezvous first runs tcp.Rendezvous: every rank gets an authenticated
// TCP link to every other. Over those links each rank then sends every
// other a hello: its mode (Auto, TCP or SHM; the ranks must agree), whether
// its build has package shm (Linux), and its host identity — by default
// the boot id, host name and network namespace (DefaultHostID), so that
// ranks in different network namespaces of one machine, which cannot reach
// each other's abstract Unix sockets, count as different hosts;
// WithHostID (GDIST_HOST_ID) replaces it to simulate hosts. Rank 0's hello
// also carries a fresh random 32-byte setup nonce. Hosts are numbered in the
// order of their lowest rank (Hosts, the transport.Topology interface). A
// peer whose hello does not come within WithSetupTimeout (one that does
// not speak this protocol) fails the setup with a *transport.PeerError
// naming it, matching ErrProtocol.
//
// The ranks of each host with several ranks then set up package shm among
// exactly themselves (shm.RendezvousPeers), under an abstract socket name
// derived from the nonce and the host index, authenticated with the job
// token (WithToken) or, without one, with the nonce. Each tells
// the others of its host over TCP whether its setup succeeded; a rank that
// hears of a failure stops its own setup, so all of them agree and none
// waits for a peer that gave up. In mode Auto a host where shared memory
// failed (or took longer than WithSetupTimeout) uses TCP between its ranks
// and logs a warning; in mode SHM every rank of that host fails with an
// *SHMError naming the rank that failed. In mode TCP no shared memory is
// set up at all.
//
// The setup messages use tags 0xFFFFFF00 (hello) and 0xFFFFFF01 (status)
// of the TCP transport and are all received before Rendezvous returns.
// A hello is 48 bytes — "gdsthyb1", mode, flags (bit 0: has shm), two zero
// bytes, the host identity's length (uint32, little-endian), the 32-byte
// nonce (zero except from rank 0) — followed by the host identity. A
// status is one byte (0 ok, 1 failed, 2 stopped because another failed),
// followed for a failure by up to 512 bytes of its error text, which is
// only logged or reported, never parsed.
//
// Over runs the same setup over a TCP transport the caller already made, such
// as a link of tcp.Listen and tcp.Dial (package dist/fed moves a client's
// link to the leader to shared memory this way when both run on one host).
//
// # Routes
//
// Each peer is reached through exactly one transport, fixed at setup
// (Via reports it): shared memory for the peers of this host when it is
// up, TCP for the others, and TCP's loopback queues for this rank itself.
// A peer's messages all take one route, so messages with the same (source,
// tag) arrive in send order, and everything the transport.Transport
// contract says (flow control, RecvInto, PeerError naming the peer, ...)
// holds per route as the underlying transport implements it. Close closes
// both; a lost peer fails the calls involving it with the
// *transport.PeerError of its route. The TCP links between ranks of one
// host stay up, idle but for their heartbeats.
//
// # Usage
//
//	ctx := context.Background()
//	tok := []byte(os.Getenv("GDIST_TOKEN"))
//	tr, err := hybrid.Rendezvous(ctx, rank, world, "10.0.0.1:29500", hybrid.WithToken(tok))
//	if err != nil {
//		return err
//	}
//	defer tr.Close()
//	fmt.Println(tr.Via(0), tr.Hosts()) // "shm [0 0 1 1]", say
//	pg, err := dist.New(tr)
//
// gdist.InitFromEnv does this from the environment, with GDIST_TRANSPORT
// (auto, tcp or shm) choosing the mode.
package hybrid
