package secagg

import (
	"encoding/binary"
	"fmt"
	"io"
	"math/bits"
)

// Shamir secret sharing over the prime field GF(p), p = 2^61 - 1. A 32-byte
// secret is cut into eight 32-bit chunks, each shared by its own random
// polynomial of degree t-1; a share is the eight evaluations at the
// holder's point x = 1 + (the holder's position in Config.Clients).

const (
	prime     = 1<<61 - 1
	chunks    = 8          // 32-bit chunks of a 32-byte secret
	shareSize = chunks * 8 // bytes of an encoded share
)

// share is one holder's evaluations of a secret's eight polynomials.
type share [chunks]uint64

func fadd(a, b uint64) uint64 {
	s := a + b // < 2^62: no overflow
	if s >= prime {
		s -= prime
	}
	return s
}

func fsub(a, b uint64) uint64 {
	if a >= b {
		return a - b
	}
	return a + prime - b
}

func fmul(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	// a·b = hi·2^64 + lo, and 2^61 ≡ 1 (mod p).
	s := (hi<<3 | lo>>61) + lo&prime
	if s >= prime {
		s -= prime
	}
	return s
}

// finv returns a^(p-2), the inverse of a nonzero a.
func finv(a uint64) uint64 {
	r, e := uint64(1), uint64(prime-2)
	for ; e > 0; e >>= 1 {
		if e&1 == 1 {
			r = fmul(r, a)
		}
		a = fmul(a, a)
	}
	return r
}

// randomElements fills dst with uniform field elements read from r.
func randomElements(r io.Reader, dst []uint64) error {
	buf := make([]byte, 8*len(dst))
	for i := 0; i < len(dst); {
		b := buf[:8*(len(dst)-i)]
		if _, err := io.ReadFull(r, b); err != nil {
			return fmt.Errorf("secagg: reading randomness: %w", err)
		}
		for j := 0; 8*j < len(b); j++ {
			v := binary.LittleEndian.Uint64(b[8*j:]) & prime
			if v != prime { // rejection keeps the draw uniform
				dst[i] = v
				i++
			}
		}
	}
	clear(buf)
	return nil
}

// split shares secret among the holders at points xs so that any t of the
// shares reconstruct it and fewer reveal nothing.
func split(secret *[32]byte, t int, xs []uint64, r io.Reader) ([]share, error) {
	coef := make([]uint64, chunks*(t-1))
	if err := randomElements(r, coef); err != nil {
		return nil, err
	}
	out := make([]share, len(xs))
	for c := range chunks {
		a0 := uint64(binary.LittleEndian.Uint32(secret[4*c:]))
		poly := coef[c*(t-1) : (c+1)*(t-1)]
		for h, x := range xs {
			// Horner: a0 + x(a1 + x(a2 + ...)).
			y := uint64(0)
			for j := len(poly) - 1; j >= 0; j-- {
				y = fmul(fadd(y, poly[j]), x)
			}
			out[h][c] = fadd(y, a0)
		}
	}
	clear(coef)
	return out, nil
}

// combine reconstructs a secret from shares at distinct nonzero points xs
// (as many as the threshold) by Lagrange interpolation at zero. It fails if
// a chunk does not fit 32 bits, which shares of a real secret never do.
func combine(xs []uint64, shares []share) ([32]byte, error) {
	var secret [32]byte
	lambda := make([]uint64, len(xs))
	for j, xj := range xs {
		num, den := uint64(1), uint64(1)
		for m, xm := range xs {
			if m != j {
				num = fmul(num, xm)
				den = fmul(den, fsub(xm, xj))
			}
		}
		lambda[j] = fmul(num, finv(den))
	}
	for c := range chunks {
		s := uint64(0)
		for j := range xs {
			s = fadd(s, fmul(lambda[j], shares[j][c]))
		}
		if s > 0xFFFFFFFF {
			return secret, ErrBadShare
		}
		binary.LittleEndian.PutUint32(secret[4*c:], uint32(s))
	}
	return secret, nil
}

func (s *share) put(b []byte) {
	for c, v := range s {
		binary.LittleEndian.PutUint64(b[8*c:], v)
	}
}

// parseShare decodes a share and checks every element is in the field.
func parseShare(b []byte) (share, error) {
	var s share
	for c := range s {
		v := binary.LittleEndian.Uint64(b[8*c:])
		if v >= prime {
			return s, fmt.Errorf("%w: share element %d out of the field", ErrMalformed, v)
		}
		s[c] = v
	}
	return s, nil
}
