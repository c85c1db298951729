package wire

import (
	"bytes"
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func encode(h Header) []byte {
	b := make([]byte, HeaderSize)
	h.Put(b)
	return b
}

func TestRoundTrip(t *testing.T) {
	for _, h := range []Header{
		{Kind: Data, Src: 3, Tag: 0xFFF00001, Meta: [MetaSize]byte{0: 0xff, 7: 0xff, 8: 0x01, 15: 0xef}, Len: 64 << 20},
		{Kind: Data},
		{Kind: Goodbye, Src: 1},
		{Kind: Heartbeat, Src: math.MaxUint32},
		{Kind: Heartbeat, Src: 1, Stamp: math.MaxUint64},
		{Kind: Echo, Src: 2, Stamp: 12345},
		{Kind: Credit, Src: 2, Grant: math.MaxUint64},
		{Kind: Blocked},
		{Kind: Hello, Src: 1, Len: HelloSize},
		{Kind: Reject, Tag: uint32(RejectDuplicate)},
		{Kind: Reject, Tag: uint32(RejectWorld), Stamp: 3},
		{Kind: Challenge, Src: 1, Len: ChallengeSize},
		{Kind: Welcome, Src: 1, Len: WelcomeSize},
		{Kind: Table, Len: 1000},
	} {
		got, err := Parse(encode(h), 64<<20)
		require.NoError(t, err, "%+v", h)
		assert.Equal(t, h, got)
	}
}

func TestLayout(t *testing.T) {
	b := encode(Header{Kind: Data, Src: 0x04030201, Tag: 0x08070605,
		Meta: [MetaSize]byte{0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18},
		Len:  0x201f1e1d1c1b1a19})
	want := []byte{'g', 'D', 3, 1, 0, 0, 0, 0,
		1, 2, 3, 4, 5, 6, 7, 8,
		0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10,
		0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18,
		0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f, 0x20}
	assert.Equal(t, want, b)
}

func TestParseRefuses(t *testing.T) {
	good := encode(Header{Kind: Data, Len: 10})
	mut := func(f func(b []byte)) []byte {
		b := bytes.Clone(good)
		f(b)
		return b
	}
	cases := []struct {
		name string
		b    []byte
		max  uint64
		want error
	}{
		{"short", good[:HeaderSize-1], 100, ErrShortHeader},
		{"empty", nil, 100, ErrShortHeader},
		{"magic", mut(func(b []byte) { b[0] = 'x' }), 100, ErrBadMagic},
		{"magic2", mut(func(b []byte) { b[1] = 'd' }), 100, ErrBadMagic},
		{"version0", mut(func(b []byte) { b[2] = 0 }), 100, ErrBadVersion},
		{"version1", mut(func(b []byte) { b[2] = 1 }), 100, ErrBadVersion},
		{"version2", mut(func(b []byte) { b[2] = 2 }), 100, ErrBadVersion},
		{"version4", mut(func(b []byte) { b[2] = 4 }), 100, ErrBadVersion},
		{"heartbeat-meta", mut(func(b []byte) { b[3] = byte(Heartbeat); b[9] = 0; b[28] = 1; clear(b[32:]) }), 100, ErrReserved},
		{"echo-meta", mut(func(b []byte) { b[3] = byte(Echo); b[31] = 1; clear(b[32:]) }), 100, ErrReserved},
		{"goodbye-meta", mut(func(b []byte) { b[3] = byte(Goodbye); b[16] = 1; clear(b[32:]) }), 100, ErrReserved},
		{"credit-high", mut(func(b []byte) { b[3] = byte(Credit); b[31] = 1; clear(b[32:]) }), 100, ErrReserved},
		{"kind0", mut(func(b []byte) { b[3] = 0 }), 100, ErrBadKind},
		{"kind7", mut(func(b []byte) { b[3] = 7 }), 100, ErrBadKind},
		{"kind255", mut(func(b []byte) { b[3] = 255 }), 100, ErrBadKind},
		{"flags", mut(func(b []byte) { b[7] = 1 }), 100, ErrBadFlags},
		{"control-len", encode(Header{Kind: Heartbeat, Len: 1}), 100, ErrControlLength},
		{"echo-len", encode(Header{Kind: Echo, Len: 8}), 100, ErrControlLength},
		{"too-large", good, 9, ErrFrameTooLarge},
		{"1TiB", encode(Header{Kind: Data, Len: 1 << 40}), 64 << 20, ErrFrameTooLarge},
		{"over-absolute", encode(Header{Kind: Data, Len: 1<<40 + 1}), math.MaxUint64, ErrFrameTooLarge},
		{"max-u64", encode(Header{Kind: Data, Len: math.MaxUint64}), math.MaxUint64, ErrFrameTooLarge},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(c.b, c.max)
			require.ErrorIs(t, err, c.want)
		})
	}
	_, err := Parse(good, 10)
	require.NoError(t, err, "length equal to the limit is fine")

	_, err = Parse(encode(Header{Kind: Data, Len: 1 << 40}), 64<<20)
	var tl *FrameTooLargeError
	require.ErrorAs(t, err, &tl)
	assert.Equal(t, uint64(1<<40), tl.Len)
	assert.Equal(t, uint64(64<<20), tl.Max)
}

