package secagg

import (
	"crypto/cipher"
	"crypto/ecdh"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"slices"
)

// Stage is a step of the round. The server closes each with Advance; a
// client moves on with each of its methods.
type Stage int

// The stages of a round, in order.
const (
	// StageAdvertise: clients send their public keys (Client.AdvertiseKeys).
	StageAdvertise Stage = iota
	// StageShare: clients send encrypted shares of their secrets (Client.ShareKeys).
	StageShare
	// StageMask: clients send their masked inputs (Client.MaskInput).
	StageMask
	// StageUnmask: clients reveal the shares that remove the masks (Client.Unmask).
	StageUnmask
	// StageDone: the server knows the sum; a client has nothing more to send.
	StageDone
)

var stageNames = [...]string{"advertise keys", "share keys", "masked input", "unmasking", "done"}

func (s Stage) String() string {
	if s >= 0 && int(s) < len(stageNames) {
		return stageNames[s]
	}
	return fmt.Sprintf("Stage(%d)", int(s))
}

// Client is one client's side of a round. It does no I/O: each method takes
// the server's message of the previous stage and returns the message to
// send to the server. Use a new Client for every round; it is not safe for
// concurrent use. After a method fails, every later one fails with ErrStage
// wrapping that error: the client is out of the round.
type Client struct {
	p     *params
	id    int
	rand  io.Reader
	stage Stage
	err   error

	cKey   *ecdh.PrivateKey // encrypts the shares between clients
	sKey   *ecdh.PrivateKey // agrees the pairwise masks; shared for dropout recovery
	seed   [keySize]byte    // the self-mask seed; shared for unmasking
	commit [keySize]byte

	peers map[int]peer        // the clients that advertised keys (U1), this one included
	u1    []int               // their ids, ascending
	aeads map[int]cipher.AEAD // per other client of U1: seals the shares sent, opens those received
	held  map[int]pair        // shares of the secrets of the clients that shared (U2)
	u2    []int               // their ids, ascending
	plain bool                // tests only: send the quantized input without masks
	mask  *masker
}

// cryptoRand is crypto/rand's reader, which NewClient's parameter hides.
var cryptoRand = rand.Reader

// peer is a client's advertised public keys.
type peer struct {
	c, s   *ecdh.PublicKey
	commit [keySize]byte
}

// pair is the shares one client holds of another's masking key and seed.
type pair struct{ key, seed share }

// NewClient returns client id's side of the round cfg, with fresh keys and
// seed drawn from rand (crypto/rand if nil). cfg must equal the server's.
func NewClient(cfg Config, id int, rand io.Reader) (*Client, error) {
	p, err := resolve(cfg)
	if err != nil {
		return nil, err
	}
	if _, ok := p.index[id]; !ok {
		return nil, fmt.Errorf("secagg: %w: client %d is not in Config.Clients", ErrInvalidArgument, id)
	}
	if rand == nil {
		rand = cryptoRand
	}
	c := &Client{p: p, id: id, rand: rand, stage: StageAdvertise}
	if c.cKey, err = newPrivateKey(rand); err != nil {
		return nil, err
	}
	if c.sKey, err = newPrivateKey(rand); err != nil {
		return nil, err
	}
	if _, err := io.ReadFull(rand, c.seed[:]); err != nil {
		return nil, fmt.Errorf("secagg: reading randomness: %w", err)
	}
	c.commit = p.commitment(&c.seed, id)
	return c, nil
}

// ID returns the client's id.
func (c *Client) ID() int { return c.id }

// Stage returns the stage whose method the client expects next.
func (c *Client) Stage() Stage { return c.stage }

// Config returns the round's configuration with its defaults filled in
// (Bits, MaxWeight, and Scale when it was zero).
func (c *Client) Config() Config { return c.p.resolved() }

// enter checks that the client is at stage s.
func (c *Client) enter(s Stage) error {
	if c.err != nil {
		return fmt.Errorf("%w: client %d failed earlier: %w", ErrStage, c.id, c.err)
	}
	if c.stage != s {
		return fmt.Errorf("%w: client %d is at %v, not %v", ErrStage, c.id, c.stage, s)
	}
	return nil
}

// run does the work of stage st and moves the client to the next stage,
// or records the failure.
func (c *Client) run(st Stage, work func() ([]byte, error)) ([]byte, error) {
	if err := c.enter(st); err != nil {
		return nil, err
	}
	msg, err := work()
	if err != nil {
		return nil, c.fail(err)
	}
	if c.stage = st + 1; c.stage == StageDone {
		c.forget()
	}
	return msg, nil
}

// fail records err as the client's failure.
func (c *Client) fail(err error) error {
	c.err = fmt.Errorf("secagg: client %d: %w", c.id, err)
	c.stage = StageDone
	c.forget()
	return c.err
}

// forget drops the client's secrets.
func (c *Client) forget() {
	clear(c.seed[:])
	c.held, c.aeads = nil, nil
	c.cKey, c.sKey = nil, nil
}

