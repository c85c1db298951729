//go:build linux

package ring

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/gdist/gdist/internal/vec"
)

// Layout constants.
const (
	// CtrlSize is the size of one direction's control block.
	CtrlSize = 4096
	// line separates fields written by different processes (two cache
	// lines, so the adjacent-line prefetcher does not couple them).
	line = 128

	offHead     = 0          // u64, producer: bytes written
	offBeat     = 16         // u64, producer: its heartbeat counter
	offProbe    = 32         // u64, producer: address of a word in its memory (remote reads probe)
	offProbeVal = 40         // u64, producer: that word's value
	offTail     = line       // u64, consumer: bytes read
	offFreed    = line + 8   // u64, consumer: payload bytes its application took (credit)
	offAck      = line + 16  // u64, consumer: remote records it has finished reading
	offRemoteOK = line + 24  // u32, consumer: it can read the producer's memory
	offBell     = 2 * line   // u32: the consumer's doorbell (a futex word)
	offSleeping = 2*line + 4 // u32, consumer: parked (or about to park) on the bell
	// The producer's wait flags, which the consumer reads as it consumes,
	// on a line of their own: on head's, each read would take the line
	// from the producer, which writes head at every publish.
	offSpaceWait  = 3 * line   // u32, producer: a sender waits for ring space
	offCreditWait = 3*line + 4 // u32, producer: a sender waits for credit
	offAckWait    = 3*line + 8 // u32, producer: a sender waits for a remote record's ack

	// MinSize and MaxSize bound a ring's data area; sizes are powers of two.
	MinSize = 4 << 10
	MaxSize = 1 << 30
)

// ErrCorrupt means a value read from shared memory violates the protocol.
var ErrCorrupt = errors.New("ring: corrupt shared memory")

// RegionSize is the size of a region whose two rings hold size bytes each.
func RegionSize(size int) int { return 2 * (CtrlSize + size) }

// CheckSize reports whether size is a valid ring size.
func CheckSize(size int) error {
	if size < MinSize || size > MaxSize || size&(size-1) != 0 {
		return fmt.Errorf("ring size %d is not a power of two in [%d, %d]", size, MinSize, MaxSize)
	}
	return nil
}

// Ring is one direction of a region: its control block and data area.
type Ring struct {
	ctrl []byte
	data []byte
	mask uint64
}

// View returns direction dir (0 or 1) of region, whose rings hold size bytes.
func View(region []byte, size, dir int) (*Ring, error) {
	if err := CheckSize(size); err != nil {
		return nil, err
	}
	if len(region) != RegionSize(size) || dir < 0 || dir > 1 {
		return nil, fmt.Errorf("ring: region of %d bytes, direction %d, for rings of %d", len(region), dir, size)
	}
	if uintptr(unsafe.Pointer(&region[0]))%8 != 0 {
		return nil, errors.New("ring: region not 8-byte aligned")
	}
	base := dir * (CtrlSize + size)
	return &Ring{
		ctrl: region[base : base+CtrlSize : base+CtrlSize],
		data: region[base+CtrlSize : base+CtrlSize+size : base+CtrlSize+size],
		mask: uint64(size - 1),
	}, nil
}

// CtrlBytes is the ring's control block, for tests that corrupt it.
func (r *Ring) CtrlBytes() []byte { return r.ctrl }

// DataBytes is the ring's data area, for tests that corrupt it.
func (r *Ring) DataBytes() []byte { return r.data }

// Size is the ring's data capacity in bytes.
func (r *Ring) Size() uint64 { return r.mask + 1 }

func (r *Ring) u64(off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&r.ctrl[off]))
}

func (r *Ring) u32(off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&r.ctrl[off]))
}

// Bell is the doorbell of the ring's consumer.
func (r *Ring) Bell() Bell { return Bell{seq: r.u32(offBell), sleeping: r.u32(offSleeping)} }

// SpaceWait reports whether the producer asked to be told about free space.
func (r *Ring) SpaceWait() bool { return r.u32(offSpaceWait).Load() != 0 }

