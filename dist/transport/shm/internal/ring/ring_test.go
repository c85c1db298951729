//go:build linux

package ring

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func newPair(t *testing.T, size int) (*Producer, *Consumer, *Ring) {
	t.Helper()
	region := make([]byte, RegionSize(size))
	r, err := View(region, size, 1)
	require.NoError(t, err)
	return NewProducer(r), NewConsumer(r), r
}

// TestStreamWraps: bytes written in pieces of every length come out in
// order across many wrap-arounds, and Space/Avail account for them.
func TestStreamWraps(t *testing.T) {
	const size = MinSize
	p, c, _ := newPair(t, size)
	var want, got []byte
	for i := range 3000 {
		n := (i * 37) % (size / 3)
		b := make([]byte, n)
		for k := range b {
			b[k] = byte(i + k)
		}
		s, err := p.Space()
		require.NoError(t, err)
		require.Equal(t, uint64(size), s)
		p.Write(b)
		require.True(t, p.Publish() || n == 0)
		want = append(want, b...)
		a, err := c.Avail()
		require.NoError(t, err)
		require.Equal(t, uint64(n), a)
		out := make([]byte, a)
		c.Read(out)
		c.Release()
		got = append(got, out...)
	}
	require.True(t, bytes.Equal(want, got))
}

// TestChecks: indices from the other side that could not happen are
// reported as ErrCorrupt; records are checked too.
func TestChecks(t *testing.T) {
	p, c, r := newPair(t, MinSize)
	p.Write(make([]byte, 100))
	p.Publish()
	_, err := c.Avail()
	require.NoError(t, err)

	r.u64(offHead).Store(50) // backwards
	_, err = c.Avail()
	require.ErrorIs(t, err, ErrCorrupt)
	r.u64(offHead).Store(MinSize + 1) // more than a ring ahead of the released tail
	_, err = c.Avail()
	require.ErrorIs(t, err, ErrCorrupt)

	r.u64(offTail).Store(101) // beyond the published head
	_, err = p.Space()
	require.ErrorIs(t, err, ErrCorrupt)

	var b [HeaderSize]byte
	h := Header{Tag: 7, Len: 1 << 20, Meta: [16]byte{1, 2}, Remote: true}
	h.Put(b[:])
	_, err = ParseHeader(b[:], 1<<20, 0)
	require.ErrorIs(t, err, ErrCorrupt, "no seal")
	binary.LittleEndian.PutUint64(b[:], Seal(64, h.Len, true, false))
	got, err := ParseHeader(b[:], 1<<20, 64)
	require.NoError(t, err)
	require.Equal(t, h, got)
	long := Header{Tag: 9, Len: MaxLen, Meta: [16]byte{3}}
	long.Put(b[:])
	binary.LittleEndian.PutUint64(b[:], Seal(128, long.Len, false, false))
	got, err = ParseHeader(b[:], MaxLen, 128)
	require.NoError(t, err)
	require.Equal(t, long, got, "a 40-bit length")
	h.Put(b[:])
	binary.LittleEndian.PutUint64(b[:], Seal(64, h.Len, true, false))
	_, err = ParseHeader(b[:], 1<<20-1, 64)
	require.True(t, errors.Is(err, ErrTooLarge) && errors.Is(err, ErrCorrupt))
	_, err = ParseHeader(b[:], 1<<20, 64+Align)
	require.ErrorIs(t, err, ErrCorrupt, "the seal of another position")
	_, err = ParseHeader(b[:], 1<<20, 64+MaxSize)
	require.ErrorIs(t, err, ErrCorrupt, "the seal of another lap")
	_, err = ParseHeader(b[:], 1<<20, 64+1<<40)
	require.ErrorIs(t, err, ErrCorrupt, "the seal of a lap 2^40 bytes on")
	_, err = ParseHeader(b[:], 1<<20, 64+1<<54)
	require.ErrorIs(t, err, ErrCorrupt, "the seal of a lap 2^54 bytes on")

	require.Error(t, CheckSize(MinSize+1))
	require.Error(t, CheckSize(MinSize/2))
	_, err = View(make([]byte, 10), MinSize, 0)
	require.Error(t, err)
}

