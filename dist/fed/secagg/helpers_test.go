package secagg

import (
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"testing"
)

// seeded returns a deterministic randomness source for client id.
func seeded(seed uint64, id int) io.Reader {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], seed)
	binary.LittleEndian.PutUint64(s[8:], uint64(id))
	return rand.NewChaCha8(s)
}

// sim is a round run in memory, with every message carried by the test.
type sim struct {
	cfg     Config
	server  *Server
	clients map[int]*Client
	// drop[id] is the first stage at which client id sends nothing; a
	// client absent from drop completes the round.
	drop map[int]Stage
	x    map[int][]float64
	w    map[int]uint64
	// out holds the server's messages of the current stage.
	out map[int][]byte
	// up counts the bytes each client sent and received.
	up, down map[int]int
}

func newSim(t testing.TB, cfg Config, seed uint64) *sim {
	t.Helper()
	s := &sim{cfg: cfg, clients: map[int]*Client{}, drop: map[int]Stage{},
		x: map[int][]float64{}, w: map[int]uint64{}, up: map[int]int{}, down: map[int]int{}}
	var err error
	if s.server, err = NewServer(cfg); err != nil {
		t.Fatal(err)
	}
	for _, id := range cfg.Clients {
		if s.clients[id], err = NewClient(cfg, id, seeded(seed, id)); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// dropAt is the stage at which client id stops.
func (s *sim) dropAt(id int) Stage {
	if st, ok := s.drop[id]; ok {
		return st
	}
	return StageDone
}

// step has every client that is still in the round answer the server's
// message of the current stage, and hands the answers to the server.
func (s *sim) step() error {
	st := s.server.Stage()
	ids := s.cfg.Clients
	if st != StageAdvertise {
		ids = sortedKeys(s.out)
	}
	for _, id := range ids {
		if s.dropAt(id) <= st {
			continue
		}
		msg, err := s.answer(id)
		if err != nil {
			return fmt.Errorf("client %d at %v: %w", id, st, err)
		}
		s.up[id] += len(msg)
		if err := s.server.Receive(id, msg); err != nil {
			return fmt.Errorf("server at %v: %w", st, err)
		}
	}
	out, err := s.server.Advance()
	s.out = out
	return err
}

// answer returns client id's answer to the server's message of the
// current stage, without delivering it.
func (s *sim) answer(id int) ([]byte, error) {
	c := s.clients[id]
	in := s.out[id]
	s.down[id] += len(in)
	switch s.server.Stage() {
	case StageAdvertise:
		return c.AdvertiseKeys()
	case StageShare:
		return c.ShareKeys(in)
	case StageMask:
		w := s.w[id]
		if w == 0 {
			w = 1
		}
		x := s.x[id]
		if x == nil {
			x = make([]float64, s.cfg.Dim)
		}
		return c.MaskInput(in, x, w)
	case StageUnmask:
		return c.Unmask(in)
	}
	return nil, ErrStage
}

// until plays the round until the server is at stage st.
func (s *sim) until(st Stage) error {
	for s.server.Stage() < st {
		if err := s.step(); err != nil {
			return err
		}
	}
	return nil
}

// run plays the round to the end and returns the server's result.
func (s *sim) run() (*Result, error) {
	for s.server.Stage() != StageDone {
		if err := s.step(); err != nil {
			return nil, err
		}
	}
	return s.server.Sum()
}

// contributors are the clients whose input the sum should hold.
func (s *sim) contributors() []int {
	var ids []int
	for _, id := range s.cfg.Clients {
		if s.dropAt(id) > StageMask {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// ids returns n distinct client ids drawn from r, not necessarily small
// or contiguous.
func ids(r *rand.Rand, n int) []int {
	out := make([]int, 0, n)
	for len(out) < n {
		id := r.IntN(1000)
		if r.IntN(8) == 0 {
			id = MaxID - r.IntN(100)
		}
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

func le32(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }
