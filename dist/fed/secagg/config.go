package secagg

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"slices"
)

// Limits of a Config.
const (
	// MaxClients bounds len(Config.Clients). Every client shares with
	// every other, so a round costs O(n²) ciphertexts at the server.
	MaxClients = 1024
	// MaxID bounds a client id (ids travel as 32-bit fields).
	MaxID = math.MaxInt32
	// MaxDim bounds Config.Dim, so that a masked vector stays below 2 GiB.
	MaxDim = 1<<28 - 1
)

// Config is what the server and every client of one round agree on. Build
// it identically everywhere: each message carries a fingerprint of it and
// is refused (ErrConfig) by a party with another.
type Config struct {
	// Round numbers the round. Each round needs a new Client and Server;
	// a message of another round is refused with ErrRound.
	Round uint64
	// Clients are the ids of the clients sampled for the round: distinct,
	// in [0, MaxID], at least 2 and at most MaxClients. The order does not
	// matter; the configuration keeps a sorted copy.
	Clients []int
	// Threshold t is the number of shares that reconstruct a client's
	// secrets, and the least number of clients that must remain at every
	// stage. 2 <= t <= len(Clients), and 2t > len(Clients): a client
	// reveals, for each other client, either the share of its self-mask
	// seed or the share of its secret key, never both, so with a majority
	// threshold no server, even one that tells clients different stories
	// about who dropped, can gather t shares of both secrets of one client.
	Threshold int
	// Dim is the length of every client's input vector, in [1, MaxDim].
	Dim int
	// Clip bounds the inputs: each value is clipped to [-Clip, Clip]
	// before quantization. It must be positive and finite.
	Clip float64
	// Scale is the fixed-point scale: a value v becomes the integer
	// round(v·Scale), so the quantum is 1/Scale. Zero picks the largest
	// power of two that the overflow bound allows (see Bits). A Scale
	// that could overflow is refused.
	Scale float64
	// Bits is the width k of the ring Z_{2^k} the masked vectors live in:
	// 32 or 64; zero means 32. It is also the width of a value on the
	// wire. The sum of n clients cannot wrap as long as
	//
	//	n · round(Clip·Scale) <= 2^(k-1) - 1   and   n · MaxWeight <= 2^k - 1
	//
	// where n = len(Clients); New refuses a Config that breaks either.
	Bits int
	// MaxWeight is the largest weight a client may give its input (a
	// sample count, for FedAvg); zero means 1, an unweighted sum. A
	// client with weight w contributes w·x/MaxWeight, quantized, and w
	// itself as one more masked element, so the server learns only the
	// total weight and the weighted sum.
	MaxWeight uint64
}

// params is a validated Config with its defaults filled in and the values
// derived from it.
type params struct {
	Config
	n     int
	index map[int]int // client id -> position in Clients
	width int         // bytes per ring element on the wire
	mask  uint64      // 2^k - 1
	q     int64       // round(Clip·Scale): the largest quantized magnitude
	fp    uint64      // configuration fingerprint
}