// FuzzConsumer: whatever the other side writes into the control block and
// the data area, the consumer's checks and reads stay in bounds.
func FuzzConsumer(f *testing.F) {
	f.Add(uint64(10), uint64(0), []byte("GDSM"))
	f.Add(uint64(1<<63), uint64(5), []byte{})
	f.Add(uint64(64), uint64(0), []byte{0, 0, 0, 0, 0, 0, 0, 0x90}) // a lap mark at position 0
	f.Fuzz(func(t *testing.T, head, tail uint64, data []byte) {
		p, c, r := newPair(t, MinSize)
		p.Write(make([]byte, 64))
		p.Publish()
		r.u64(offHead).Store(head)
		r.u64(offTail).Store(tail)
		copy(r.data, data)
		for range 4 {
			if _, err := c.Next(true); err != nil { // seals, whole records and lap marks
				require.ErrorIs(t, err, ErrCorrupt)
				break
			}
			a, err := c.Avail()
			if err != nil {
				require.ErrorIs(t, err, ErrCorrupt)
				break
			}
			require.LessOrEqual(t, a, uint64(MinSize))
			if a >= HeaderSize {
				var hb [HeaderSize]byte
				pos := c.Pos()
				c.Read(hb[:])
				if _, err := ParseHeader(hb[:], 1<<20, pos); err != nil {
					require.ErrorIs(t, err, ErrCorrupt)
				}
				a -= HeaderSize
			}
			out := make([]byte, a)
			c.Read(out)
			c.Release()
		}
		if s, err := p.Space(); err == nil {
			require.LessOrEqual(t, s, uint64(MinSize))
		} else {
			require.ErrorIs(t, err, ErrCorrupt)
		}
	})
}

// TestSealedRecords: a whole record's seal lets the consumer read it before
// head is published, a header's seal only the header; seals left from the
// ring's previous lap are never taken for new ones; and the producer
// accepts a tail past its published head (a sealed record read early).
func TestSealedRecords(t *testing.T) {
	const size = MinSize
	p, c, r := newPair(t, size)
	for i := range 2000 {
		n := (i * 53) % 300
		payload := make([]byte, n)
		for k := range payload {
			payload[k] = byte(i ^ k)
		}
		ok, err := c.Next(false)
		require.NoError(t, err)
		require.False(t, ok, "record %d: nothing written yet", i)
		s, err := p.Space()
		require.NoError(t, err)
		require.Equal(t, uint64(size), s)
		h := Header{Tag: uint32(i), Len: uint64(n), Meta: [16]byte{byte(i)}}
		whole := i%3 != 0
		if whole {
			p.WriteRecord(&h, payload)
		} else {
			p.WriteHeader(&h)
			p.Write(payload)
			p.Write(make([]byte, Pad(uint64(n))))
		}
		ok, err = c.Next(false)
		require.NoError(t, err)
		require.True(t, ok, "record %d: sealed", i)
		if whole {
			require.Equal(t, uint64(HeaderSize+n)+Pad(uint64(n)), c.Known(), "record %d: known whole", i)
		} else {
			require.Equal(t, uint64(HeaderSize), c.Known(), "record %d: only the header is known", i)
			p.Publish()
			a, err := c.Avail()
			require.NoError(t, err)
			require.Equal(t, uint64(HeaderSize+n)+Pad(uint64(n)), a)
		}
		var hb [HeaderSize]byte
		pos := c.Pos()
		c.Read(hb[:])
		got, err := ParseHeader(hb[:], 1<<20, pos)
		require.NoError(t, err)
		require.Equal(t, h, got)
		out := make([]byte, n)
		c.Read(out)
		require.Equal(t, payload, out)
		c.Skip(Pad(uint64(n)))
		c.Release()
		if i%2 == 0 {
			p.Publish() // late, or not until the next record
		}
	}
	p.Publish()
	a, err := c.Avail()
	require.NoError(t, err)
	require.Zero(t, a)
	require.False(t, r.SealedAt(c.Pos()))
}

