package wire

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
)

// NonceSize is the size of the random nonces each side contributes.
const NonceSize = 32

// MACSize is the size of an HMAC-SHA256 tag.
const MACSize = sha256.Size

// Sizes of the handshake payloads.
const (
	HelloSize     = 64             // Hello payload
	ChallengeSize = NonceSize      // Challenge payload: the server nonce
	AuthSize      = MACSize        // Auth payload: the client MAC
	WelcomeSize   = 64 + MACSize   // Welcome payload: the server's HelloInfo, then the server MAC
	MaxAddrLen    = 255            // longest address in Register and Table
	maxTableRank  = MaxAddrLen + 2 // bytes one rank takes in a Table at most
	handshakeMax  = 64 << 10       // bound for handshake frames other than Table
)

// Link modes carried in Hello.Mode.
const (
	ModeMesh       uint8 = 0 // a mesh link between two ranks that know each other's address
	ModeRendezvous uint8 = 1 // a link to rank 0 that registers an address and receives the table
	ModeLink       uint8 = 2 // a link of a star: a transport of two ranks of its own (Listen, Dial)
)

// ErrMalformed is returned for a handshake payload of the wrong size or with
// reserved bytes set.
var ErrMalformed = errors.New("wire: malformed handshake payload")

// MaxHandshakePayload bounds the payload of any handshake frame in a job of
// the given world size (the Table grows with it).
func MaxHandshakePayload(world int) uint64 {
	return max(uint64(max(world, 0))*maxTableRank, handshakeMax)
}

// HelloInfo is what each side states about itself: the Hello payload sent by
// the client, and the first 64 bytes of the Welcome payload sent by the
// server once the client has proved the token.
type HelloInfo struct {
	World      uint32 // world size
	Peer       uint32 // Hello: the rank the client wants; Welcome: the client's rank, echoed
	QueueLimit uint64 // bytes the sender of this payload queues per source (0 = unbounded)
	MaxFrame   uint64 // largest payload the sender of this payload accepts
	Mode       uint8  // ModeMesh, ModeRendezvous or ModeLink
	Nonce      [NonceSize]byte
}

// Put encodes i into b[:HelloSize].
func (i *HelloInfo) Put(b []byte) {
	_ = b[HelloSize-1]
	binary.LittleEndian.PutUint32(b[0:], i.World)
	binary.LittleEndian.PutUint32(b[4:], i.Peer)
	binary.LittleEndian.PutUint64(b[8:], i.QueueLimit)
	binary.LittleEndian.PutUint64(b[16:], i.MaxFrame)
	b[24] = i.Mode
	clear(b[25:32])
	copy(b[32:64], i.Nonce[:])
}

// ParseHello decodes the HelloInfo in b[:HelloSize]. Reserved bytes must be
// zero and Mode known.
func ParseHello(b []byte) (HelloInfo, error) {
	if len(b) < HelloSize {
		return HelloInfo{}, fmt.Errorf("%w: %d bytes, want %d", ErrMalformed, len(b), HelloSize)
	}
	var i HelloInfo
	i.World = binary.LittleEndian.Uint32(b[0:])
	i.Peer = binary.LittleEndian.Uint32(b[4:])
	i.QueueLimit = binary.LittleEndian.Uint64(b[8:])
	i.MaxFrame = binary.LittleEndian.Uint64(b[16:])
	i.Mode = b[24]
	for _, c := range b[25:32] {
		if c != 0 {
			return HelloInfo{}, fmt.Errorf("%w: reserved bytes set", ErrMalformed)
		}
	}
	if i.Mode > ModeLink {
		return HelloInfo{}, fmt.Errorf("%w: mode %d", ErrMalformed, i.Mode)
	}
	copy(i.Nonce[:], b[32:64])
	return i, nil
}

// MAC labels: each side signs with its own label, so a MAC can never be
// reflected back as the other side's proof. The version in them changes
// with the handshake.
const (
	labelServer = "gdist/3 server"
	labelClient = "gdist/3 client"
)

// ClientMAC is the client's proof of the token, sent first: HMAC-SHA256
// keyed by token over "gdist/3 client", the client's Hello payload, the
// server's nonce (the Challenge payload), the client's rank and the
// server's rank (u32 little-endian each).
func ClientMAC(token, hello []byte, serverNonce [NonceSize]byte, clientRank, serverRank uint32) [MACSize]byte {
	return mac(labelClient, token, hello, serverNonce[:], clientRank, serverRank)
}

// ServerMAC is the server's proof, sent in Welcome once the client's proof
// checked out: HMAC-SHA256 keyed by token over "gdist/3 server", the
// client's Hello payload, the first 64 bytes of the Welcome payload (the
// server's HelloInfo, whose nonce is the one of the Challenge), the client's
// rank and the server's rank.
func ServerMAC(token, hello, welcome []byte, clientRank, serverRank uint32) [MACSize]byte {
	return mac(labelServer, token, hello, welcome[:HelloSize], clientRank, serverRank)
}

func mac(label string, token, hello, second []byte, clientRank, serverRank uint32) [MACSize]byte {
	m := hmac.New(sha256.New, token)
	m.Write([]byte(label))
	m.Write(hello[:HelloSize])
	m.Write(second)
	var r [8]byte
	binary.LittleEndian.PutUint32(r[0:], clientRank)
	binary.LittleEndian.PutUint32(r[4:], serverRank)
	m.Write(r[:])
	var out [MACSize]byte
	m.Sum(out[:0])
	return out
}

// AppendTable appends the Table payload for addrs (one per rank) to b:
// for each rank, a u16 little-endian length then the address bytes.
func AppendTable(b []byte, addrs []string) ([]byte, error) {
	for r, a := range addrs {
		if len(a) > MaxAddrLen {
			return nil, fmt.Errorf("%w: address of rank %d is %d bytes (max %d)", ErrMalformed, r, len(a), MaxAddrLen)
		}
		b = binary.LittleEndian.AppendUint16(b, uint16(len(a)))
		b = append(b, a...)
	}
	return b, nil
}

// ParseTable decodes a Table payload holding exactly world addresses.
func ParseTable(b []byte, world int) ([]string, error) {
	addrs := make([]string, 0, world)
	for r := 0; r < world; r++ {
		if len(b) < 2 {
			return nil, fmt.Errorf("%w: table truncated at rank %d", ErrMalformed, r)
		}
		n := int(binary.LittleEndian.Uint16(b))
		b = b[2:]
		if n > MaxAddrLen || len(b) < n {
			return nil, fmt.Errorf("%w: bad address length %d for rank %d", ErrMalformed, n, r)
		}
		addrs = append(addrs, string(b[:n]))
		b = b[n:]
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes after table", ErrMalformed, len(b))
	}
	return addrs, nil
}
