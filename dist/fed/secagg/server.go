package secagg

import (
	"crypto/ecdh"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"sync"
)

// Server is the aggregating side of a round. It does no I/O: the caller
// hands it each client's message with Receive, closes each stage with
// Advance (when every client has answered, Pending is empty, or at a
// deadline) and delivers the messages Advance returns. After the last
// stage, Sum returns the sum of the inputs that arrived. A Server is safe
// for concurrent use; use a new one for every round.
type Server struct {
	mu    sync.Mutex
	p     *params
	stage Stage
	err   error // the failure of an Advance: every later call returns it

	adverts map[int]peer          // U1
	shares  map[int][]byte        // U2: sender -> its validated ciphertext entries
	masked  map[int]bool          // U3
	sum     []uint64              // the sum of U3's masked inputs
	reveals map[int]map[int]share // U5: responder -> owner -> share
	result  *Result
}

// Result is the outcome of a round.
type Result struct {
	// Sum is the weighted sum Σ weight·x over the clients whose input
	// arrived, after clipping and fixed-point rounding: each client adds
	// an error of at most MaxWeight/(2·Scale) per value.
	Sum []float64
	// Weight is the sum of those clients' weights, exactly.
	Weight uint64
	// Clients are the ids of those clients, ascending.
	Clients []int
}

// Mean returns Sum/Weight: the weighted average of the inputs.
func (r *Result) Mean() []float64 {
	m := make([]float64, len(r.Sum))
	for i, v := range r.Sum {
		m[i] = v / float64(r.Weight)
	}
	return m
}

// NewServer returns the server's side of the round cfg.
func NewServer(cfg Config) (*Server, error) {
	p, err := resolve(cfg)
	if err != nil {
		return nil, err
	}
	return &Server{
		p:       p,
		adverts: make(map[int]peer),
		shares:  make(map[int][]byte),
		masked:  make(map[int]bool),
		reveals: make(map[int]map[int]share),
	}, nil
}

// Config returns the round's configuration with its defaults filled in
// (Bits, MaxWeight, and Scale when it was zero).
func (s *Server) Config() Config { return s.p.resolved() }

// Stage returns the current stage.
func (s *Server) Stage() Stage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stage
}

// expected returns the clients that may send a message in the current
// stage, ascending.
func (s *Server) expected() []int {
	switch s.stage {
	case StageAdvertise:
		return s.p.Clients
	case StageShare:
		return sortedKeys(s.adverts)
	case StageMask:
		return sortedKeys(s.shares)
	case StageUnmask:
		return sortedKeys(s.masked)
	}
	return nil
}

// received reports whether client id's message of the current stage arrived.
func (s *Server) received(id int) bool {
	var ok bool
	switch s.stage {
	case StageAdvertise:
		_, ok = s.adverts[id]
	case StageShare:
		_, ok = s.shares[id]
	case StageMask:
		ok = s.masked[id]
	case StageUnmask:
		_, ok = s.reveals[id]
	}
	return ok
}

// Pending returns the clients expected in the current stage that have not
// been heard from yet, ascending: when it is empty the caller can Advance
// without waiting for a deadline.
func (s *Server) Pending() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int
	for _, id := range s.expected() {
		if !s.received(id) {
			out = append(out, id)
		}
	}
	return out
}

// Receive takes client from's message of the current stage (from is the
// sender as the transport knows it; the message must name the same
// client). A refused message leaves the round as it was: the errors are
// ErrStage for a message of another stage (a late client, now treated as
// dropped), ErrRound, ErrConfig, ErrDuplicate, ErrMalformed and
// ErrProtocol. Receive does not retain msg.
func (s *Server) Receive(from int, msg []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return fmt.Errorf("%w: the round failed: %w", ErrStage, s.err)
	}
	var want kind
	switch s.stage {
	case StageAdvertise:
		want = kindAdvert
	case StageShare:
		want = kindShares
	case StageMask:
		want = kindMasked
	case StageUnmask:
		want = kindReveal
	default:
		return fmt.Errorf("%w: message from client %d after the round ended", ErrStage, from)
	}
	id, body, err := s.p.parse(msg, want)
	if err != nil {
		return fmt.Errorf("secagg: from client %d: %w", from, err)
	}
	if id != from {
		return fmt.Errorf("secagg: from client %d: %w: the message names client %d", from, ErrProtocol, id)
	}
	if !slices.Contains(s.expected(), from) {
		return fmt.Errorf("secagg: from client %d: %w: not expected at %v", from, ErrProtocol, s.stage)
	}
	if s.received(from) {
		return fmt.Errorf("secagg: from client %d: %w at %v", from, ErrDuplicate, s.stage)
	}
	switch s.stage {
	case StageAdvertise:
		err = s.receiveAdvert(from, body)
	case StageShare:
		err = s.receiveShares(from, body)
	case StageMask:
		err = s.receiveMasked(from, body)
	case StageUnmask:
		err = s.receiveReveal(from, body)
	}
	if err != nil {
		return fmt.Errorf("secagg: from client %d: %w", from, err)
	}
	return nil
}

func (s *Server) receiveAdvert(from int, body []byte) error {
	if len(body) != advertSize {
		return fmt.Errorf("%w: advert of %d bytes, want %d", ErrMalformed, len(body), advertSize)
	}
	var pr peer
	var err error
	if pr.c, err = ecdh.X25519().NewPublicKey(body[:keySize]); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if pr.s, err = ecdh.X25519().NewPublicKey(body[keySize : 2*keySize]); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	pr.commit = [keySize]byte(body[2*keySize:])
	s.adverts[from] = pr
	return nil
}

// receiveShares checks that the shares are addressed to exactly the other
// clients of U1 and keeps them for forwarding.
func (s *Server) receiveShares(from int, body []byte) error {
	u1 := sortedKeys(s.adverts)
	n, b, err := entries(kindShares, body, sealedEntry, len(u1)-1)
	if err != nil {
		return err
	}
	to, err := s.p.entryIDs(kindShares, b, n, sealedEntry)
	if err != nil {
		return err
	}
	if want := slices.DeleteFunc(u1, func(id int) bool { return id == from }); !slices.Equal(to, want) {
		return fmt.Errorf("%w: shares addressed to %v, want %v", ErrProtocol, to, want)
	}
	s.shares[from] = slices.Clone(b)
	return nil
}

// receiveMasked adds a masked input to the sum.
func (s *Server) receiveMasked(from int, body []byte) error {
	if want := (s.p.Dim + 1) * s.p.width; len(body) != want {
		return fmt.Errorf("%w: masked input of %d bytes, want %d", ErrMalformed, len(body), want)
	}
	if s.sum == nil {
		s.sum = make([]uint64, s.p.Dim+1)
	}
	if s.p.width == 4 {
		for i := range s.sum {
			s.sum[i] += uint64(binary.LittleEndian.Uint32(body[4*i:]))
		}
	} else {
		for i := range s.sum {
			s.sum[i] += binary.LittleEndian.Uint64(body[8*i:])
		}
	}
	s.masked[from] = true
	return nil
}

// receiveReveal checks that a reveal covers exactly U2, with a seed share
// for each client of U3 and a key share for each other, and keeps it.
func (s *Server) receiveReveal(from int, body []byte) error {
	u2 := sortedKeys(s.shares)
	n, b, err := entries(kindReveal, body, revealEntry, len(u2))
	if err != nil {
		return err
	}
	owners, err := s.p.entryIDs(kindReveal, b, n, revealEntry)
	if err != nil {
		return err
	}
	if !slices.Equal(owners, u2) {
		return fmt.Errorf("%w: reveal covers %v, want %v", ErrProtocol, owners, u2)
	}
	got := make(map[int]share, n)
	for i, owner := range owners {
		e := b[i*revealEntry+4 : (i+1)*revealEntry]
		want := byte(revealKey)
		if s.masked[owner] {
			want = revealSeed
		}
		if e[0] != want {
			return fmt.Errorf("%w: reveal for client %d is of kind %d, want %d", ErrProtocol, owner, e[0], want)
		}
		if got[owner], err = parseShare(e[1:]); err != nil {
			return err
		}
	}
	s.reveals[from] = got
	return nil
}

// Advance closes the current stage and returns the messages of the next,
// addressed by client id (the caller owns them): after StageAdvertise the
// key list for each client that advertised, after StageShare the shares
// forwarded to each client that shared, after StageMask the survivor list
// for each client whose input arrived. Advancing from StageUnmask removes
// the masks, returns no messages and leaves the server at StageDone, with
// the sum ready for Sum. A stage that ends with fewer than Threshold
// clients fails the round with a *TooFewError; shares that do not
// reconstruct a secret fail it with ErrBadShare. A failure is final.
func (s *Server) Advance() (map[int][]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, s.err
	}
	var out map[int][]byte
	var err error
	switch s.stage {
	case StageAdvertise:
		out, err = s.keyLists()
	case StageShare:
		out, err = s.forward()
	case StageMask:
		out, err = s.survivors()
	case StageUnmask:
		err = s.unmask()
	default:
		return nil, fmt.Errorf("%w: the round is done", ErrStage)
	}
	if err != nil {
		s.err = err
		return nil, err
	}
	s.stage++
	return out, nil
}

func (s *Server) enough(st Stage, have int) error {
	if have < s.p.Threshold {
		return &TooFewError{Stage: st, Have: have, Need: s.p.Threshold}
	}
	return nil
}

