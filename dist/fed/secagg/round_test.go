package secagg

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// fixedInputs gives each client an input on the fixed-point grid of p that
// stays exact after weighting: x = j·MaxWeight/Scale for an integer j, so
// that x·w·Scale/MaxWeight = j·w. It returns the plain weighted sum and
// total weight of the clients in sum.
func fixedInputs(s *sim, p *params, r *rand.Rand, sum []int) ([]float64, uint64) {
	m := float64(p.MaxWeight)
	jmax := min((p.q-1)/int64(p.MaxWeight), 1<<12) // |x| < Clip; sums below 2^53
	want := make([]float64, p.Dim)
	var weight uint64
	for _, id := range p.Clients {
		w := 1 + r.Uint64N(p.MaxWeight)
		x := make([]float64, p.Dim)
		for i := range x {
			j := r.Int64N(2*jmax+1) - jmax
			x[i] = float64(j) * m / p.Scale
		}
		s.x[id], s.w[id] = x, w
		if slices.Contains(sum, id) {
			for i, v := range x {
				want[i] += v * float64(w)
			}
			weight += w
		}
	}
	return want, weight
}

// firstShort returns the first stage that ends with fewer than t clients
// when clients stop at drop, and how many it has.
func firstShort(s *sim) (Stage, int, bool) {
	for st := StageAdvertise; st < StageDone; st++ {
		have := 0
		for _, id := range s.cfg.Clients {
			if s.dropAt(id) > st {
				have++
			}
		}
		if have < s.cfg.Threshold {
			return st, have, true
		}
	}
	return 0, 0, false
}

// TestRoundExact: over random client sets, thresholds, dimensions, ring
// widths, weights and dropouts at every stage, the round's sum equals the
// plain weighted sum exactly, or the round fails with a *TooFewError for
// the first stage that fell below the threshold.
func TestRoundExact(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 4))
	cases := 300
	if testing.Short() {
		cases = 60
	}
	var exact, short int
	for c := range cases {
		n := 2 + r.IntN(11)
		tt := n/2 + 1 + r.IntN(n-n/2)
		dim := 1 + r.IntN(300)
		if c%7 == 0 {
			dim = 1
		}
		bits := []int{32, 64}[r.IntN(2)]
		maxW := []uint64{1, 1, 7, 60000}[r.IntN(4)]
		cfg := Config{Round: uint64(c), Clients: ids(r, n), Threshold: tt, Dim: dim, Clip: []float64{1, 0.25, 8, 1000}[r.IntN(4)],
			Bits: bits, MaxWeight: maxW}
		s := newSim(t, cfg, uint64(c))
		// Up to n-t dropouts leave enough clients; one more in every
		// fifth case fails the round at the stage where it falls short.
		ndrop := r.IntN(n - tt + 1)
		if c%5 == 0 {
			ndrop = n - tt + 1
		}
		for _, i := range r.Perm(n)[:ndrop] {
			s.drop[cfg.Clients[i]] = Stage(r.IntN(int(StageDone)))
		}
		p := s.server.p
		want, weight := fixedInputs(s, p, r, s.contributors())
		res, err := s.run()
		if st, have, ok := firstShort(s); ok {
			var te *TooFewError
			if !errors.As(err, &te) || !errors.Is(err, ErrTooFewClients) || te.Stage != st || te.Have != have || te.Need != tt {
				t.Fatalf("case %d (n=%d t=%d): err = %v, want a TooFewError at %v with %d", c, n, tt, err, st, have)
			}
			short++
			continue
		}
		if err != nil {
			t.Fatalf("case %d (n=%d t=%d dim=%d bits=%d drop=%v): %v", c, n, tt, dim, bits, s.drop, err)
		}
		if !slices.Equal(res.Clients, s.contributors()) {
			t.Fatalf("case %d: clients %v, want %v", c, res.Clients, s.contributors())
		}
		if res.Weight != weight {
			t.Fatalf("case %d: weight %d, want %d", c, res.Weight, weight)
		}
		for i := range want {
			if res.Sum[i] != want[i] {
				t.Fatalf("case %d (n=%d t=%d dim=%d bits=%d maxW=%d): sum[%d] = %v, want %v",
					c, n, tt, dim, bits, maxW, i, res.Sum[i], want[i])
			}
		}
		exact++
	}
	t.Logf("%d rounds exact, %d failed short as expected", exact, short)
	if exact < cases/2 || short < cases/10 {
		t.Errorf("the cases exercised too little: %d exact, %d short", exact, short)
	}
}

func fiveClients() Config {
	return Config{Round: 3, Clients: []int{10, 11, 12, 13, 14}, Threshold: 3, Dim: 1000, Clip: 4}
}