// CreditWait reports whether the producer asked to be told about credit.
func (r *Ring) CreditWait() bool { return r.u32(offCreditWait).Load() != 0 }

// SetSpaceWait is the producer asking (or no longer asking) to be told
// when the consumer frees ring space.
func (r *Ring) SetSpaceWait(on bool) { r.u32(offSpaceWait).Store(b32(on)) }

// SetCreditWait is the producer asking (or no longer asking) to be told
// when the consumer returns credit.
func (r *Ring) SetCreditWait(on bool) { r.u32(offCreditWait).Store(b32(on)) }

// Beat is the producer's heartbeat counter.
func (r *Ring) Beat() uint64 { return r.u64(offBeat).Load() }

// AddBeat increments the producer's heartbeat counter.
func (r *Ring) AddBeat() { r.u64(offBeat).Add(1) }

// AckWait reports whether the producer asked to be told about acks.
func (r *Ring) AckWait() bool { return r.u32(offAckWait).Load() != 0 }

// SetAckWait is the producer asking (or no longer asking) to be told
// when the consumer acknowledges a remote record.
func (r *Ring) SetAckWait(on bool) { r.u32(offAckWait).Store(b32(on)) }

// Ack is the number of remote records the consumer finished, unchecked.
func (r *Ring) Ack() uint64 { return r.u64(offAck).Load() }

// AddAck is the consumer acknowledging a remote record.
func (r *Ring) AddAck() { r.u64(offAck).Add(1) }

// RemoteOK reports whether the consumer said it can read the producer's
// memory (unchecked: a consumer that lies only hurts itself).
func (r *Ring) RemoteOK() bool { return r.u32(offRemoteOK).Load() != 0 }

// SetRemoteOK is the consumer saying it can read the producer's memory.
func (r *Ring) SetRemoteOK() { r.u32(offRemoteOK).Store(1) }

// SetProbe is the producer publishing the address and value of a word of
// its memory, for the consumer to test remote reads with.
func (r *Ring) SetProbe(addr, val uint64) {
	r.u64(offProbeVal).Store(val)
	r.u64(offProbe).Store(addr)
}

// Probe returns what SetProbe published (0, 0 before), unchecked.
func (r *Ring) Probe() (addr, val uint64) {
	addr = r.u64(offProbe).Load()
	return addr, r.u64(offProbeVal).Load()
}

// TailHint is the consumer's tail, unchecked: a hint that it moved.
func (r *Ring) TailHint() uint64 { return r.u64(offTail).Load() }

// Freed is the credit the consumer returned so far, unchecked: the
// producer checks it against what it sent.
func (r *Ring) Freed() uint64 { return r.u64(offFreed).Load() }

// AddFreed is the consumer returning n bytes of credit.
func (r *Ring) AddFreed(n uint64) { r.u64(offFreed).Add(n) }