// resolve validates c and fills in its defaults.
func resolve(c Config) (*params, error) {
	p := &params{Config: c}
	p.Clients = slices.Clone(c.Clients)
	slices.Sort(p.Clients)
	p.n = len(p.Clients)
	if p.n < 2 || p.n > MaxClients {
		return nil, fmt.Errorf("secagg: %w: %d clients: want between 2 and %d", ErrInvalidArgument, p.n, MaxClients)
	}
	p.index = make(map[int]int, p.n)
	for i, id := range p.Clients {
		if id < 0 || id > MaxID {
			return nil, fmt.Errorf("secagg: %w: client id %d: want an id in [0, %d]", ErrInvalidArgument, id, MaxID)
		}
		if i > 0 && p.Clients[i-1] == id {
			return nil, fmt.Errorf("secagg: %w: client id %d listed twice", ErrInvalidArgument, id)
		}
		p.index[id] = i
	}
	if p.Threshold < 2 || p.Threshold > p.n || 2*p.Threshold <= p.n {
		return nil, fmt.Errorf("secagg: %w: Threshold %d with %d clients: want 2 <= t <= %d and 2t > %d",
			ErrInvalidArgument, p.Threshold, p.n, p.n, p.n)
	}
	if p.Dim < 1 || p.Dim > MaxDim {
		return nil, fmt.Errorf("secagg: %w: Dim %d: want between 1 and %d", ErrInvalidArgument, p.Dim, MaxDim)
	}
	switch p.Bits {
	case 0:
		p.Bits = 32
	case 32, 64:
	default:
		return nil, fmt.Errorf("secagg: %w: Bits %d: want 32 or 64", ErrInvalidArgument, p.Bits)
	}
	p.width = p.Bits / 8
	p.mask = math.MaxUint64 >> (64 - p.Bits)
	if p.MaxWeight == 0 {
		p.MaxWeight = 1
	}
	if hi, lo := bits.Mul64(uint64(p.n), p.MaxWeight); hi != 0 || lo > p.mask {
		return nil, fmt.Errorf("secagg: %w: MaxWeight %d: %d clients' weights could exceed 2^%d - 1",
			ErrInvalidArgument, p.MaxWeight, p.n, p.Bits)
	}
	if !(p.Clip > 0) || math.IsInf(p.Clip, 0) {
		return nil, fmt.Errorf("secagg: %w: Clip %v: want a positive finite bound", ErrInvalidArgument, p.Clip)
	}
	if p.Scale == 0 {
		s, ok := largestScale(p.Clip, p.n, p.Bits)
		if !ok {
			return nil, fmt.Errorf("secagg: %w: Clip %v: no power-of-two scale fits %d clients in %d bits",
				ErrInvalidArgument, p.Clip, p.n, p.Bits)
		}
		p.Scale = s
	}
	q, err := bound(p.Clip, p.Scale, p.n, p.Bits)
	if err != nil {
		return nil, err
	}
	p.q = q
	p.fp = fingerprint(p)
	return p, nil
}

// bound checks that n inputs in [-clip, clip] quantized with scale cannot
// wrap a signed k-bit sum, and returns round(clip·scale).
func bound(clip, scale float64, n, k int) (int64, error) {
	if !(scale > 0) || math.IsInf(scale, 0) {
		return 0, fmt.Errorf("secagg: %w: Scale %v: want a positive finite scale", ErrInvalidArgument, scale)
	}
	q := math.Round(clip * scale)
	if q < 1 {
		return 0, fmt.Errorf("secagg: %w: Clip·Scale = %v: the range holds no quantum", ErrInvalidArgument, clip*scale)
	}
	limit := uint64(1)<<(k-1) - 1
	if q >= 1<<63 {
		return 0, fmt.Errorf("secagg: %w: Clip·Scale = %v: overflows %d bits", ErrInvalidArgument, q, k)
	}
	if hi, lo := bits.Mul64(uint64(n), uint64(q)); hi != 0 || lo > limit {
		return 0, fmt.Errorf("secagg: %w: Scale %v: %d clients · round(Clip·Scale) = %d·%v exceeds 2^%d - 1",
			ErrInvalidArgument, scale, n, n, q, k-1)
	}
	return int64(q), nil
}

// largestScale is the largest power of two s with n·round(clip·s) <= 2^(k-1)-1.
func largestScale(clip float64, n, k int) (float64, bool) {
	limit := float64(uint64(1)<<(k-1) - 1)
	e := int(math.Floor(math.Log2(limit / (float64(n) * clip))))
	for d := e + 1; d >= e-4; d-- {
		s := math.Ldexp(1, d)
		if _, err := bound(clip, s, n, k); err == nil {
			return s, true
		}
	}
	return 0, false
}

// fingerprint hashes everything the parties must agree on except the round,
// which travels in the clear.
func fingerprint(p *params) uint64 {
	h := sha256.New()
	h.Write([]byte("gdist/secagg/1 config"))
	var b [8]byte
	put := func(v uint64) {
		binary.LittleEndian.PutUint64(b[:], v)
		h.Write(b[:])
	}
	put(uint64(p.n))
	for _, id := range p.Clients {
		put(uint64(id))
	}
	put(uint64(p.Threshold))
	put(uint64(p.Dim))
	put(uint64(p.Bits))
	put(math.Float64bits(p.Clip))
	put(math.Float64bits(p.Scale))
	put(p.MaxWeight)
	return binary.LittleEndian.Uint64(h.Sum(nil))
}

// resolved returns the public copy of the validated configuration.
func (p *params) resolved() Config {
	c := p.Config
	c.Clients = slices.Clone(p.Clients)
	return c
}
