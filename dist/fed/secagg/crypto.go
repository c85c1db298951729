package secagg

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdh"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
)

const (
	keySize    = 32                  // X25519 keys, seeds, commitments and AES-256 keys
	tagSize    = 16                  // AES-GCM tag
	plainSize  = 2 * shareSize       // a key share and a seed share
	sealedSize = plainSize + tagSize // their encryption
	bufSize    = 32 << 10            // keystream buffer of a masker
	labelSelf  = "gdist/secagg/1 self mask"
	labelPair  = "gdist/secagg/1 pair mask"
	labelShare = "gdist/secagg/1 share key"
	labelSeed  = "gdist/secagg/1 seed commitment"
)

// newPrivateKey draws an X25519 private key from r.
func newPrivateKey(r io.Reader) (*ecdh.PrivateKey, error) {
	var b [keySize]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return nil, fmt.Errorf("secagg: reading randomness: %w", err)
	}
	k, err := ecdh.X25519().NewPrivateKey(b[:])
	clear(b[:])
	return k, err
}

// info binds a derived key to the round, the configuration, a purpose and
// a pair of client ids.
func (p *params) info(label string, a, b int) string {
	info := make([]byte, 0, len(label)+24)
	info = append(info, label...)
	info = binary.LittleEndian.AppendUint64(info, p.Round)
	info = binary.LittleEndian.AppendUint64(info, p.fp)
	info = binary.LittleEndian.AppendUint32(info, uint32(a))
	info = binary.LittleEndian.AppendUint32(info, uint32(b))
	return string(info)
}

// derive expands secret into a 32-byte key for (label, a, b) with HKDF-SHA256.
func (p *params) derive(secret []byte, label string, a, b int) []byte {
	k, err := hkdf.Key(sha256.New, secret, nil, p.info(label, a, b), keySize)
	if err != nil { // only for lengths above 255 hash blocks
		panic(err)
	}
	return k
}

// pairKey is the key of the mask between clients a and b, from the X25519
// agreement of one's private key with the other's public key.
func (p *params) pairKey(priv *ecdh.PrivateKey, pub *ecdh.PublicKey, a, b int) ([]byte, error) {
	ss, err := priv.ECDH(pub)
	if err != nil { // a low-order public key
		return nil, fmt.Errorf("%w: key agreement between clients %d and %d: %v", ErrProtocol, a, b, err)
	}
	return p.derive(ss, labelPair, min(a, b), max(a, b)), nil
}

// selfKey is the key of client id's self mask.
func (p *params) selfKey(seed *[keySize]byte, id int) []byte {
	return p.derive(seed[:], labelSelf, id, id)
}

// commitment binds client id to its self-mask seed, so that the server can
// check the seed it reconstructs.
func (p *params) commitment(seed *[keySize]byte, id int) [keySize]byte {
	h := sha256.New()
	h.Write([]byte(p.info(labelSeed, id, id)))
	h.Write(seed[:])
	var c [keySize]byte
	h.Sum(c[:0])
	return c
}

// shareAEAD is the AES-256-GCM cipher for the shares between clients a and
// b, keyed by the agreement of their encryption keys.
func (p *params) shareAEAD(priv *ecdh.PrivateKey, pub *ecdh.PublicKey, a, b int) (cipher.AEAD, error) {
	ss, err := priv.ECDH(pub)
	if err != nil {
		return nil, fmt.Errorf("%w: key agreement between clients %d and %d: %v", ErrProtocol, a, b, err)
	}
	block, err := aes.NewCipher(p.derive(ss, labelShare, min(a, b), max(a, b)))
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// shareNonce is unique per key and direction: each pair's key encrypts one
// message each way.
func shareNonce(from, to int) []byte {
	n := make([]byte, 12)
	binary.LittleEndian.PutUint32(n, uint32(from))
	binary.LittleEndian.PutUint32(n[4:], uint32(to))
	return n
}

// shareAD is the associated data of a share ciphertext.
func shareAD(from, to int) []byte { return shareNonce(from, to)[:8] }

// masker expands 32-byte keys into masks of ring elements with AES-256 in
// counter mode (zero IV: every key is used for one stream).
type masker struct {
	width int
	buf   []byte
}

func newMasker(p *params) *masker { return &masker{width: p.width, buf: make([]byte, bufSize)} }

// add adds the mask of key to dst (subtracts it if neg), modulo 2^64; the
// caller reduces modulo 2^k when it encodes.
func (m *masker) add(dst []uint64, key []byte, neg bool) {
	block, err := aes.NewCipher(key)
	if err != nil {
		panic(err) // key is always 32 bytes
	}
	var iv [aes.BlockSize]byte
	ctr := cipher.NewCTR(block, iv[:])
	per := len(m.buf) / m.width
	for off := 0; off < len(dst); off += per {
		seg := dst[off:min(off+per, len(dst))]
		b := m.buf[:len(seg)*m.width]
		clear(b)
		ctr.XORKeyStream(b, b)
		switch {
		case m.width == 4 && !neg:
			for i := range seg {
				seg[i] += uint64(binary.LittleEndian.Uint32(b[4*i:]))
			}
		case m.width == 4:
			for i := range seg {
				seg[i] -= uint64(binary.LittleEndian.Uint32(b[4*i:]))
			}
		case !neg:
			for i := range seg {
				seg[i] += binary.LittleEndian.Uint64(b[8*i:])
			}
		default:
			for i := range seg {
				seg[i] -= binary.LittleEndian.Uint64(b[8*i:])
			}
		}
	}
}