func b32(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

// Producer writes into a ring. It is not safe for concurrent use.
type Producer struct {
	r    *Ring
	head uint64 // private: bytes written (published or not)
	pub  uint64 // head last published
	tail uint64 // the consumer's tail, as last checked
}

// NewProducer returns the producer side of r, which must be fresh.
func NewProducer(r *Ring) *Producer { return &Producer{r: r} }

// Ring returns the producer's ring.
func (p *Producer) Ring() *Ring { return p.r }

// Space returns how many bytes may be written now. It reads and checks the
// consumer's tail.
func (p *Producer) Space() (uint64, error) {
	t := p.r.u64(offTail).Load()
	if t < p.tail || t > p.head { // a sealed record may be read before head says so
		return 0, fmt.Errorf("%w: tail %d outside [%d, %d]", ErrCorrupt, t, p.tail, p.head)
	}
	p.tail = t
	return p.r.Size() - (p.head - t), nil
}

// Known returns how many bytes may be written by the consumer's tail as
// last checked, without reading it: a lower bound of Space. A producer that
// asks Space only when Known falls short leaves the consumer's cache line
// alone while there is room, so that the consumer's updates of its tail
// stay in its own cache.
func (p *Producer) Known() uint64 { return p.r.Size() - (p.head - p.tail) }

// Write copies b into the ring after what was written before; len(b) must
// not exceed the last Space (or Known) minus what was written since. It
// does not publish.
func (p *Producer) Write(b []byte) {
	for len(b) > 0 {
		i := p.head & p.r.mask
		n := copy(p.r.data[i:], b)
		b = b[n:]
		p.head += uint64(n)
	}
}

// WriteStream is Write with non-temporal stores (vec.CopyStream): the
// bytes go to memory past this core's caches, and the consumer reads them
// from there rather than from this core. It pays where the consumer runs
// on a core that shares no cache with this one.
func (p *Producer) WriteStream(b []byte) {
	for len(b) > 0 {
		i := p.head & p.r.mask
		n := vec.CopyStream(p.r.data[i:], b)
		b = b[n:]
		p.head += uint64(n)
	}
}

// Pos returns how many bytes the producer has written (published or not).
func (p *Producer) Pos() uint64 { return p.head }

// WriteHeader writes the header of a record whose payload follows in later
// Writes, and seals it: its first word, stored last and atomically, names
// its position (see Seal), so that a consumer that finds the seal may read
// the header before head is published. HeaderSize must not exceed the
// last Space (or Known) minus what was written since.
func (p *Producer) WriteHeader(h *Header) {
	pos := p.head
	p.putHeader(h)
	p.word(pos).Store(Seal(pos, h.Len, h.Remote, false))
}

// putHeader writes h but its seal in place at head, a record's start.
func (p *Producer) putHeader(h *Header) {
	b := p.r.header(p.head)
	binary.LittleEndian.PutUint32(b[8:], h.Tag)
	binary.LittleEndian.PutUint32(b[lenOff:], uint32(h.Len))
	copy(b[16:HeaderSize], h.Meta[:])
	p.head += HeaderSize
}

// WriteRecord writes a whole record — the header h, payload and the
// padding after it — and seals it as whole: a consumer that finds the
// seal may read all of it before head is published. HeaderSize+len(payload)
// plus the padding must not exceed the last Space (or Known) minus what
// was written since; h.Len must be len(payload).
func (p *Producer) WriteRecord(h *Header, payload []byte) { p.writeRecord(h, payload, false) }

// WriteRecordStream is WriteRecord with the payload written as
// WriteStream writes.
func (p *Producer) WriteRecordStream(h *Header, payload []byte) { p.writeRecord(h, payload, true) }

func (p *Producer) writeRecord(h *Header, payload []byte, stream bool) {
	pos := p.head
	p.putHeader(h)
	n := uint64(len(payload))
	switch i := p.head & p.r.mask; {
	case stream:
		p.WriteStream(payload)
		p.Write(zeroPad[:Pad(n)])
	case i+n+Pad(n) <= p.r.mask+1: // no wrap: one copy
		b := p.r.data[i : i+n+Pad(n)]
		clear(b[copy(b, payload):])
		p.head += uint64(len(b))
	default:
		p.Write(payload)
		p.Write(zeroPad[:Pad(n)])
	}
	p.word(pos).Store(Seal(pos, h.Len, h.Remote, true))
}

// zeroPad is the padding after a payload.
var zeroPad [Align]byte

// word is the 8-byte word at position pos of the data area, which must be
// a multiple of Align (a record header's first word, its seal).
func (r *Ring) word(pos uint64) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&r.data[pos&r.mask]))
}

// header is the HeaderSize bytes of the data area at position pos, a
// record's start: a multiple of Align, so that they never wrap.
func (r *Ring) header(pos uint64) []byte {
	i := pos & r.mask
	return r.data[i : i+HeaderSize : i+HeaderSize]
}

func (p *Producer) word(pos uint64) *atomic.Uint64 { return p.r.word(pos) }

