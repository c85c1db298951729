package secagg

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// at returns a round of fiveClients, with the given clients dropping, played
// until the server is at st.
func at(t *testing.T, st Stage, drop map[int]Stage) *sim {
	t.Helper()
	s := newSim(t, fiveClients(), 9)
	if drop != nil {
		s.drop = drop
	}
	if err := s.until(st); err != nil {
		t.Fatal(err)
	}
	return s
}

// rebuild returns a message of kind k about client id with body b, under
// p's round and fingerprint.
func rebuild(p *params, k kind, id int, b []byte) []byte {
	msg, body := p.message(k, id, len(b))
	copy(body, b)
	return msg
}

// edit returns a copy of msg changed by f.
func edit(msg []byte, f func(b []byte)) []byte {
	b := slices.Clone(msg)
	f(b)
	return b
}

func put32(b []byte, off int, v uint32) { binary.LittleEndian.PutUint32(b[off:], v) }

// TestServerRefuses: malformed, misrouted, stale, duplicate and forged
// messages are refused by the server with matchable errors, and a refused
// message leaves the round able to finish with the exact sum.
func TestServerRefuses(t *testing.T) {
	other := fiveClients()
	other.Dim++
	po, err := resolve(other)
	if err != nil {
		t.Fatal(err)
	}
	type tc struct {
		name string
		st   Stage
		from int
		// msg builds the message to refuse from client 10's valid answer.
		msg  func(s *sim, valid []byte) []byte
		want []error
	}
	h := func(off int, v byte) func(*sim, []byte) []byte {
		return func(_ *sim, m []byte) []byte { return edit(m, func(b []byte) { b[off] = v }) }
	}
	cases := []tc{
		{"empty", StageAdvertise, 10, func(*sim, []byte) []byte { return nil }, []error{ErrMalformed}},
		{"short header", StageAdvertise, 10, func(_ *sim, m []byte) []byte { return m[:headerSize-1] }, []error{ErrMalformed}},
		{"magic", StageAdvertise, 10, h(0, 'X'), []error{ErrMalformed}},
		{"version", StageAdvertise, 10, h(4, 2), []error{ErrVersion, ErrMalformed}},
		{"kind zero", StageAdvertise, 10, h(5, 0), []error{ErrMalformed}},
		{"kind unknown", StageAdvertise, 10, h(5, 99), []error{ErrMalformed}},
		{"reserved", StageAdvertise, 10, h(6, 1), []error{ErrMalformed}},
		{"round", StageAdvertise, 10, h(8, 4), []error{ErrRound}},
		{"config", StageAdvertise, 10, func(_ *sim, m []byte) []byte { return rebuild(po, kindAdvert, 10, m[headerSize:]) }, []error{ErrConfig}},
		{"body length field", StageAdvertise, 10, h(28, 95), []error{ErrMalformed}},
		{"body length huge", StageAdvertise, 10, func(_ *sim, m []byte) []byte {
			return edit(m, func(b []byte) { put32(b, 28, 0xFFFFFFFF) })
		}, []error{ErrMalformed}},
		{"short advert", StageAdvertise, 10, func(s *sim, m []byte) []byte {
			return rebuild(s.server.p, kindAdvert, 10, m[headerSize:len(m)-1])
		}, []error{ErrMalformed}},
		{"early kind", StageAdvertise, 10, func(s *sim, m []byte) []byte {
			return rebuild(s.server.p, kindMasked, 10, make([]byte, 4*1001))
		}, []error{ErrStage}},
		{"names another sender", StageAdvertise, 11, func(_ *sim, m []byte) []byte { return m }, []error{ErrProtocol}},
		{"not sampled", StageAdvertise, 99, func(s *sim, m []byte) []byte {
			return rebuild(s.server.p, kindAdvert, 99, m[headerSize:])
		}, []error{ErrProtocol}},
		{"duplicate", StageAdvertise, 10, func(s *sim, m []byte) []byte {
			if err := s.server.Receive(10, m); err != nil {
				t.Fatal(err)
			}
			return m
		}, []error{ErrDuplicate}},
		{"shares count above n", StageShare, 10, func(_ *sim, m []byte) []byte {
			return edit(m, func(b []byte) { put32(b, headerSize, 1<<31) })
		}, []error{ErrMalformed}},
		{"shares count disagrees", StageShare, 10, func(_ *sim, m []byte) []byte {
			return edit(m, func(b []byte) { put32(b, headerSize, 3) })
		}, []error{ErrMalformed}},
		{"shares for a stranger", StageShare, 10, func(_ *sim, m []byte) []byte {
			return edit(m, func(b []byte) { put32(b, headerSize+4+3*sealedEntry, 99) })
		}, []error{ErrProtocol}},
		{"shares for itself", StageShare, 10, func(_ *sim, m []byte) []byte {
			return edit(m, func(b []byte) { put32(b, headerSize+4, 10) })
		}, []error{ErrProtocol}},
		{"shares out of order", StageShare, 10, func(_ *sim, m []byte) []byte {
			return edit(m, func(b []byte) { put32(b, headerSize+4, 13) })
		}, []error{ErrProtocol}},
		{"late advert", StageShare, 10, func(s *sim, _ []byte) []byte {
			return rebuild(s.server.p, kindAdvert, 10, make([]byte, advertSize))
		}, []error{ErrStage}},
		{"masked wrong length", StageMask, 10, func(s *sim, m []byte) []byte {
			return rebuild(s.server.p, kindMasked, 10, m[headerSize:len(m)-4])
		}, []error{ErrMalformed}},
		{"reveal wrong kind", StageUnmask, 10, func(_ *sim, m []byte) []byte {
			return edit(m, func(b []byte) { b[headerSize+4+4] = revealKey })
		}, []error{ErrProtocol}},
		{"reveal unknown kind", StageUnmask, 10, func(_ *sim, m []byte) []byte {
			return edit(m, func(b []byte) { b[headerSize+4+4] = 7 })
		}, []error{ErrProtocol}},
		{"reveal share outside the field", StageUnmask, 10, func(_ *sim, m []byte) []byte {
			return edit(m, func(b []byte) { binary.LittleEndian.PutUint64(b[headerSize+4+5:], prime) })
		}, []error{ErrMalformed}},
		{"reveal misses a client", StageUnmask, 10, func(s *sim, m []byte) []byte {
			b := m[headerSize:]
			short := slices.Concat([]byte{4, 0, 0, 0}, b[4:4+4*revealEntry])
			return rebuild(s.server.p, kindReveal, 10, short)
		}, []error{ErrProtocol}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newSim(t, fiveClients(), 9)
			contributors := s.contributors()
			if c.st < StageMask {
				contributors = contributors[1:] // client 10 drops after this stage
			}
			want, _ := fixedInputs(s, s.server.p, rand.New(rand.NewPCG(3, 3)), contributors)
			if err := s.until(c.st); err != nil {
				t.Fatal(err)
			}
			valid, err := s.answer(10)
			if err != nil {
				t.Fatal(err)
			}
			err = s.server.Receive(c.from, c.msg(s, valid))
			for _, w := range c.want {
				if !errors.Is(err, w) {
					t.Fatalf("err = %v, want %v", err, w)
				}
			}
			// The round goes on: the valid message (unless it already
			// arrived) and then the others.
			if !slices.Contains(c.want, ErrDuplicate) {
				if err := s.server.Receive(10, valid); err != nil {
					t.Fatalf("valid message after the refused one: %v", err)
				}
			}
			s.drop[10] = s.server.Stage() // it answered this stage and drops
			res, err := s.run()
			if err != nil {
				t.Fatalf("round after the refused message: %v", err)
			}
			checkSum(t, res, want, contributors)
		})
	}
}

