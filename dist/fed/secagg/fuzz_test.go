package secagg

import (
	"errors"
	"testing"
)

var sentinels = []error{ErrMalformed, ErrRound, ErrConfig, ErrStage, ErrDuplicate, ErrProtocol, ErrAuth, ErrTooFewClients, ErrBadShare}

func known(err error) bool {
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// recording is a complete round of fiveClients: what each client sent at
// each stage, and what the server sent to each client.
type recording struct {
	up   [StageDone]map[int][]byte
	down [StageDone]map[int][]byte
}

// record plays a round and keeps its messages; the clients' randomness is
// seeded, so a new client with the same seed replays its part exactly.
func record(t testing.TB) *recording {
	rec := &recording{}
	s := newSim(t, fiveClients(), 9)
	for st := StageAdvertise; st < StageDone; st++ {
		rec.down[st] = s.out
		rec.up[st] = map[int][]byte{}
		for _, id := range s.cfg.Clients {
			msg, err := s.answer(id)
			if err != nil {
				t.Fatal(err)
			}
			rec.up[st][id] = msg
			if err := s.server.Receive(id, msg); err != nil {
				t.Fatal(err)
			}
		}
		var err error
		if s.out, err = s.server.Advance(); err != nil {
			t.Fatal(err)
		}
	}
	return rec
}

// server replays the recorded round until the server is at st.
func (rec *recording) server(t *testing.T, st Stage) *Server {
	s, err := NewServer(fiveClients())
	if err != nil {
		t.Fatal(err)
	}
	for cur := StageAdvertise; cur < st; cur++ {
		for id, msg := range rec.up[cur] {
			if err := s.Receive(id, msg); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.Advance(); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// client replays client 10's part of the recorded round until it is at st.
func (rec *recording) client(t *testing.T, st Stage) *Client {
	c, err := NewClient(fiveClients(), 10, seeded(9, 10))
	if err != nil {
		t.Fatal(err)
	}
	for cur := StageAdvertise; cur < st; cur++ {
		if _, err := call(c, rec.down[cur][10]); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// call hands msg to the client's method of its current stage.
func call(c *Client, msg []byte) ([]byte, error) {
	switch c.Stage() {
	case StageAdvertise:
		return c.AdvertiseKeys()
	case StageShare:
		return c.ShareKeys(msg)
	case StageMask:
		return c.MaskInput(msg, make([]float64, c.p.Dim), 1)
	default:
		return c.Unmask(msg)
	}
}

// FuzzReceive: whatever bytes reach the server at any stage, Receive
// neither panics nor fails with an unmatchable error, and neither does
// closing the stage.
func FuzzReceive(f *testing.F) {
	rec := record(f)
	for st := StageAdvertise; st < StageDone; st++ {
		f.Add(uint8(st), rec.up[st][10])
	}
	f.Add(uint8(0), []byte("GDSA\x01\x02"))
	f.Fuzz(func(t *testing.T, stage uint8, msg []byte) {
		st := Stage(stage % uint8(StageDone))
		s := rec.server(t, st)
		if err := s.Receive(10, msg); err != nil && !known(err) {
			t.Fatalf("unmatchable error %v", err)
		}
		for id, m := range rec.up[st] {
			if id != 10 {
				if err := s.Receive(id, m); err != nil {
					t.Fatal(err)
				}
			}
		}
		if _, err := s.Advance(); err != nil && !known(err) {
			t.Fatalf("Advance after a fuzzed message: unmatchable error %v", err)
		}
	})
}

// FuzzClient: whatever bytes reach a client at any stage, its method
// neither panics nor fails with an unmatchable error.
func FuzzClient(f *testing.F) {
	rec := record(f)
	for st := StageShare; st < StageDone; st++ {
		f.Add(uint8(st), rec.down[st][10])
	}
	f.Fuzz(func(t *testing.T, stage uint8, msg []byte) {
		c := rec.client(t, 1+Stage(stage%uint8(StageDone-1)))
		if _, err := call(c, msg); err != nil && !known(err) {
			t.Fatalf("unmatchable error %v", err)
		}
	})
}
