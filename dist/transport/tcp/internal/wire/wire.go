package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Magic is the two bytes every frame starts with: "gD".
const Magic = "gD"

// Version is the protocol version this package speaks. A frame with any
// other version is refused.
const Version = 3

// HeaderSize is the size in bytes of every frame header.
const HeaderSize = 40

// MaxPayload is the largest payload length any gdist endpoint may accept,
// whatever its configuration: 1<<40 bytes (1 TiB).
const MaxPayload = 1 << 40

// Kind says what a frame carries.
type Kind uint8

// Frame kinds. Data, Credit, Blocked, Heartbeat, Echo and Goodbye travel on an
// established link; the others only during the handshake. See spec.md.
const (
	Data      Kind = 1 // a message: Src, Tag, Meta (opaque), then Len payload bytes
	Goodbye   Kind = 2 // the sender closed cleanly and will send nothing more
	Heartbeat Kind = 3 // liveness; carries nothing
	Credit    Kind = 4 // the receiver freed Grant bytes of queue space for the sender
	Blocked   Kind = 5 // the sender is waiting for credit
	Echo      Kind = 6 // the answer to a Heartbeat: its Stamp, echoed

	Hello     Kind = 16 // client -> server: ranks, limits, client nonce
	Challenge Kind = 17 // server -> client: the server nonce, nothing else
	Auth      Kind = 18 // client -> server: client MAC (the client proves the token first)
	Welcome   Kind = 19 // server -> client: accepted: server limits, server MAC; the link is up
	Reject    Kind = 20 // server -> client: refused; Tag holds a RejectReason
	Register  Kind = 21 // client -> rank 0 (rendezvous): the address the client listens on
	Table     Kind = 22 // rank 0 -> client (rendezvous): every rank's address
)

var kindNames = map[Kind]string{
	Data: "data", Goodbye: "goodbye", Heartbeat: "heartbeat", Credit: "credit", Blocked: "blocked", Echo: "echo",
	Hello: "hello", Challenge: "challenge", Auth: "auth", Welcome: "welcome", Reject: "reject",
	Register: "register", Table: "table",
}