// Publish makes what was written visible to the consumer. It reports
// whether anything new was published.
func (p *Producer) Publish() bool {
	if p.head == p.pub {
		return false
	}
	p.pub = p.head
	p.r.u64(offHead).Store(p.head)
	return true
}

// Restart moves the producer to the start of the ring's next lap, so
// that the next record is written where the last laps' records were
// rather than further along: a large record then goes to memory the two
// processes touched recently, still in their caches, instead of memory
// last used a whole ring ago. It leaves a lap mark — a seal alone, which
// tells the consumer to continue at the start of the next lap — at head.
// Call it between records, only when the ring is empty (Space returned
// Size) and head is not at the start of a lap; the space left until the
// consumer passes the mark is head's offset in the ring.
func (p *Producer) Restart() {
	pos := p.head
	p.head = (pos | p.r.mask) + 1
	p.word(pos).Store(lapMark(pos))
}

// lapMark is the seal of a lap mark at position pos.
func lapMark(pos uint64) uint64 { return sealBit | lapBit | pos/Align&posMask }

// Offset returns the producer's position in the ring's data area: how far
// head is from the start of its lap.
func (p *Producer) Offset() uint64 { return p.head & p.r.mask }

// Consumer reads from a ring. It is not safe for concurrent use.
type Consumer struct {
	r    *Ring
	tail uint64 // private: bytes read
	pub  uint64 // tail last published
	head uint64 // how far the ring is known to be readable: the head, or the end of a sealed record
	seen uint64 // the producer's head, as last checked
}

// NewConsumer returns the consumer side of r, which must be fresh.
func NewConsumer(r *Ring) *Consumer { return &Consumer{r: r} }

// Ring returns the consumer's ring.
func (c *Consumer) Ring() *Ring { return c.r }

// Avail returns how many bytes can be read now. It reads and checks the
// producer's head.
func (c *Consumer) Avail() (uint64, error) {
	h := c.r.u64(offHead).Load()
	if h < c.seen || h > c.pub+c.r.Size() {
		return 0, fmt.Errorf("%w: head %d outside [%d, %d]", ErrCorrupt, h, c.seen, c.pub+c.r.Size())
	}
	c.seen = h
	c.head = max(c.head, h)
	return c.head - c.tail, nil
}

// Known returns how many bytes can be read by what the consumer already
// knows (the head as last checked, a whole record's seal), without reading
// the producer's head: a lower bound of Avail.
func (c *Consumer) Known() uint64 { return c.head - c.tail }

// Next reports whether the header of the next record can be read: the
// ring is known to hold it, or its seal is in place (which a waiting
// consumer polls instead of the producer's head: it is on the cache line
// the record comes in), or, if head is set, the producer's head says so
// (Avail) — a header published without its seal is corrupt, which
// ParseHeader then reports. A whole record's seal also makes its payload
// readable. A lap mark at the tail (Producer.Restart) first moves the tail
// to the start of the next lap, where the next record is. It fails with
// ErrCorrupt when a whole record's length cannot be right, the head is, or
// a lap mark stands where the consumer has not released everything.
func (c *Consumer) Next(head bool) (bool, error) {
	w := c.r.word(c.tail).Load()
	if w == lapMark(c.tail) {
		// The producer found the ring empty and went on at the start of
		// the next lap (Producer.Restart): it could do so only once this
		// consumer had released everything before the mark.
		if c.pub != c.tail {
			return false, fmt.Errorf("%w: lap mark at position %d, %d bytes after the released tail", ErrCorrupt, c.tail, c.tail-c.pub)
		}
		c.tail = (c.tail | c.r.mask) + 1
		c.head = max(c.head, c.tail)
		w = c.r.word(c.tail).Load()
	}
	if c.head-c.tail >= HeaderSize {
		return true, nil
	}
	if !sealedAt(w, c.tail) {
		if !head {
			return false, nil
		}
		a, err := c.Avail()
		return a >= HeaderSize, err
	}
	end := c.tail + HeaderSize
	if w&wholeBit != 0 {
		n := recordLen(w, c.r.header(c.tail)[lenOff:])
		if n > c.r.Size()-HeaderSize-Pad(n) {
			return false, fmt.Errorf("%w: whole record of %d bytes in a ring of %d", ErrCorrupt, n, c.r.Size())
		}
		end += n + Pad(n)
	}
	c.head = max(c.head, end)
	return true, nil
}

