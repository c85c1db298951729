package secagg

import (
	"errors"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
	"testing/quick"
)

// TestConfigRefused: configurations that are invalid or could overflow
// the ring are refused by NewServer and NewClient with ErrInvalidArgument.
func TestConfigRefused(t *testing.T) {
	good := func() Config { return Config{Clients: []int{1, 2, 3}, Threshold: 2, Dim: 4, Clip: 1} }
	twenty := make([]int, 20)
	for i := range twenty {
		twenty[i] = i
	}
	cases := map[string]func(c *Config){
		"one client":            func(c *Config) { c.Clients, c.Threshold = []int{1}, 1 },
		"too many clients":      func(c *Config) { c.Clients = make([]int, MaxClients+1) },
		"repeated id":           func(c *Config) { c.Clients = []int{1, 2, 2} },
		"negative id":           func(c *Config) { c.Clients = []int{-1, 2, 3} },
		"id above MaxID":        func(c *Config) { c.Clients = []int{1, 2, MaxID + 1} },
		"threshold 1":           func(c *Config) { c.Threshold = 1 },
		"threshold above n":     func(c *Config) { c.Threshold = 4 },
		"threshold no majority": func(c *Config) { c.Clients, c.Threshold = []int{1, 2, 3, 4}, 2 },
		"dim 0":                 func(c *Config) { c.Dim = 0 },
		"dim above MaxDim":      func(c *Config) { c.Dim = MaxDim + 1 },
		"bits 16":               func(c *Config) { c.Bits = 16 },
		"clip 0":                func(c *Config) { c.Clip = 0 },
		"clip negative":         func(c *Config) { c.Clip = -1 },
		"clip NaN":              func(c *Config) { c.Clip = math.NaN() },
		"clip Inf":              func(c *Config) { c.Clip = math.Inf(1) },
		"clip too small":        func(c *Config) { c.Clip = 1e-320; c.Bits = 64 },
		"scale negative":        func(c *Config) { c.Scale = -1 },
		"scale NaN":             func(c *Config) { c.Scale = math.NaN() },
		"scale below a quantum": func(c *Config) { c.Scale = 0.1 },
		// 3 · round(1·2^30) = 3·2^30 > 2^31 - 1
		"scale overflows 32 bits": func(c *Config) { c.Scale = 1 << 30 },
		"scale overflows 64 bits": func(c *Config) { c.Scale, c.Bits = 1<<62, 64 },
		// 20 · 2^27 > 2^31 - 1 (2^26 fits)
		"scale overflows with 20": func(c *Config) { c.Clients, c.Threshold, c.Scale = twenty, 11, 1<<27 },
		"weights overflow":        func(c *Config) { c.MaxWeight = math.MaxUint32/3 + 1 },
		"weights overflow 64":     func(c *Config) { c.MaxWeight, c.Bits = math.MaxUint64/3+1, 64 },
	}
	for name, f := range cases {
		c := good()
		f(&c)
		if _, err := NewServer(c); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: NewServer: %v, want ErrInvalidArgument", name, err)
		}
		if _, err := NewClient(c, 1, nil); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: NewClient: %v, want ErrInvalidArgument", name, err)
		}
	}
	if _, err := NewClient(good(), 7, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("a client outside the round: %v", err)
	}
	// The bounds themselves are accepted.
	for name, f := range map[string]func(c *Config){
		"scale at the 32-bit bound": func(c *Config) { c.Scale = (1<<31 - 1) / 3 },
		"weights at the bound":      func(c *Config) { c.MaxWeight = math.MaxUint32 / 3 },
		"majority of 4":             func(c *Config) { c.Clients, c.Threshold = []int{1, 2, 3, 4}, 3 },
		"scale 2^26 with 20":        func(c *Config) { c.Clients, c.Threshold, c.Scale = twenty, 11, 1<<26 },
	} {
		c := good()
		f(&c)
		if _, err := NewServer(c); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestAutoScale: the scale chosen for Scale = 0 is the largest power of
// two under the overflow bound, over random client counts, clip ranges
// and widths.
func TestAutoScale(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	for range 2000 {
		n := 2 + r.IntN(MaxClients-1)
		clip := math.Exp(r.NormFloat64() * 10)
		bits := []int{32, 64}[r.IntN(2)]
		s, ok := largestScale(clip, n, bits)
		if !ok {
			t.Fatalf("n=%d clip=%g bits=%d: no scale", n, clip, bits)
		}
		if frac, _ := math.Frexp(s); frac != 0.5 {
			t.Fatalf("scale %v is not a power of two", s)
		}
		limit := new(big.Float).SetInt(new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), uint(bits-1)), big.NewInt(1)))
		fits := func(s float64) bool {
			q := big.NewFloat(math.Round(clip * s))
			return q.Mul(q, big.NewFloat(float64(n))).Cmp(limit) <= 0
		}
		if !fits(s) || fits(2*s) {
			t.Fatalf("n=%d clip=%g bits=%d: scale %v is not the largest power of two that fits", n, clip, bits, s)
		}
	}
}

// TestFieldArithmetic checks the GF(2^61-1) operations against math/big.
func TestFieldArithmetic(t *testing.T) {
	p := big.NewInt(prime)
	mod := func(a, b uint64, f func(z, x, y *big.Int) *big.Int) uint64 {
		z := f(new(big.Int), new(big.Int).SetUint64(a), new(big.Int).SetUint64(b))
		return z.Mod(z, p).Uint64()
	}
	elem := func(v uint64) uint64 { return v % prime }
	check := func(a, b uint64) bool {
		a, b = elem(a), elem(b)
		ok := fadd(a, b) == mod(a, b, (*big.Int).Add) &&
			fsub(a, b) == mod(a, b, (*big.Int).Sub) &&
			fmul(a, b) == mod(a, b, (*big.Int).Mul)
		if a != 0 {
			ok = ok && fmul(a, finv(a)) == 1
		}
		return ok
	}
	if err := quick.Check(check, &quick.Config{MaxCount: 20000}); err != nil {
		t.Fatal(err)
	}
	for _, a := range []uint64{0, 1, prime - 1, prime - 2, 1 << 60} {
		for _, b := range []uint64{0, 1, prime - 1, 1 << 60} {
			if !check(a, b) {
				t.Fatalf("a=%d b=%d", a, b)
			}
		}
	}
}

// TestShamir: any t of n shares reconstruct the secret, at random
// thresholds and holder points; t-1 shares plus a wrong one do not.
func TestShamir(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	src := rand.NewChaCha8([32]byte{1})
	for c := range 500 {
		n := 2 + r.IntN(30)
		tt := 2 + r.IntN(n-1)
		var secret [32]byte
		src.Read(secret[:])
		xs := make([]uint64, n)
		for i, p := range r.Perm(MaxClients)[:n] {
			xs[i] = uint64(p) + 1
		}
		shares, err := split(&secret, tt, xs, src)
		if err != nil {
			t.Fatal(err)
		}
		pick := r.Perm(n)[:tt]
		px, ps := make([]uint64, tt), make([]share, tt)
		for i, j := range pick {
			px[i], ps[i] = xs[j], shares[j]
		}
		got, err := combine(px, ps)
		if err != nil || got != secret {
			t.Fatalf("case %d (n=%d t=%d): got %x, %v, want %x", c, n, tt, got, err, secret)
		}
		ps[0][3] = fadd(ps[0][3], 1)
		if got, err := combine(px, ps); err == nil && got == secret {
			t.Fatalf("case %d: a wrong share still gave the secret", c)
		}
	}
}