// String returns the kind's name, or "kind(N)" for an unknown kind.
func (k Kind) String() string {
	if s, ok := kindNames[k]; ok {
		return s
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Valid reports whether k is a kind this version defines.
func (k Kind) Valid() bool {
	return (k >= Data && k <= Echo) || (k >= Hello && k <= Table)
}

// Control reports whether frames of kind k must have an empty payload.
func (k Kind) Control() bool {
	switch k {
	case Goodbye, Heartbeat, Echo, Credit, Blocked, Reject:
		return true
	}
	return false
}

// Handshake reports whether k belongs to the handshake rather than to an
// established link.
func (k Kind) Handshake() bool { return k >= Hello && k <= Table }

// RejectReason is why a server refused a connection; it travels in the Tag
// field of a Reject frame.
type RejectReason uint32

// Reject reasons.
const (
	RejectProtocol  RejectReason = 1 // malformed or unexpected frame, wrong version
	RejectWorld     RejectReason = 2 // the client's world size differs from the server's
	RejectRank      RejectReason = 3 // the client's rank is out of range or not expected here
	RejectDuplicate RejectReason = 4 // a link with that rank already exists
	RejectAuth      RejectReason = 5 // the client failed to prove the job token
	RejectMode      RejectReason = 6 // mesh vs rendezvous mismatch
)

var reasonNames = map[RejectReason]string{
	RejectProtocol: "protocol error", RejectWorld: "world size mismatch", RejectRank: "rank not accepted",
	RejectDuplicate: "duplicate rank", RejectAuth: "authentication failed", RejectMode: "mode mismatch",
}

// String describes the reason.
func (r RejectReason) String() string {
	if s, ok := reasonNames[r]; ok {
		return s
	}
	return fmt.Sprintf("reason(%d)", uint32(r))
}

// Errors returned by Parse. Each error Parse returns matches exactly one of
// them with errors.Is.
var (
	ErrShortHeader   = errors.New("wire: short header")
	ErrBadMagic      = errors.New("wire: bad magic")
	ErrBadVersion    = errors.New("wire: unsupported version")
	ErrBadKind       = errors.New("wire: unknown frame kind")
	ErrBadFlags      = errors.New("wire: reserved flags set")
	ErrControlLength = errors.New("wire: control frame with a payload")
	ErrReserved      = errors.New("wire: unused header bytes set")
	ErrFrameTooLarge = errors.New("wire: frame too large")
)

// FrameTooLargeError is returned by Parse when a header announces a payload
// longer than the caller's maximum. It matches ErrFrameTooLarge.
type FrameTooLargeError struct {
	Len, Max uint64
}

func (e *FrameTooLargeError) Error() string {
	return fmt.Sprintf("wire: frame too large: %d-byte payload, limit %d", e.Len, e.Max)
}

// Is makes errors.Is(err, ErrFrameTooLarge) true.
func (e *FrameTooLargeError) Is(target error) bool { return target == ErrFrameTooLarge }

// MetaSize is the size of the opaque per-message header a Data frame
// carries (transport.HeaderSize).
const MetaSize = 16

// Header is a decoded frame header. Which fields mean something depends on
// Kind; unused fields are zero on the wire.
type Header struct {
	Kind  Kind
	Flags uint32         // reserved; zero in this version
	Src   uint32         // the sender's rank
	Tag   uint32         // Data: message tag; Reject: RejectReason
	Meta  [MetaSize]byte // Data: the message's header, opaque to the transport
	Grant uint64         // Credit: bytes granted (in the first 8 bytes of the meta field)
	Stamp uint64         // Heartbeat, Echo: the prober's stamp; Reject: a detail, e.g. the server's world size (first 8 meta bytes)
	Len   uint64         // payload bytes that follow the header
}

// Put encodes h into b[:HeaderSize] with the current magic and version.
// It panics if len(b) < HeaderSize.
func (h *Header) Put(b []byte) {
	_ = b[HeaderSize-1]
	b[0], b[1] = Magic[0], Magic[1]
	b[2] = Version
	b[3] = byte(h.Kind)
	binary.LittleEndian.PutUint32(b[4:], h.Flags)
	binary.LittleEndian.PutUint32(b[8:], h.Src)
	binary.LittleEndian.PutUint32(b[12:], h.Tag)
	switch h.Kind {
	case Data:
		copy(b[16:32], h.Meta[:])
	case Credit:
		binary.LittleEndian.PutUint64(b[16:], h.Grant)
		clear(b[24:32])
	case Heartbeat, Echo, Reject:
		binary.LittleEndian.PutUint64(b[16:], h.Stamp)
		clear(b[24:32])
	default:
		clear(b[16:32])
	}
	binary.LittleEndian.PutUint64(b[32:], h.Len)
}

func zero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// Parse decodes the header in b[:HeaderSize]. It refuses a short buffer, a
// wrong magic or version, an unknown kind, reserved flags, unused header
// bytes that are not zero, a control frame with a payload, and a payload longer than min(maxPayload, MaxPayload). It
// only reads b and never allocates on success, so the caller can check the
// length before it allocates anything for the payload.
func Parse(b []byte, maxPayload uint64) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, fmt.Errorf("%w: %d bytes", ErrShortHeader, len(b))
	}
	if b[0] != Magic[0] || b[1] != Magic[1] {
		return Header{}, fmt.Errorf("%w: %#02x %#02x", ErrBadMagic, b[0], b[1])
	}
	if b[2] != Version {
		return Header{}, fmt.Errorf("%w: %d (want %d)", ErrBadVersion, b[2], Version)
	}
	h := Header{
		Kind:  Kind(b[3]),
		Flags: binary.LittleEndian.Uint32(b[4:]),
		Src:   binary.LittleEndian.Uint32(b[8:]),
		Tag:   binary.LittleEndian.Uint32(b[12:]),
		Len:   binary.LittleEndian.Uint64(b[32:]),
	}
	switch h.Kind {
	case Data:
		copy(h.Meta[:], b[16:32])
	case Credit:
		h.Grant = binary.LittleEndian.Uint64(b[16:])
		if !zero(b[24:32]) {
			return Header{}, fmt.Errorf("%w: credit frame bytes 24..31", ErrReserved)
		}
	case Heartbeat, Echo, Reject:
		h.Stamp = binary.LittleEndian.Uint64(b[16:])
		if !zero(b[24:32]) {
			return Header{}, fmt.Errorf("%w: %s frame bytes 24..31", ErrReserved, h.Kind)
		}
	default:
		if k := Kind(b[3]); k.Valid() && !zero(b[16:32]) {
			return Header{}, fmt.Errorf("%w: %s frame bytes 16..31", ErrReserved, k)
		}
	}
	if !h.Kind.Valid() {
		return Header{}, fmt.Errorf("%w: %d", ErrBadKind, uint8(h.Kind))
	}
	if h.Flags != 0 {
		return Header{}, fmt.Errorf("%w: %#x", ErrBadFlags, h.Flags)
	}
	if h.Kind.Control() && h.Len != 0 {
		return Header{}, fmt.Errorf("%w: %s frame with %d bytes", ErrControlLength, h.Kind, h.Len)
	}
	limit := min(maxPayload, MaxPayload)
	if h.Len > limit {
		return Header{}, &FrameTooLargeError{Len: h.Len, Max: limit}
	}
	return h, nil
}