// runWith plays a round of fiveClients with the given dropouts and returns
// the result and the plain sum of the expected contributors.
func runWith(t *testing.T, drop map[int]Stage) (*Result, []float64, []int) {
	t.Helper()
	s := newSim(t, fiveClients(), 1)
	s.drop = drop
	want, _ := fixedInputs(s, s.server.p, rand.New(rand.NewPCG(1, 2)), s.contributors())
	res, err := s.run()
	if err != nil {
		t.Fatal(err)
	}
	return res, want, s.contributors()
}

func checkSum(t *testing.T, res *Result, want []float64, clients []int) {
	t.Helper()
	if !slices.Equal(res.Clients, clients) {
		t.Fatalf("clients %v, want %v", res.Clients, clients)
	}
	if res.Weight != uint64(len(clients)) {
		t.Fatalf("weight %d, want %d", res.Weight, len(clients))
	}
	for i := range want {
		if res.Sum[i] != want[i] {
			t.Fatalf("sum[%d] = %v, want %v", i, res.Sum[i], want[i])
		}
	}
}

// TestDropoutAfterSharing: a client that shared its keys and then dropped
// (its masks are in the others' inputs) leaves the exact sum of the rest,
// its masks recovered from the survivors' shares of its key.
func TestDropoutAfterSharing(t *testing.T) {
	for _, drop := range []map[int]Stage{
		{12: StageMask},
		{10: StageMask, 14: StageMask},
	} {
		res, want, clients := runWith(t, drop)
		if len(clients) != 5-len(drop) {
			t.Fatalf("contributors %v", clients)
		}
		checkSum(t, res, want, clients)
	}
}

// TestDropoutAfterInput: a client whose masked input arrived and that then
// dropped (it sends no reveal) is still in the sum: its self mask comes
// back from the others' shares of its seed.
func TestDropoutAfterInput(t *testing.T) {
	res, want, clients := runWith(t, map[int]Stage{11: StageUnmask, 13: StageUnmask})
	if len(clients) != 5 {
		t.Fatalf("contributors %v", clients)
	}
	checkSum(t, res, want, clients)
}

// TestDropoutBeforeSharing: a client that advertised keys but shared
// nothing is left out of the masks and the sum; one that never advertised
// likewise.
func TestDropoutBeforeSharing(t *testing.T) {
	res, want, clients := runWith(t, map[int]Stage{10: StageShare, 14: StageAdvertise})
	checkSum(t, res, want, clients)
	if slices.Contains(res.Clients, 10) || slices.Contains(res.Clients, 14) {
		t.Fatalf("clients %v include a client that dropped before sharing", res.Clients)
	}
}

// TestTooFewSurvivors: fewer than t clients at any stage fails the round
// with a *TooFewError naming the stage, and the failure is final.
func TestTooFewSurvivors(t *testing.T) {
	for st := StageAdvertise; st < StageDone; st++ {
		s := newSim(t, fiveClients(), 2)
		s.drop = map[int]Stage{10: st, 11: st, 12: st}
		fixedInputs(s, s.server.p, rand.New(rand.NewPCG(1, 2)), nil)
		_, err := s.run()
		var te *TooFewError
		if !errors.As(err, &te) || !errors.Is(err, ErrTooFewClients) || te.Stage != st || te.Have != 2 || te.Need != 3 {
			t.Fatalf("stage %v: err = %v, want a TooFewError", st, err)
		}
		if _, err := s.server.Advance(); !errors.Is(err, ErrTooFewClients) {
			t.Errorf("stage %v: Advance after the failure: %v", st, err)
		}
		if _, err := s.server.Sum(); !errors.Is(err, ErrTooFewClients) {
			t.Errorf("stage %v: Sum after the failure: %v", st, err)
		}
		if err := s.server.Receive(10, []byte("x")); !errors.Is(err, ErrStage) {
			t.Errorf("stage %v: Receive after the failure: %v", st, err)
		}
	}
}