// TestForgedShareDetected: a reveal whose share was altered (a field
// element still in range) passes Receive but does not reconstruct the
// secret: Advance fails the round with ErrBadShare, for a seed share and
// for a key share.
func TestForgedShareDetected(t *testing.T) {
	for _, dropped := range []bool{false, true} {
		s := newSim(t, fiveClients(), 10)
		if dropped {
			s.drop[14] = StageMask // the reveals carry key shares for 14
		}
		if err := s.until(StageUnmask); err != nil {
			t.Fatal(err)
		}
		for _, id := range sortedKeys(s.out) {
			msg, err := s.answer(id)
			if err != nil {
				t.Fatal(err)
			}
			if id == 10 { // the lowest responder: its shares are used
				msg = edit(msg, func(b []byte) {
					// The entry for client 14, its fifth chunk: a change
					// to the low bits of the first chunk of a key share
					// could vanish in X25519's clamping, which makes an
					// equivalent key.
					e := headerSize + 4 + 4*revealEntry + 5 + 4*8
					v := binary.LittleEndian.Uint64(b[e:])
					binary.LittleEndian.PutUint64(b[e:], (v+1)%prime)
				})
			}
			if err := s.server.Receive(id, msg); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.server.Advance(); !errors.Is(err, ErrBadShare) {
			t.Fatalf("dropped=%v: Advance = %v, want ErrBadShare", dropped, err)
		}
	}
}

// TestClientRefuses: a client refuses server messages that are malformed,
// misaddressed, inconsistent with the earlier stages or forged, with
// matchable errors, and is out of the round afterwards.
func TestClientRefuses(t *testing.T) {
	type tc struct {
		name string
		st   Stage
		drop map[int]Stage
		msg  func(s *sim, valid []byte) []byte
		want error
	}
	list := func(s *sim, m []byte, f func(b []byte)) []byte {
		return edit(m, f)
	}
	entry := func(i int) int { return headerSize + 4 + i*listEntry }
	cases := []tc{
		{"key list to another", StageShare, nil, func(_ *sim, m []byte) []byte {
			return edit(m, func(b []byte) { put32(b, 24, 11) })
		}, ErrProtocol},
		{"key list without own keys", StageShare, nil, func(s *sim, m []byte) []byte {
			return list(s, m, func(b []byte) { b[entry(0)+4] ^= 1 })
		}, ErrProtocol},
		{"key list repeats a key", StageShare, nil, func(s *sim, m []byte) []byte {
			return list(s, m, func(b []byte) { copy(b[entry(2)+4:entry(2)+4+keySize], b[entry(1)+4:]) })
		}, ErrProtocol},
		{"key list with a low-order key", StageShare, nil, func(s *sim, m []byte) []byte {
			return list(s, m, func(b []byte) { clear(b[entry(1)+4 : entry(1)+4+keySize]) })
		}, ErrProtocol},
		{"key list of a stranger", StageShare, nil, func(s *sim, m []byte) []byte {
			return list(s, m, func(b []byte) { put32(b, entry(4), 99) })
		}, ErrProtocol},
		{"key list too short", StageShare, nil, func(s *sim, m []byte) []byte {
			b := m[headerSize:]
			return rebuild(s.server.p, kindKeyList, 10, slices.Concat([]byte{2, 0, 0, 0}, b[4:4+2*listEntry]))
		}, ErrTooFewClients},
		{"key list count huge", StageShare, nil, func(s *sim, m []byte) []byte {
			return edit(m, func(b []byte) { put32(b, headerSize, 0xFFFFFFFF) })
		}, ErrMalformed},
		{"forwarded share altered", StageMask, nil, func(_ *sim, m []byte) []byte {
			return edit(m, func(b []byte) { b[headerSize+4+4+10] ^= 1 })
		}, ErrAuth},
		{"forwarded share from another sender", StageMask, nil, func(_ *sim, m []byte) []byte {
			return edit(m, func(b []byte) {
				e0, e1 := headerSize+4, headerSize+4+sealedEntry
				tmp := slices.Clone(b[e0+4 : e0+sealedEntry])
				copy(b[e0+4:], b[e1+4:e1+sealedEntry])
				copy(b[e1+4:], tmp)
			})
		}, ErrAuth},
		{"survivors of a stranger", StageUnmask, nil, func(s *sim, m []byte) []byte {
			return edit(m, func(b []byte) { put32(b, headerSize+4+4*4, 99) })
		}, ErrProtocol},
		{"survivors not a subset of the sharers", StageUnmask, map[int]Stage{14: StageShare}, func(s *sim, m []byte) []byte {
			return rebuild(s.server.p, kindSurvivors, 10, []byte{4, 0, 0, 0, 10, 0, 0, 0, 11, 0, 0, 0, 12, 0, 0, 0, 14, 0, 0, 0})
		}, ErrProtocol},
		{"survivors without the client", StageUnmask, nil, func(s *sim, m []byte) []byte {
			return rebuild(s.server.p, kindSurvivors, 10, []byte{3, 0, 0, 0, 11, 0, 0, 0, 12, 0, 0, 0, 13, 0, 0, 0})
		}, ErrProtocol},
		{"survivors too few", StageUnmask, nil, func(s *sim, m []byte) []byte {
			return rebuild(s.server.p, kindSurvivors, 10, []byte{2, 0, 0, 0, 10, 0, 0, 0, 11, 0, 0, 0})
		}, ErrTooFewClients},
		{"survivors of another round", StageUnmask, nil, func(_ *sim, m []byte) []byte {
			return edit(m, func(b []byte) { b[8]++ })
		}, ErrRound},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := at(t, c.st, c.drop)
			s.out[10] = c.msg(s, s.out[10])
			_, err := s.answer(10)
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			s.out[10] = nil
			if _, err := s.answer(10); !errors.Is(err, ErrStage) || !errors.Is(err, c.want) {
				t.Fatalf("a later call after the failure: %v, want ErrStage wrapping %v", err, c.want)
			}
		})
	}
}

// TestClientMisuse: calls out of order fail with ErrStage; a bad input
// fails with ErrInvalidArgument and leaves the client able to send a good
// one.
func TestClientMisuse(t *testing.T) {
	s := at(t, StageAdvertise, nil)
	c := s.clients[10]
	if _, err := c.ShareKeys(nil); !errors.Is(err, ErrStage) {
		t.Fatalf("ShareKeys first: %v", err)
	}
	if _, err := c.Unmask(nil); !errors.Is(err, ErrStage) {
		t.Fatalf("Unmask first: %v", err)
	}
	if err := s.until(StageMask); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AdvertiseKeys(); !errors.Is(err, ErrStage) {
		t.Fatalf("AdvertiseKeys again: %v", err)
	}
	in := s.out[10]
	for name, call := range map[string]func() ([]byte, error){
		"short input": func() ([]byte, error) { return c.MaskInput(in, make([]float64, 999), 1) },
		"NaN":         func() ([]byte, error) { x := make([]float64, 1000); x[5] = math.NaN(); return c.MaskInput(in, x, 1) },
		"NaN f32": func() ([]byte, error) {
			x := make([]float32, 1000)
			x[5] = float32(math.NaN())
			return c.MaskInput32(in, x, 1)
		},
		"weight 0":     func() ([]byte, error) { return c.MaskInput(in, make([]float64, 1000), 0) },
		"weight above": func() ([]byte, error) { return c.MaskInput(in, make([]float64, 1000), 2) },
	} {
		if _, err := call(); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
	if c.Stage() != StageMask {
		t.Fatalf("stage %v after bad inputs", c.Stage())
	}
	if _, err := s.run(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.server.Advance(); !errors.Is(err, ErrStage) {
		t.Fatalf("Advance after the end: %v", err)
	}
	if err := s.server.Receive(10, nil); !errors.Is(err, ErrStage) {
		t.Fatalf("Receive after the end: %v", err)
	}
}