// TestRestart: records written after lap marks come out whole and in
// order, each mark moves both sides to the start of the next lap, and the
// producer has the space up to where the consumer stands until the
// consumer passes the mark, the whole ring after.
func TestRestart(t *testing.T) {
	const size = MinSize
	p, c, _ := newPair(t, size)
	read := func(i int, want Header, payload []byte) {
		t.Helper()
		ok, err := c.Next(false)
		require.NoError(t, err)
		require.True(t, ok, "record %d", i)
		var hb [HeaderSize]byte
		pos := c.Pos()
		c.Read(hb[:])
		got, err := ParseHeader(hb[:], 1<<20, pos)
		require.NoError(t, err, "record %d", i)
		require.Equal(t, want, got)
		p.Publish()
		a, err := c.Avail()
		require.NoError(t, err)
		require.GreaterOrEqual(t, a, want.Len+Pad(want.Len))
		out := make([]byte, want.Len)
		c.Read(out)
		require.Equal(t, payload, out, "record %d", i)
		c.Skip(Pad(want.Len))
		c.Release()
	}
	restarts := 0
	for i := range 3000 {
		n := (i * 97) % 900
		payload := make([]byte, n)
		for k := range payload {
			payload[k] = byte(i*7 + k)
		}
		s, err := p.Space()
		require.NoError(t, err)
		require.Equal(t, uint64(size), s, "record %d: the consumer took everything", i)
		rec := uint64(HeaderSize+n) + Pad(uint64(n))
		if off := p.Offset(); i%4 != 3 && off >= rec {
			p.Restart()
			restarts++
			require.Zero(t, p.Offset())
			require.Equal(t, off, p.Known(), "record %d: room up to the consumer", i)
		}
		start := p.Pos()
		h := Header{Tag: uint32(i), Len: uint64(n)}
		p.WriteHeader(&h)
		p.Write(payload)
		p.Write(make([]byte, Pad(uint64(n))))
		if i%2 == 0 {
			p.Publish()
		}
		read(i, h, payload)
		require.Equal(t, start+rec, c.Pos(), "record %d: the consumer followed the mark", i)
	}
	require.Greater(t, restarts, 500)
	s, err := p.Space()
	require.NoError(t, err)
	require.Equal(t, uint64(size), s)
}

// TestRestartChecks: a lap mark is honoured only where the consumer has
// released everything before it (where a producer that found the ring
// empty could have left it), and a header never carries one.
func TestRestartChecks(t *testing.T) {
	p, c, r := newPair(t, MinSize)
	h := Header{Tag: 1, Len: 8}
	p.WriteRecord(&h, make([]byte, 8))
	p.Publish()
	ok, err := c.Next(false)
	require.NoError(t, err)
	require.True(t, ok)
	c.Skip(HeaderSize + 8) // read, not released
	r.word(c.Pos()).Store(lapMark(c.Pos()))
	_, err = c.Next(false)
	require.ErrorIs(t, err, ErrCorrupt)

	// A mark with other bits set is no mark: the record it seals fails
	// its header check.
	_, c, r = newPair(t, MinSize)
	r.word(0).Store(lapMark(0) | wholeBit)
	ok, err = c.Next(false)
	require.NoError(t, err)
	require.True(t, ok)
	require.Zero(t, c.Pos(), "no lap passed")
	var hb [HeaderSize]byte
	c.PeekInto(hb[:])
	_, err = ParseHeader(hb[:], 1<<20, 0)
	require.ErrorIs(t, err, ErrCorrupt)
}

// TestStaleSeals: a seal or lap mark left at a place of the ring that the
// producer has not written over since — which lap restarts make possible
// for places past where it restarts — is never taken for the record or
// mark of a later lap, however many laps later: the consumer waits there
// for the producer. (A seal that kept only the position's low bits would
// match again after 2 GiB.)
func TestStaleSeals(t *testing.T) {
	for _, laps := range []uint64{1, 2, 256, 1 << 19, 1 << 30} {
		for _, mark := range []bool{false, true} {
			p, c, r := newPair(t, MinSize)
			// A record and a lap mark at 1 KiB into lap 0.
			p.WriteRecord(&Header{Tag: 1, Len: 8}, make([]byte, 8))
			p.Publish()
			ok, err := c.Next(false)
			require.NoError(t, err)
			require.True(t, ok)
			c.Skip(HeaderSize + 8)
			require.True(t, c.Release())
			const at = 1 << 10
			if mark {
				r.word(at).Store(lapMark(at))
			} else {
				r.word(at).Store(Seal(at, 8, false, true))
			}
			// Both sides caught up at the same place, laps later.
			pos := at + laps*MinSize
			p.head, p.pub, p.tail = pos, pos, pos
			c.tail, c.pub, c.head, c.seen = pos, pos, pos, pos
			r.u64(offHead).Store(pos)
			r.u64(offTail).Store(pos)
			require.False(t, r.SealedAt(pos), "laps %d, mark %v", laps, mark)
			for _, head := range []bool{false, true} {
				ok, err := c.Next(head)
				require.NoError(t, err)
				require.False(t, ok, "laps %d, mark %v: nothing was written", laps, mark)
				require.Equal(t, pos, c.Pos(), "laps %d, mark %v: no lap passed", laps, mark)
			}
			// The producer's next record there is read.
			p.WriteRecord(&Header{Tag: 2, Len: 8}, make([]byte, 8))
			p.Publish()
			ok, err = c.Next(false)
			require.NoError(t, err)
			require.True(t, ok)
			var hb [HeaderSize]byte
			c.PeekInto(hb[:])
			h, err := ParseHeader(hb[:], 1<<20, pos)
			require.NoError(t, err)
			require.Equal(t, uint32(2), h.Tag)
		}
	}
}