// TestLateInput: a masked input that arrives after the server closed the
// masking stage is refused with ErrStage; the client counts as dropped, its
// pairwise masks are removed with its reconstructed key, and its self mask
// is never revealed: the late vector cannot be unmasked.
func TestLateInput(t *testing.T) {
	s := newSim(t, fiveClients(), 3)
	r := rand.New(rand.NewPCG(5, 6))
	late := 12
	s.drop = map[int]Stage{late: StageMask}
	want, _ := fixedInputs(s, s.server.p, r, s.contributors())
	if err := s.until(StageMask); err != nil {
		t.Fatal(err)
	}
	forwarded := s.out[late]
	if err := s.step(); err != nil { // closes the masking stage without the late client
		t.Fatal(err)
	}
	msg, err := s.clients[late].MaskInput(forwarded, s.x[late], 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.server.Receive(late, msg); !errors.Is(err, ErrStage) {
		t.Fatalf("late input: %v, want ErrStage", err)
	}
	// The survivors reveal key shares for the late client, not seed shares.
	for _, id := range sortedKeys(s.out) {
		reply, err := s.clients[id].Unmask(s.out[id])
		if err != nil {
			t.Fatal(err)
		}
		if kindOf(t, reply, late) != revealKey {
			t.Fatalf("client %d revealed the late client's seed", id)
		}
		if err := s.server.Receive(id, reply); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.server.Advance(); err != nil {
		t.Fatal(err)
	}
	res, err := s.server.Sum()
	if err != nil {
		t.Fatal(err)
	}
	checkSum(t, res, want, s.contributors())
}

// kindOf returns what a reveal holds for client owner.
func kindOf(t *testing.T, reveal []byte, owner int) byte {
	b := reveal[headerSize+4:]
	for i := 0; i < len(b); i += revealEntry {
		if int(le32(b[i:])) == owner {
			return b[i+4]
		}
	}
	t.Fatalf("the reveal has no entry for %d", owner)
	return 0
}

// TestClipAndBound: inputs beyond the clip range are clipped, and n
// clients all at +Clip or all at -Clip with the largest weight fill the
// ring without wrapping, with the automatic scale and in both widths.
func TestClipAndBound(t *testing.T) {
	for _, bits := range []int{32, 64} {
		for _, sign := range []float64{1, -1} {
			cfg := Config{Clients: []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19},
				Threshold: 11, Dim: 3, Clip: 0.75, Bits: bits, MaxWeight: 1000}
			s := newSim(t, cfg, 4)
			for _, id := range cfg.Clients {
				s.x[id] = []float64{sign * 0.75, sign * 1e9, sign * math.Inf(1)}
				s.w[id] = 1000
			}
			res, err := s.run()
			if err != nil {
				t.Fatal(err)
			}
			p := s.server.p
			limit := float64(uint64(1)<<(bits-1) - 1)
			if float64(20*p.q) > limit || 20*math.Round(0.75*2*p.Scale) <= limit {
				t.Errorf("bits %d: scale %v gives q %d: not the largest power of two under the bound", bits, p.Scale, p.q)
			}
			want := sign * float64(20*p.q) / p.Scale * 1000
			for i, v := range res.Sum {
				if v != want {
					t.Errorf("bits %d sign %v: sum[%d] = %v, want %v", bits, sign, i, v, want)
				}
			}
			if res.Weight != 20000 {
				t.Errorf("weight %d", res.Weight)
			}
			if m := res.Mean(); math.Abs(m[0]-sign*0.75) > 1e-6 {
				t.Errorf("mean %v", m)
			}
		}
	}
}

// TestWeightedMean: real-valued inputs off the grid give the weighted
// mean within the documented rounding error, for float64 and float32
// inputs.
func TestWeightedMean(t *testing.T) {
	cfg := Config{Clients: []int{1, 2, 3, 4}, Threshold: 3, Dim: 500, Clip: 2, MaxWeight: 60000}
	r := rand.New(rand.NewPCG(8, 9))
	for _, f32 := range []bool{false, true} {
		s := newSim(t, cfg, 5)
		p := s.server.p
		want := make([]float64, cfg.Dim)
		var total float64
		for _, id := range cfg.Clients {
			w := 1 + r.Uint64N(60000)
			x := make([]float64, cfg.Dim)
			for i := range x {
				x[i] = r.NormFloat64()
				if f32 {
					x[i] = float64(float32(x[i]))
				}
				want[i] += float64(w) * min(max(x[i], -2), 2)
			}
			s.x[id], s.w[id] = x, w
			total += float64(w)
		}
		var res *Result
		var err error
		if f32 {
			res, err = runF32(s)
		} else {
			res, err = s.run()
		}
		if err != nil {
			t.Fatal(err)
		}
		tol := 4 * 0.5 * float64(p.MaxWeight) / p.Scale
		mean := res.Mean()
		for i := range want {
			if d := math.Abs(res.Sum[i] - want[i]); d > tol {
				t.Fatalf("f32 %v: sum[%d] off by %v > %v", f32, i, d, tol)
			}
			if d := math.Abs(mean[i] - want[i]/total); d > tol/total {
				t.Fatalf("f32 %v: mean[%d] off by %v", f32, i, d)
			}
		}
	}
}

// runF32 plays a round with the clients sending float32 inputs.
func runF32(s *sim) (*Result, error) {
	if err := s.until(StageMask); err != nil {
		return nil, err
	}
	for _, id := range sortedKeys(s.out) {
		x := make([]float32, len(s.x[id]))
		for i, v := range s.x[id] {
			x[i] = float32(v)
		}
		msg, err := s.clients[id].MaskInput32(s.out[id], x, s.w[id])
		if err != nil {
			return nil, err
		}
		if err := s.server.Receive(id, msg); err != nil {
			return nil, err
		}
	}
	var err error
	if s.out, err = s.server.Advance(); err != nil {
		return nil, err
	}
	return s.run()
}