// SealedAt reports whether the header of a record at position pos is in
// place, unchecked: a hint for a waiter that does not hold the consumer.
func (r *Ring) SealedAt(pos uint64) bool { return sealedAt(r.word(pos).Load(), pos) }

// Read copies len(dst) bytes out of the ring; len(dst) must not exceed the
// last Avail minus what was read since. It does not release the space.
func (c *Consumer) Read(dst []byte) {
	for len(dst) > 0 {
		i := c.tail & c.r.mask
		n := copy(dst, c.r.data[i:])
		dst = dst[n:]
		c.tail += uint64(n)
	}
}

// Pos returns how many bytes the consumer has read (published or not).
func (c *Consumer) Pos() uint64 { return c.tail }

// HeadHint is the producer's head, unchecked: a hint that bytes were
// published, for a waiter that does not hold the consumer (Avail checks).
func (r *Ring) HeadHint() uint64 { return r.u64(offHead).Load() }

// PeekInto copies the next len(dst) bytes Read would copy into dst without
// consuming them; len(dst) must not exceed the last Avail minus what was
// read since.
func (c *Consumer) PeekInto(dst []byte) { c.peekAt(c.tail, dst) }

// Header returns the next record's header in place in the ring, for
// ParseHeader, once Next reported it there: a record starts on a multiple
// of Align, so its header never wraps. The producer leaves it alone until
// it is released.
func (c *Consumer) Header() []byte { return c.r.header(c.tail) }

// peekAt copies len(dst) bytes from position t of the ring into dst.
func (c *Consumer) peekAt(t uint64, dst []byte) {
	for len(dst) > 0 {
		i := t & c.r.mask
		n := copy(dst, c.r.data[i:])
		dst = dst[n:]
		t += uint64(n)
	}
}

// Peek returns up to n of the bytes Read would copy next, in place in the
// ring: as many as lie contiguous before the ring wraps. n must not exceed
// the last Avail minus what was read since. Skip consumes them. The slice
// is shared memory the producer may still scribble on.
func (c *Consumer) Peek(n uint64) []byte {
	i := c.tail & c.r.mask
	return c.r.data[i : i+min(n, c.r.mask+1-i)]
}

// Skip drops n bytes, as Read does.
func (c *Consumer) Skip(n uint64) { c.tail += n }

// Release hands what was read back to the producer. It reports whether
// anything new was released.
func (c *Consumer) Release() bool {
	if c.tail == c.pub {
		return false
	}
	c.pub = c.tail
	c.r.u64(offTail).Store(c.tail)
	return true
}

// Record headers.
const (
	// Align is the alignment of every record in the ring: a record's
	// payload is followed by zero padding up to a multiple of Align, so
	// that every record starts on a cache line of its own. A small record
	// then takes one line (two when it straddled one, as 8-byte alignment
	// left most of them), and the producer writing the next record never
	// takes the line the consumer is reading the last one from. With
	// 8-byte alignment, round trips of 8 bytes (40-byte records) took
	// 1.00-1.02 µs against 0.85-0.87 µs for 32 bytes (64-byte records),
	// between 2 processes on the Firecracker VM of BENCHMARKS.md.
	Align = 64
	// HeaderSize is the size of a record header: the seal (u64, which
	// also holds the payload length's bits 39-32), the tag (u32), the
	// payload length's bits 31-0 (u32) and the meta. A multiple of 32, so
	// that a payload is as aligned as its record: a large copy from or into
	// the ring 8 bytes off a 32-byte boundary ran at about half the speed
	// (16 MiB streams at 3.6-3.9 GB/s against 5.7-9.4, with 40-byte
	// headers, on the machine of BENCHMARKS.md).
	HeaderSize = 32
	sealSize   = 8  // the seal, the header's first word
	lenOff     = 12 // the payload length's low word's offset in the header
	// MaxLen is the longest payload a record can carry (40 bits).
	MaxLen = 1<<40 - 1
	// RemoteSize is the size of a remote record's body in the ring:
	// instead of the payload, the address of the payload in the
	// producer's memory, which the consumer reads with process_vm_readv
	// and then acknowledges (Ack).
	RemoteSize = 8
	// RemotePad is the padding after a remote record's body.
	RemotePad = -(HeaderSize + RemoteSize) & (Align - 1)
)