func TestParseDoesNotAllocate(t *testing.T) {
	b := encode(Header{Kind: Data, Len: 1 << 20})
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := Parse(b, 1<<20); err != nil {
			panic(err)
		}
	})
	assert.Zero(t, allocs)
	hb := make([]byte, HeaderSize)
	h := Header{Kind: Data, Len: 5}
	allocs = testing.AllocsPerRun(100, func() { h.Put(hb) })
	assert.Zero(t, allocs)
}

func TestKinds(t *testing.T) {
	for k := range 256 {
		k := Kind(k)
		if !k.Valid() {
			assert.Contains(t, k.String(), "kind(")
			continue
		}
		assert.NotContains(t, k.String(), "kind(")
		assert.Equal(t, k >= Hello, k.Handshake(), k.String())
	}
	assert.Equal(t, "duplicate rank", RejectDuplicate.String())
}

func TestHello(t *testing.T) {
	in := HelloInfo{World: 4, Peer: 2, QueueLimit: 64 << 20, MaxFrame: 1 << 30, Mode: ModeRendezvous}
	for i := range in.Nonce {
		in.Nonce[i] = byte(i)
	}
	b := make([]byte, HelloSize)
	in.Put(b)
	out, err := ParseHello(b)
	require.NoError(t, err)
	assert.Equal(t, in, out)

	_, err = ParseHello(b[:HelloSize-1])
	require.ErrorIs(t, err, ErrMalformed)
	b[25] = 1
	_, err = ParseHello(b)
	require.ErrorIs(t, err, ErrMalformed)
	b[25] = 0
	b[24] = 7
	_, err = ParseHello(b)
	require.ErrorIs(t, err, ErrMalformed)
}

func TestMAC(t *testing.T) {
	hello := bytes.Repeat([]byte{1}, HelloSize)
	welcome := bytes.Repeat([]byte{2}, WelcomeSize)
	var nonce [NonceSize]byte
	copy(nonce[:], welcome[32:64])
	tok := []byte("secret-0123456789")
	s := ServerMAC(tok, hello, welcome, 1, 0)
	c := ClientMAC(tok, hello, nonce, 1, 0)
	assert.NotEqual(t, s, c, "labels separate the two proofs")
	assert.Equal(t, s, ServerMAC(tok, hello, welcome, 1, 0))
	assert.Equal(t, c, ClientMAC(tok, hello, nonce, 1, 0))
	assert.NotEqual(t, s, ServerMAC([]byte("secret-012345678A"), hello, welcome, 1, 0))
	assert.NotEqual(t, c, ClientMAC([]byte("secret-012345678A"), hello, nonce, 1, 0))
	assert.NotEqual(t, s, ServerMAC(tok, hello, welcome, 2, 0))
	assert.NotEqual(t, s, ServerMAC(tok, hello, welcome, 1, 1))
	assert.NotEqual(t, c, ClientMAC(tok, hello, nonce, 2, 0))
	assert.NotEqual(t, c, ClientMAC(tok, hello, nonce, 1, 1))
	w2 := bytes.Clone(welcome)
	w2[40] ^= 1
	assert.NotEqual(t, s, ServerMAC(tok, hello, w2, 1, 0), "the server MAC covers its nonce")
	assert.Equal(t, s, ServerMAC(tok, hello, append(bytes.Clone(welcome[:HelloSize]), make([]byte, MACSize)...), 1, 0),
		"the server MAC does not cover the MAC bytes of Welcome")
	n2 := nonce
	n2[0] ^= 1
	assert.NotEqual(t, c, ClientMAC(tok, hello, n2, 1, 0), "the client MAC covers the server nonce")
	h2 := bytes.Clone(hello)
	h2[0] ^= 1
	assert.NotEqual(t, c, ClientMAC(tok, h2, nonce, 1, 0), "the client MAC covers its hello")
}

