package secagg

import (
	"encoding/binary"
	"fmt"
)

// The wire format; spec.md describes it.

const (
	magic      = "GDSA"
	version    = 1
	headerSize = 32

	advertSize  = 3 * keySize       // encryption key, masking key, seed commitment
	listEntry   = 4 + advertSize    // id, advert
	sealedEntry = 4 + sealedSize    // peer id, ciphertext
	revealEntry = 4 + 1 + shareSize // owner id, what, share
	revealSeed  = 1                 // a share of the owner's self-mask seed
	revealKey   = 2                 // a share of the owner's masking key
)

// kind is a message's type.
type kind uint8

const (
	kindAdvert    kind = 1 + iota // client → server: public keys, seed commitment
	kindKeyList                   // server → client: every advertising client's keys
	kindShares                    // client → server: encrypted shares, one per peer
	kindForward                   // server → client: the shares addressed to it
	kindMasked                    // client → server: the masked input
	kindSurvivors                 // server → client: the clients whose input arrived
	kindReveal                    // client → server: shares for unmasking
	kindEnd
)

var kindNames = [...]string{"", "advert", "key list", "shares", "forwarded shares", "masked input", "survivors", "reveal"}

func (k kind) String() string {
	if k > 0 && k < kindEnd {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// message starts a message of kind k about client id (its sender, or its
// recipient for the server's messages) with room for a body of n bytes,
// and returns it and the body.
func (p *params) message(k kind, id, n int) (msg, body []byte) {
	msg = make([]byte, headerSize+n)
	copy(msg, magic)
	msg[4] = version
	msg[5] = byte(k)
	binary.LittleEndian.PutUint64(msg[8:], p.Round)
	binary.LittleEndian.PutUint64(msg[16:], p.fp)
	binary.LittleEndian.PutUint32(msg[24:], uint32(id))
	binary.LittleEndian.PutUint32(msg[28:], uint32(n))
	return msg, msg[headerSize:]
}

// each returns a message of kind k with the same body for each client of ids.
func (p *params) each(k kind, ids []int, body []byte) map[int][]byte {
	out := make(map[int][]byte, len(ids))
	for _, id := range ids {
		msg, b := p.message(k, id, len(body))
		copy(b, body)
		out[id] = msg
	}
	return out
}

// parse checks a message's header against this configuration and the kind
// the current stage expects, and returns the client id it names and its
// body (a slice of msg).
func (p *params) parse(msg []byte, want kind) (int, []byte, error) {
	if len(msg) < headerSize {
		return 0, nil, fmt.Errorf("%w: %d bytes, shorter than a header", ErrMalformed, len(msg))
	}
	if string(msg[:4]) != magic {
		return 0, nil, fmt.Errorf("%w: bad magic %q", ErrMalformed, msg[:4])
	}
	if msg[4] != version {
		return 0, nil, fmt.Errorf("%w: version %d, want %d", ErrVersion, msg[4], version)
	}
	k := kind(msg[5])
	if k < kindAdvert || k >= kindEnd || msg[6] != 0 || msg[7] != 0 {
		return 0, nil, fmt.Errorf("%w: kind %d, reserved %#x", ErrMalformed, msg[5], msg[6:8])
	}
	if r := binary.LittleEndian.Uint64(msg[8:]); r != p.Round {
		return 0, nil, fmt.Errorf("%w: %v of round %d in round %d", ErrRound, k, r, p.Round)
	}
	if fp := binary.LittleEndian.Uint64(msg[16:]); fp != p.fp {
		return 0, nil, fmt.Errorf("%w: %v with fingerprint %016x, want %016x", ErrConfig, k, fp, p.fp)
	}
	if k != want {
		return 0, nil, fmt.Errorf("%w: got a %v, want a %v", ErrStage, k, want)
	}
	id := binary.LittleEndian.Uint32(msg[24:])
	if n := binary.LittleEndian.Uint32(msg[28:]); uint64(n) != uint64(len(msg)-headerSize) {
		return 0, nil, fmt.Errorf("%w: %v: body length %d, message carries %d", ErrMalformed, k, n, len(msg)-headerSize)
	}
	if id > MaxID {
		return 0, nil, fmt.Errorf("%w: %v: client id %d", ErrMalformed, k, id)
	}
	return int(id), msg[headerSize:], nil
}

// entries splits a body made of a count and that many entries of size
// bytes each, checking the count against limit before anything is sized
// by it.
func entries(k kind, body []byte, size, limit int) (int, []byte, error) {
	if len(body) < 4 {
		return 0, nil, fmt.Errorf("%w: %v: body of %d bytes has no count", ErrMalformed, k, len(body))
	}
	n := binary.LittleEndian.Uint32(body)
	if uint64(n) > uint64(limit) {
		return 0, nil, fmt.Errorf("%w: %v: %d entries, at most %d", ErrMalformed, k, n, limit)
	}
	if len(body) != 4+int(n)*size {
		return 0, nil, fmt.Errorf("%w: %v: %d entries in %d bytes", ErrMalformed, k, n, len(body)-4)
	}
	return int(n), body[4:], nil
}

// entryIDs reads the id at the start of each entry, checks they ascend and are
// clients of the configuration, and returns them.
func (p *params) entryIDs(k kind, b []byte, n, size int) ([]int, error) {
	ids := make([]int, n)
	for i := range ids {
		id := binary.LittleEndian.Uint32(b[i*size:])
		if id > MaxID {
			return nil, fmt.Errorf("%w: %v: client id %d", ErrMalformed, k, id)
		}
		ids[i] = int(id)
		if _, ok := p.index[ids[i]]; !ok {
			return nil, fmt.Errorf("%w: %v names client %d, which is not in the round", ErrProtocol, k, id)
		}
		if i > 0 && ids[i] <= ids[i-1] {
			return nil, fmt.Errorf("%w: %v: client ids not ascending (%d after %d)", ErrProtocol, k, ids[i], ids[i-1])
		}
	}
	return ids, nil
}
