// Package secagg is secure aggregation for federated learning: a server
// learns the weighted sum of the sampled clients' vectors and nothing about
// any one of them, even when clients drop out during the round. It follows
// Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving
// Machine Learning" (CCS 2017), with every client sharing with every other,
// as Flower's SecAgg+ does when its neighbourhood is the whole sample.
//
// The package does no I/O. A Client and a Server are state machines whose
// messages are byte slices addressed by client id; the caller carries them
// over whatever links it has, closes each stage at its own deadline, and
// treats a client that missed a stage as dropped. Experimental: the wire
// format may still change (it is versioned; see spec.md).
//
// # Usage
//
// Every party builds the same Config for the round; each client makes a
// Client, the leader a Server. Then four stages, each ending with the
// server's Advance:
//
//	cfg := secagg.Config{Round: r, Clients: sampled, Threshold: len(sampled)/2 + 1,
//		Dim: len(weights), Clip: 1, MaxWeight: 60000}
//
//	// client id                          // server
//	c, err := secagg.NewClient(cfg, id, nil)   s, err := secagg.NewServer(cfg)
//	msg, err := c.AdvertiseKeys()      →   err = s.Receive(id, msg)
//	                                       out, err := s.Advance()  // out[id]: a key list
//	msg, err = c.ShareKeys(out[id])    →   err = s.Receive(id, msg)
//	                                       out, err = s.Advance()   // out[id]: forwarded shares
//	msg, err = c.MaskInput32(out[id], x, samples)
//	                                   →   err = s.Receive(id, msg)
//	                                       out, err = s.Advance()   // out[id]: the survivor list
//	msg, err = c.Unmask(out[id])       →   err = s.Receive(id, msg)
//	                                       _, err = s.Advance()
//	                                       res, err := s.Sum()      // res.Mean(), res.Clients
//
// The server closes a stage when Pending is empty or at a deadline; a
// client that has not answered by then is out of the round, and its
// later messages are refused with ErrStage. Advance returns messages only
// for the clients still in the round.
//
// # Protocol
//
// Advertise keys: each client draws two X25519 key pairs (crypto/ecdh), one
// to encrypt shares and one to agree pairwise masks, and a 32-byte
// self-mask seed, and sends the public keys and a SHA-256 commitment to
// the seed. The server sends the list of advertisers (U1) to each.
//
// Share keys: each client splits its masking private key and its seed
// t-of-|U1| with Shamir's scheme over GF(2^61-1) (eight 32-bit chunks per
// 32-byte secret, coefficients from the client's randomness), encrypts each
// other client's pair of shares with AES-256-GCM under a key derived
// (HKDF-SHA256) from their X25519 agreement, and sends the ciphertexts to
// the server, which cannot read them. The server forwards to each client
// that shared (U2) the ciphertexts addressed to it.
//
// Masked input: each client in U2 sends
//
//	y = q(x, w) + PRG(seed) + Σ_{v in U2, v > u} PRG(s_uv) - Σ_{v in U2, v < u} PRG(s_uv)  (mod 2^Bits)
//
// where s_uv is the X25519 agreement of u and v's masking keys expanded by
// HKDF, and PRG is AES-256 in counter mode. The pairwise masks cancel in the
// sum over U2; the self mask keeps a late client's vector hidden even after
// its pairwise masks are removed (the paper's double masking). The server
// sends the list of clients whose input arrived (U3) to each of them.
//
// Unmasking: each client of U3 reveals, for each client of U2, the share
// of its seed if it is in U3, else the share of its masking key: never
// both for one client. From the first Threshold reveals the server
// reconstructs each seed of U3 (checked against its commitment) and each
// masking key of U2 \ U3 (checked against its public key), removes the self
// masks of U3 and the masks U3 shares with the dropped, and decodes the
// sum.
//
// # Dropouts
//
//   - A client that drops before sharing its keys takes no part: no other
//     client masks with it.
//   - A client that shares and drops before its input arrives is left out
//     of the sum; its pairwise masks are removed with its masking key,
//     rebuilt from the survivors' shares.
//   - A client whose input arrived and that drops before unmasking is in
//     the sum: its self mask is rebuilt from the survivors' shares.
//   - A stage that ends with fewer than Threshold clients fails the round
//     with a *TooFewError (ErrTooFewClients). So does an unmasking stage
//     with fewer than Threshold reveals.
//
// # Fixed point and weights
//
// Inputs are clipped to [-Clip, Clip], multiplied by weight/MaxWeight,
// rounded to the nearest multiple of 1/Scale and stored in two's complement
// in Z_{2^Bits}, where the masks cancel exactly. The weight (a sample
// count, 1 for a plain sum) travels as one more masked element rather than
// in the clear, so the server learns only the total weight of the clients
// in the sum, never a client's own sample count, and the total always
// matches the vectors it weighs, dropouts included. Dividing by MaxWeight
// before quantizing keeps every weighted value within [-Clip, Clip],
// whatever the weights. The sum of n = len(Clients) inputs cannot wrap
// around the ring when
//
//	n · round(Clip·Scale) <= 2^(Bits-1) - 1   and   n · MaxWeight <= 2^Bits - 1;
//
// NewServer and NewClient refuse a Config that breaks either, and Scale = 0
// picks the largest power of two that keeps the first. With the default 32
// bits, 20 clients and Clip 1, that is Scale = 2^26: a quantum of 1.5e-8.
// Each client adds a rounding error of at most MaxWeight/(2·Scale) to
// Result.Sum (Result.Mean divides by the total weight). Inputs already on
// the grid (multiples of MaxWeight/(w·Scale)) come out exactly.
//
// # Security
//
// The server learns the sum, the total weight, and which clients took part
// at each stage. Against a server that follows the protocol and up to
// Threshold-1 clients colluding with it, the other clients' inputs stay
// hidden: each masked vector is uniform over the ring (the tests check this
// statistically). The threshold must be a majority (2t > n): since a client
// reveals only one of its two shares for each other client, a server that
// lies to different clients about who dropped still cannot collect t shares
// of both secrets of one client. The paper's signatures and consistency
// check against an actively malicious server are not implemented, and
// nothing stops a client from sending any vector in the ring: clipping
// bounds honest clients only.
//
// # Errors
//
// A bad Config or argument is refused with ErrInvalidArgument. A message
// the server refuses (Receive) leaves the round as it was: ErrStage (late or
// early), ErrRound, ErrConfig, ErrDuplicate, ErrMalformed (ErrVersion),
// ErrProtocol. A client refuses a server message with the same errors or
// ErrAuth (an altered share) and leaves the round. Advance fails the round
// with ErrTooFewClients or ErrBadShare, for good.
//
// # Costs
//
// Per client and round: 2(n-1) X25519 agreements, and n-1 pairwise masks
// and one self mask of Dim+1 elements each (AES-CTR). Bytes up: the masked
// input, (Dim+1)·Bits/8, plus 96 for the advert, 4 + 148 a peer for the
// shares and 4 + 69 a sharer for the reveal; bytes down: 4 + 100 an
// advertiser for the key list, 4 + 148 a peer for the forwarded shares and
// 4 + 4 a survivor; 32 bytes of header a message. The server keeps one
// running sum and regenerates one mask per contributor and per (dropped,
// contributor) pair. BENCHMARKS.md
// has measured figures.
package secagg