func (s *Server) keyLists() (map[int][]byte, error) {
	u1 := sortedKeys(s.adverts)
	if err := s.enough(StageAdvertise, len(u1)); err != nil {
		return nil, err
	}
	list := make([]byte, 4+len(u1)*listEntry)
	binary.LittleEndian.PutUint32(list, uint32(len(u1)))
	e := list[4:]
	for _, id := range u1 {
		pr := s.adverts[id]
		binary.LittleEndian.PutUint32(e, uint32(id))
		copy(e[4:], pr.c.Bytes())
		copy(e[4+keySize:], pr.s.Bytes())
		copy(e[4+2*keySize:], pr.commit[:])
		e = e[listEntry:]
	}
	return s.p.each(kindKeyList, u1, list), nil
}

// forward hands each client of U2 the ciphertexts the others of U2
// addressed to it; those addressed to clients that did not share are
// dropped.
func (s *Server) forward() (map[int][]byte, error) {
	u2 := sortedKeys(s.shares)
	if err := s.enough(StageShare, len(u2)); err != nil {
		return nil, err
	}
	out := make(map[int][]byte, len(u2))
	bodies := make(map[int][]byte, len(u2))
	for _, id := range u2 {
		msg, body := s.p.message(kindForward, id, 4+(len(u2)-1)*sealedEntry)
		binary.LittleEndian.PutUint32(body, uint32(len(u2)-1))
		out[id], bodies[id] = msg, body[4:]
	}
	for _, from := range u2 { // ascending, so each body's senders ascend
		b := s.shares[from]
		for i := 0; i < len(b); i += sealedEntry {
			to := int(binary.LittleEndian.Uint32(b[i:]))
			dst, ok := bodies[to]
			if !ok {
				continue
			}
			binary.LittleEndian.PutUint32(dst, uint32(from))
			copy(dst[4:sealedEntry], b[i+4:i+sealedEntry])
			bodies[to] = dst[sealedEntry:]
		}
	}
	for id := range s.shares { // keep U2, drop the ciphertexts
		s.shares[id] = nil
	}
	return out, nil
}

func (s *Server) survivors() (map[int][]byte, error) {
	u3 := sortedKeys(s.masked)
	if err := s.enough(StageMask, len(u3)); err != nil {
		return nil, err
	}
	list := make([]byte, 4+4*len(u3))
	binary.LittleEndian.PutUint32(list, uint32(len(u3)))
	for i, v := range u3 {
		binary.LittleEndian.PutUint32(list[4+4*i:], uint32(v))
	}
	return s.p.each(kindSurvivors, u3, list), nil
}

// unmask reconstructs the self-mask seed of every client of U3 and the
// masking key of every client of U2 \ U3 from the first Threshold reveals
// (by client id), and removes their masks from the sum.
func (s *Server) unmask() error {
	p := s.p
	responders := sortedKeys(s.reveals)
	if err := s.enough(StageUnmask, len(responders)); err != nil {
		return err
	}
	responders = responders[:p.Threshold]
	xs := make([]uint64, len(responders))
	for i, id := range responders {
		xs[i] = uint64(p.index[id]) + 1
	}
	shares := make([]share, len(responders))
	reconstruct := func(owner int) ([keySize]byte, error) {
		for i, r := range responders {
			shares[i] = s.reveals[r][owner]
		}
		return combine(xs, shares)
	}
	m := newMasker(p)
	u3 := sortedKeys(s.masked)
	for _, id := range u3 {
		seed, err := reconstruct(id)
		if err != nil || p.commitment(&seed, id) != s.adverts[id].commit {
			return fmt.Errorf("%w: client %d's self-mask seed", ErrBadShare, id)
		}
		m.add(s.sum, p.selfKey(&seed, id), true)
	}
	for _, id := range sortedKeys(s.shares) {
		if s.masked[id] {
			continue
		}
		raw, err := reconstruct(id)
		if err != nil {
			return fmt.Errorf("%w: client %d's masking key", ErrBadShare, id)
		}
		key, err := ecdh.X25519().NewPrivateKey(raw[:])
		if err != nil || !key.PublicKey().Equal(s.adverts[id].s) {
			return fmt.Errorf("%w: client %d's masking key", ErrBadShare, id)
		}
		for _, u := range u3 {
			k, err := p.pairKey(key, s.adverts[u].s, id, u)
			if err != nil {
				return err
			}
			// u added +mask if u < id, -mask if u > id: take it back.
			m.add(s.sum, k, u < id)
		}
	}
	sum, weight := p.dequantize(s.sum)
	s.result = &Result{Sum: sum, Weight: weight, Clients: u3}
	s.sum, s.reveals = nil, nil
	return nil
}

// Sum returns the round's result once the server is at StageDone. The
// caller owns the Result.
func (s *Server) Sum() (*Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, s.err
	}
	if s.stage != StageDone {
		return nil, fmt.Errorf("%w: the round is at %v", ErrStage, s.stage)
	}
	r := *s.result
	r.Sum = slices.Clone(r.Sum)
	r.Clients = slices.Clone(r.Clients)
	return &r, nil
}

func sortedKeys[V any](m map[int]V) []int {
	return slices.Sorted(maps.Keys(m))
}