// AdvertiseKeys returns the client's first message: its two public keys
// and a commitment to its self-mask seed.
func (c *Client) AdvertiseKeys() ([]byte, error) {
	return c.run(StageAdvertise, func() ([]byte, error) {
		msg, body := c.p.message(kindAdvert, c.id, advertSize)
		copy(body, c.cKey.PublicKey().Bytes())
		copy(body[keySize:], c.sKey.PublicKey().Bytes())
		copy(body[2*keySize:], c.commit[:])
		return msg, nil
	})
}

// ShareKeys takes the server's key list and returns the client's shares:
// its masking key and self-mask seed, split t-of-n among the clients of
// the list and encrypted for each.
func (c *Client) ShareKeys(keyList []byte) ([]byte, error) {
	return c.run(StageShare, func() ([]byte, error) { return c.shareKeys(keyList) })
}

func (c *Client) shareKeys(keyList []byte) ([]byte, error) {
	p := c.p
	ids, b, err := c.list(keyList, kindKeyList, listEntry, p.n, 0, StageAdvertise)
	if err != nil {
		return nil, err
	}
	n := len(ids)
	peers, err := parsePeers(ids, b)
	if err != nil {
		return nil, err
	}
	me, ok := peers[c.id]
	if !ok || !me.c.Equal(c.cKey.PublicKey()) || !me.s.Equal(c.sKey.PublicKey()) || me.commit != c.commit {
		return nil, fmt.Errorf("%w: the key list does not hold this client's keys", ErrProtocol)
	}
	c.peers, c.u1 = peers, ids

	xs := make([]uint64, n)
	for i, id := range ids {
		xs[i] = uint64(p.index[id]) + 1
	}
	var key [keySize]byte
	copy(key[:], c.sKey.Bytes())
	keyShares, err := split(&key, p.Threshold, xs, c.rand)
	clear(key[:])
	if err != nil {
		return nil, err
	}
	seedShares, err := split(&c.seed, p.Threshold, xs, c.rand)
	if err != nil {
		return nil, err
	}
	msg, out := p.message(kindShares, c.id, 4+(n-1)*sealedEntry)
	binary.LittleEndian.PutUint32(out, uint32(n-1))
	out = out[4:]
	plain := make([]byte, plainSize)
	c.held = make(map[int]pair, n)
	c.aeads = make(map[int]cipher.AEAD, n-1)
	for i, id := range ids {
		if id == c.id {
			c.held[id] = pair{key: keyShares[i], seed: seedShares[i]}
			continue
		}
		aead, err := p.shareAEAD(c.cKey, peers[id].c, c.id, id)
		if err != nil {
			return nil, err
		}
		c.aeads[id] = aead
		keyShares[i].put(plain)
		seedShares[i].put(plain[shareSize:])
		binary.LittleEndian.PutUint32(out, uint32(id))
		aead.Seal(out[4:4], shareNonce(c.id, id), plain, shareAD(c.id, id))
		out = out[sealedEntry:]
	}
	clear(plain)
	return msg, nil
}

// list parses a server message of kind k addressed to this client: a list
// of at most limit entries of size bytes each, which with the self clients
// left out of it (0 or 1) must reach the threshold, as the server's stage
// st must have. It returns the ids that start the entries and the entries.
func (c *Client) list(msg []byte, k kind, size, limit, self int, st Stage) ([]int, []byte, error) {
	p := c.p
	to, body, err := p.parse(msg, k)
	if err != nil {
		return nil, nil, err
	}
	if to != c.id {
		return nil, nil, fmt.Errorf("%w: %v addressed to client %d", ErrProtocol, k, to)
	}
	n, b, err := entries(k, body, size, limit)
	if err != nil {
		return nil, nil, err
	}
	if n+self < p.Threshold {
		return nil, nil, &TooFewError{Stage: st, Have: n + self, Need: p.Threshold}
	}
	ids, err := p.entryIDs(k, b, n, size)
	return ids, b, err
}

// parsePeers decodes the adverts of a key list and refuses repeated keys.
func parsePeers(ids []int, b []byte) (map[int]peer, error) {
	peers := make(map[int]peer, len(ids))
	seen := make(map[[keySize]byte]bool, 2*len(ids))
	for i, id := range ids {
		e := b[i*listEntry+4 : (i+1)*listEntry]
		var pr peer
		for j, dst := range []**ecdh.PublicKey{&pr.c, &pr.s} {
			raw := [keySize]byte(e[j*keySize:])
			if seen[raw] {
				return nil, fmt.Errorf("%w: key list repeats a public key (client %d)", ErrProtocol, id)
			}
			seen[raw] = true
			k, err := ecdh.X25519().NewPublicKey(raw[:])
			if err != nil {
				return nil, fmt.Errorf("%w: client %d's public key: %v", ErrMalformed, id, err)
			}
			*dst = k
		}
		pr.commit = [keySize]byte(e[2*keySize:])
		peers[id] = pr
	}
	return peers, nil
}

// MaskInput takes the shares the server forwarded to this client and
// returns the client's masked input: x clipped, weighted by
// weight/MaxWeight, quantized, with weight appended, plus the client's
// self mask and one pairwise mask per client that shared its keys. weight
// is in [1, MaxWeight] (use 1 for an unweighted sum). x is not retained.
// An invalid x or weight is refused with ErrInvalidArgument and the client
// stays at StageMask.
func (c *Client) MaskInput(forwarded []byte, x []float64, weight uint64) ([]byte, error) {
	return maskInput(c, forwarded, x, weight)
}

// MaskInput32 is MaskInput for a float32 input.
func (c *Client) MaskInput32(forwarded []byte, x []float32, weight uint64) ([]byte, error) {
	return maskInput(c, forwarded, x, weight)
}

func maskInput[T float32 | float64](c *Client, forwarded []byte, x []T, weight uint64) ([]byte, error) {
	if err := c.enter(StageMask); err != nil {
		return nil, err
	}
	if err := checkInput(c.p, x, weight); err != nil {
		return nil, err
	}
	return c.run(StageMask, func() ([]byte, error) {
		if err := c.receiveShares(forwarded); err != nil {
			return nil, err
		}
		y := make([]uint64, c.p.Dim+1)
		quantize(c.p, y, x, weight)
		if err := c.addMasks(y); err != nil {
			return nil, err
		}
		msg, body := c.p.message(kindMasked, c.id, len(y)*c.p.width)
		putRing(body, y, c.p.width)
		return msg, nil
	})
}

// receiveShares decrypts the forwarded shares; their senders are U2.
func (c *Client) receiveShares(forwarded []byte) error {
	from, b, err := c.list(forwarded, kindForward, sealedEntry, len(c.u1)-1, 1, StageShare)
	if err != nil {
		return err
	}
	plain := make([]byte, plainSize)
	defer clear(plain)
	for i, id := range from {
		aead, ok := c.aeads[id]
		if !ok {
			return fmt.Errorf("%w: shares from client %d, which did not advertise keys to this client", ErrProtocol, id)
		}
		e := b[i*sealedEntry+4 : (i+1)*sealedEntry]
		if _, err := aead.Open(plain[:0], shareNonce(id, c.id), e, shareAD(id, c.id)); err != nil {
			return fmt.Errorf("%w: shares from client %d", ErrAuth, id)
		}
		var sh pair
		if sh.key, err = parseShare(plain); err != nil {
			return err
		}
		if sh.seed, err = parseShare(plain[shareSize:]); err != nil {
			return err
		}
		c.held[id] = sh
	}
	c.u2 = append(from, c.id)
	slices.Sort(c.u2)
	return nil
}

// addMasks adds the self mask and the pairwise masks with U2 to y: +mask
// towards a client with a higher id, -mask towards a lower one, so that
// each pair's masks cancel in the sum.
func (c *Client) addMasks(y []uint64) error {
	if c.plain {
		return nil
	}
	if c.mask == nil {
		c.mask = newMasker(c.p)
	}
	c.mask.add(y, c.p.selfKey(&c.seed, c.id), false)
	for _, id := range c.u2 {
		if id == c.id {
			continue
		}
		key, err := c.p.pairKey(c.sKey, c.peers[id].s, c.id, id)
		if err != nil {
			return err
		}
		c.mask.add(y, key, c.id > id)
	}
	return nil
}

// putRing encodes ring elements, width bytes each.
func putRing(dst []byte, y []uint64, width int) {
	if width == 4 {
		for i, v := range y {
			binary.LittleEndian.PutUint32(dst[4*i:], uint32(v))
		}
		return
	}
	for i, v := range y {
		binary.LittleEndian.PutUint64(dst[8*i:], v)
	}
}

// Unmask takes the server's list of the clients whose masked inputs
// arrived (U3) and returns this client's reveal: for each client that
// shared its keys, the share of its self-mask seed if its input arrived,
// else the share of its masking key. It refuses a list that is not a
// subset of the clients that shared, that leaves this client out, or that
// is shorter than the threshold.
func (c *Client) Unmask(survivors []byte) ([]byte, error) {
	return c.run(StageUnmask, func() ([]byte, error) { return c.unmask(survivors) })
}

func (c *Client) unmask(survivors []byte) ([]byte, error) {
	p := c.p
	u3, _, err := c.list(survivors, kindSurvivors, 4, len(c.u2), 0, StageMask)
	if err != nil {
		return nil, err
	}
	in := make(map[int]bool, len(u3))
	for _, id := range u3 {
		if _, ok := c.held[id]; !ok {
			return nil, fmt.Errorf("%w: survivor %d did not share its keys", ErrProtocol, id)
		}
		in[id] = true
	}
	if !in[c.id] {
		return nil, fmt.Errorf("%w: the survivor list leaves out this client", ErrProtocol)
	}
	msg, out := p.message(kindReveal, c.id, 4+len(c.u2)*revealEntry)
	binary.LittleEndian.PutUint32(out, uint32(len(c.u2)))
	out = out[4:]
	for _, id := range c.u2 {
		binary.LittleEndian.PutUint32(out, uint32(id))
		sh := c.held[id]
		if in[id] {
			out[4] = revealSeed
			sh.seed.put(out[5:])
		} else {
			out[4] = revealKey
			sh.key.put(out[5:])
		}
		out = out[revealEntry:]
	}
	return msg, nil
}