// Pad returns the padding after the n-byte payload of a record, up to
// the next multiple of Align (see Align).
func Pad(n uint64) uint64 { return -(HeaderSize + n) & (Align - 1) }

// Header is a record header: a message's tag, its opaque 16-byte meta
// (the transport.Header) and its payload length. The payload follows it
// in the ring.
type Header struct {
	Tag    uint32
	Len    uint64
	Meta   [16]byte
	Remote bool // a remote record
}

// Seal is the first word of the header of a record at position pos whose
// payload is n bytes: a flag, whether the record is remote and whether it
// was written whole before it was sealed (WriteRecord), bits 39-32 of n,
// and pos/Align in 52 bits, which repeat only after 2^58 bytes (256 PiB)
// through the ring: no word written at an earlier pass over the same place
// of the ring — however many laps ago, which lap restarts make possible
// for places past where the producer restarts — matches it.
func Seal(pos, n uint64, remote, whole bool) uint64 {
	w := sealBit | (n>>32&0xff)<<posBits | pos/Align&posMask
	if remote {
		w |= remoteBit
	}
	if whole {
		w |= wholeBit
	}
	return w
}

// The bits of a seal.
const (
	sealBit   = 1 << 63
	wholeBit  = 1 << 62
	remoteBit = 1 << 61
	lapBit    = 1 << 60 // a lap mark (Producer.Restart), not a record
	posBits   = 52
	posMask   = 1<<posBits - 1
)

// recordLen is the payload length of a record whose seal is w and whose
// header holds lo at lenOff.
func recordLen(w uint64, lo []byte) uint64 {
	return w>>posBits&0xff<<32 | uint64(binary.LittleEndian.Uint32(lo))
}

func sealedAt(w uint64, pos uint64) bool {
	return w&sealBit != 0 && w&posMask == pos/Align&posMask
}

// Put encodes h into b[:HeaderSize] with its first word zero: the
// producer writes that word, the seal, last (WriteHeader, WriteRecord).
func (h *Header) Put(b []byte) {
	_ = b[HeaderSize-1]
	binary.LittleEndian.PutUint64(b[0:], 0)
	binary.LittleEndian.PutUint32(b[8:], h.Tag)
	binary.LittleEndian.PutUint32(b[lenOff:], uint32(h.Len))
	copy(b[16:32], h.Meta[:])
}

// ErrTooLarge is returned by ParseHeader for a record longer than allowed.
var ErrTooLarge = errors.New("ring: record too large")

// ParseHeader decodes and checks the header in b[:HeaderSize], read at
// position pos: it must carry the seal of that position, and its length
// must not exceed max.
func ParseHeader(b []byte, max, pos uint64) (Header, error) {
	_ = b[HeaderSize-1]
	m := binary.LittleEndian.Uint64(b[0:])
	if !sealedAt(m, pos) || m&lapBit != 0 {
		return Header{}, fmt.Errorf("%w: record seal %#x at position %d", ErrCorrupt, m, pos)
	}
	h := Header{Tag: binary.LittleEndian.Uint32(b[8:]), Len: recordLen(m, b[lenOff:]), Remote: m&remoteBit != 0}
	copy(h.Meta[:], b[16:32])
	if h.Len > max {
		return Header{}, fmt.Errorf("%w: %w: %d bytes, limit %d", ErrCorrupt, ErrTooLarge, h.Len, max)
	}
	return h, nil
}
