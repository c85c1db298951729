package fed

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/gdist/gdist/dist/fed/secagg"
)

// SecureAggregation makes the leader learn only the weighted sum of the
// sampled clients' updates, never one client's (package secagg: pairwise
// additive masks from X25519 agreements, Shamir t-of-n shares that recover
// the masks of a client that drops after masking; Bonawitz et al. 2017, as
// in Flower's SecAgg+ with every client in every other's neighbourhood).
// Each round runs the four stages of secagg over the clients' links: the
// key exchange while the clients train, their masked updates when they
// report, the unmasking after the round's last update or its deadline.
//
// Updates (new weights minus the model) are clipped to [-Clip, Clip] and
// quantized to fixed point (see secagg's "Fixed point and weights"); the
// sample count weighting each update travels masked too, so the leader
// learns the total, not each client's. A client whose update arrived and
// that drops before unmasking is still in the sum; one that drops before
// is left out; a round left with fewer clients than the threshold fails
// (Round returns an error matching secagg.ErrTooFewClients, the model is
// unchanged). A round needs at least two sampled clients.
type SecureAggregation struct {
	// Clip bounds each value of an update; 0 means 1.
	Clip float64
	// MaxSamples is the largest sample count a client may report (the
	// weight's bound: secagg's MaxWeight); 0 means 65536. Report refuses
	// a larger one.
	MaxSamples uint64
	// Bits is the width of the ring the masked values live in, 32 or 64;
	// 0 means 32. 64 costs twice the bytes and allows a finer quantum.
	Bits int
	// Threshold returns the number of shares that rebuild a client's
	// secrets in a round of n sampled clients, which is also the fewest
	// clients that must remain; nil means a majority, n/2+1 (the least
	// secagg allows).
	Threshold func(n int) int
	// StageTimeout bounds the key exchange and the unmasking (the masked
	// updates are bounded by the round timeout); 0 means 30 s.
	StageTimeout time.Duration
}

// WithSecureAggregation turns secure aggregation on (see
// SecureAggregation). Clients need no option: each round's configuration
// comes with its task. (Lead.)
func WithSecureAggregation(sa SecureAggregation) Option {
	return func(c *config) error {
		switch {
		case sa.Clip < 0 || math.IsInf(sa.Clip, 0) || math.IsNaN(sa.Clip):
			return fmt.Errorf("fed: %w: secure aggregation clip %v", ErrInvalidArgument, sa.Clip)
		case sa.Bits != 0 && sa.Bits != 32 && sa.Bits != 64:
			return fmt.Errorf("fed: %w: secure aggregation on %d bits (32 or 64)", ErrInvalidArgument, sa.Bits)
		case sa.StageTimeout < 0:
			return fmt.Errorf("fed: %w: secure aggregation stage timeout %v", ErrInvalidArgument, sa.StageTimeout)
		}
		if sa.Clip == 0 {
			sa.Clip = 1
		}
		if sa.MaxSamples == 0 {
			sa.MaxSamples = 1 << 16
		}
		if sa.StageTimeout == 0 {
			sa.StageTimeout = 30 * time.Second
		}
		c.secure = &sa
		c.only("WithSecureAggregation", roleLeader)
		return nil
	}
}

// roundConfig is round k's secagg configuration for the sampled clients.
func (sa *SecureAggregation) roundConfig(k uint64, sampled []int, dim int) secagg.Config {
	t := len(sampled)/2 + 1
	if sa.Threshold != nil {
		t = sa.Threshold(len(sampled))
	}
	return secagg.Config{Round: k, Clients: sampled, Threshold: t, Dim: dim, Clip: sa.Clip, Bits: sa.Bits, MaxWeight: sa.MaxSamples}
}

// A round's secagg configuration travels to each sampled client (Secure,
// stage 0) as: round u64, threshold u32, dim u32, clip f64, scale f64,
// bits u32, max weight u64, n u32, then n client ids u32.
const secConfigHeader = 8 + 4 + 4 + 8 + 8 + 4 + 8 + 4

func marshalSecConfig(c secagg.Config) []byte {
	b := make([]byte, secConfigHeader+4*len(c.Clients))
	binary.LittleEndian.PutUint64(b, c.Round)
	binary.LittleEndian.PutUint32(b[8:], uint32(c.Threshold))
	binary.LittleEndian.PutUint32(b[12:], uint32(c.Dim))
	binary.LittleEndian.PutUint64(b[16:], math.Float64bits(c.Clip))
	binary.LittleEndian.PutUint64(b[24:], math.Float64bits(c.Scale))
	binary.LittleEndian.PutUint32(b[32:], uint32(c.Bits))
	binary.LittleEndian.PutUint64(b[36:], c.MaxWeight)
	binary.LittleEndian.PutUint32(b[44:], uint32(len(c.Clients)))
	for i, id := range c.Clients {
		binary.LittleEndian.PutUint32(b[secConfigHeader+4*i:], uint32(id))
	}
	return b
}

func parseSecConfig(b []byte) (secagg.Config, error) {
	if len(b) < secConfigHeader {
		return secagg.Config{}, fmt.Errorf("%w: a secure aggregation configuration of %d bytes", ErrProtocol, len(b))
	}
	n := binary.LittleEndian.Uint32(b[44:])
	if uint64(len(b)) != secConfigHeader+4*uint64(n) {
		return secagg.Config{}, fmt.Errorf("%w: a secure aggregation configuration of %d bytes for %d clients", ErrProtocol, len(b), n)
	}
	c := secagg.Config{
		Round:     binary.LittleEndian.Uint64(b),
		Threshold: int(binary.LittleEndian.Uint32(b[8:])),
		Dim:       int(binary.LittleEndian.Uint32(b[12:])),
		Clip:      math.Float64frombits(binary.LittleEndian.Uint64(b[16:])),
		Scale:     math.Float64frombits(binary.LittleEndian.Uint64(b[24:])),
		Bits:      int(binary.LittleEndian.Uint32(b[32:])),
		MaxWeight: binary.LittleEndian.Uint64(b[36:]),
		Clients:   make([]int, n),
	}
	for i := range c.Clients {
		c.Clients[i] = int(binary.LittleEndian.Uint32(b[secConfigHeader+4*i:]))
	}
	return c, nil
}

// secClient is a client's part of one secure round.
type secClient struct {
	round     uint64
	sa        *secagg.Client // nil until the configuration came
	forwarded []byte         // the shares for this client (stage 2), once they came
	ready     chan struct{}  // closed when forwarded came, or the round is over for this client
	err       error          // why the client is out of the round, if it is
	done      bool           // ready is closed
}

func newSecClient(round uint64) *secClient {
	return &secClient{round: round, ready: make(chan struct{})}
}

// end closes ready with err (nil: the shares came).
func (s *secClient) end(err error) {
	if s.done {
		return
	}
	s.done, s.err = true, err
	close(s.ready)
}