func TestTable(t *testing.T) {
	addrs := []string{"127.0.0.1:1", "", "[::1]:65535", "host.example:80"}
	b, err := AppendTable(nil, addrs)
	require.NoError(t, err)
	got, err := ParseTable(b, len(addrs))
	require.NoError(t, err)
	assert.Equal(t, addrs, got)
	assert.LessOrEqual(t, uint64(len(b)), MaxHandshakePayload(len(addrs)))

	_, err = ParseTable(b, len(addrs)+1)
	require.ErrorIs(t, err, ErrMalformed)
	_, err = ParseTable(b, len(addrs)-1)
	require.ErrorIs(t, err, ErrMalformed)
	_, err = ParseTable(b[:len(b)-1], len(addrs))
	require.ErrorIs(t, err, ErrMalformed)
	_, err = AppendTable(nil, []string{string(make([]byte, MaxAddrLen+1))})
	require.ErrorIs(t, err, ErrMalformed)

	big := make([]string, 1000)
	for i := range big {
		big[i] = string(bytes.Repeat([]byte{'a'}, MaxAddrLen))
	}
	b, err = AppendTable(nil, big)
	require.NoError(t, err)
	assert.LessOrEqual(t, uint64(len(b)), MaxHandshakePayload(len(big)))
}

// FuzzParse checks that Parse never panics, that whatever it accepts
// re-encodes to the same bytes, and that it never accepts a length over the
// limit.
func FuzzParse(f *testing.F) {
	for _, h := range []Header{
		{Kind: Data, Src: 1, Tag: 7, Meta: [MetaSize]byte{3, 0, 0, 0, 0, 0, 0, 0, 9}, Len: 100},
		{Kind: Goodbye},
		{Kind: Heartbeat, Src: 5},
		{Kind: Credit, Grant: 1 << 20},
		{Kind: Hello, Len: HelloSize},
		{Kind: Challenge, Src: 1, Len: ChallengeSize},
		{Kind: Auth, Src: 2, Len: AuthSize},
		{Kind: Welcome, Len: WelcomeSize},
		{Kind: Heartbeat, Src: 1, Stamp: 1 << 40},
		{Kind: Echo, Src: 1, Stamp: 77},
		{Kind: Reject, Tag: uint32(RejectWorld), Stamp: 2},
		{Kind: Data, Len: 1 << 40},
	} {
		f.Add(encode(h), uint64(64<<20))
	}
	f.Add([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n0123456789"), uint64(1<<20))
	f.Add([]byte{}, uint64(0))
	f.Fuzz(func(t *testing.T, b []byte, max uint64) {
		h, err := Parse(b, max)
		if err != nil {
			if !errors.Is(err, ErrShortHeader) && !errors.Is(err, ErrBadMagic) && !errors.Is(err, ErrBadVersion) &&
				!errors.Is(err, ErrBadKind) && !errors.Is(err, ErrBadFlags) && !errors.Is(err, ErrControlLength) && !errors.Is(err, ErrReserved) &&
				!errors.Is(err, ErrFrameTooLarge) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		if h.Len > max || h.Len > MaxPayload {
			t.Fatalf("accepted length %d over limit %d", h.Len, max)
		}
		re := make([]byte, HeaderSize)
		h.Put(re)
		if !bytes.Equal(re, b[:HeaderSize]) {
			t.Fatalf("round trip: %x != %x", re, b[:HeaderSize])
		}
		h2, err := Parse(re, max)
		if err != nil || h2 != h {
			t.Fatalf("re-parse: %+v %v", h2, err)
		}
	})
}

// FuzzHandshake checks the handshake payload decoders never panic and
// round-trip what they accept.
func FuzzHandshake(f *testing.F) {
	hb := make([]byte, HelloSize)
	(&HelloInfo{World: 2, Peer: 1, QueueLimit: 1, MaxFrame: 2}).Put(hb)
	tb, _ := AppendTable(nil, []string{"a:1", "b:2"})
	f.Add(hb, 2)
	f.Add(tb, 2)
	f.Fuzz(func(t *testing.T, b []byte, world int) {
		if h, err := ParseHello(b); err == nil {
			re := make([]byte, HelloSize)
			h.Put(re)
			if !bytes.Equal(re, b[:HelloSize]) {
				t.Fatalf("hello round trip")
			}
		}
		if world < 0 || world > 1<<12 {
			return
		}
		if addrs, err := ParseTable(b, world); err == nil {
			re, err := AppendTable(nil, addrs)
			if err != nil || !bytes.Equal(re, b) {
				t.Fatalf("table round trip: %v", err)
			}
		}
	})
}
