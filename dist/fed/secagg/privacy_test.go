package secagg

import (
	"math"
	"slices"
	"testing"

	"gonum.org/v1/gonum/stat/distuv"
)

// serverView runs a round up to client 0's masked input with its input
// set to x and weight w, and returns what the server receives from client
// 0: its ring elements. masked=false sends the quantized input without
// masks (the control).
func serverView(t *testing.T, seed uint64, x float64, w uint64, masked bool) []uint64 {
	t.Helper()
	cfg := Config{Round: seed, Clients: []int{0, 1, 2}, Threshold: 2, Dim: 16, Clip: 1, MaxWeight: 1000}
	s := newSim(t, cfg, seed)
	s.clients[0].plain = !masked
	for _, id := range cfg.Clients {
		s.x[id] = slices.Repeat([]float64{0.5}, cfg.Dim)
		s.w[id] = 500
	}
	s.x[0], s.w[0] = slices.Repeat([]float64{x}, cfg.Dim), w
	if err := s.until(StageMask); err != nil {
		t.Fatal(err)
	}
	msg, err := s.clients[0].MaskInput(s.out[0], s.x[0], s.w[0])
	if err != nil {
		t.Fatal(err)
	}
	body := msg[headerSize:]
	y := make([]uint64, cfg.Dim+1)
	for i := range y {
		y[i] = uint64(le32(body[4*i:]))
	}
	return y
}

// views collects the server's views of client 0 over trials rounds with
// seeds from base, as fractions of the ring in [0, 1).
func views(t *testing.T, trials int, base uint64, x float64, w uint64, masked bool) []float64 {
	var out []float64
	for i := range trials {
		for _, v := range serverView(t, base+uint64(i), x, w, masked) {
			out = append(out, float64(v)/(1<<32))
		}
	}
	return out
}

// chiSquare2 is the two-sample chi-square test on bins equal-width bins of
// [0, 1): it returns the p-value of "a and b come from one distribution".
func chiSquare2(a, b []float64, bins int) float64 {
	ca, cb := make([]float64, bins), make([]float64, bins)
	for _, v := range a {
		ca[int(v*float64(bins))]++
	}
	for _, v := range b {
		cb[int(v*float64(bins))]++
	}
	ka, kb := math.Sqrt(float64(len(b))/float64(len(a))), math.Sqrt(float64(len(a))/float64(len(b)))
	stat, df := 0.0, -1
	for i := range ca {
		if ca[i]+cb[i] == 0 {
			continue
		}
		d := ka*ca[i] - kb*cb[i]
		stat += d * d / (ca[i] + cb[i])
		df++
	}
	if df < 1 {
		return 0 // all in one bin: a point mass, nothing like the uniform
	}
	return distuv.ChiSquared{K: float64(df)}.Survival(stat)
}

// ks2 is the two-sample Kolmogorov-Smirnov test: it returns the
// asymptotic p-value of "a and b come from one distribution".
func ks2(a, b []float64) float64 {
	a, b = slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b))
	d := 0.0
	for i, j := 0, 0; i < len(a) && j < len(b); {
		v := min(a[i], b[j])
		for i < len(a) && a[i] == v {
			i++
		}
		for j < len(b) && b[j] == v {
			j++
		}
		d = max(d, math.Abs(float64(i)/float64(len(a))-float64(j)/float64(len(b))))
	}
	ne := float64(len(a)) * float64(len(b)) / float64(len(a)+len(b))
	lambda := (math.Sqrt(ne) + 0.12 + 0.11/math.Sqrt(ne)) * d
	p := 0.0
	for k := 1; k <= 100; k++ {
		term := 2 * math.Exp(-2*float64(k*k)*lambda*lambda)
		if k%2 == 0 {
			term = -term
		}
		p += term
	}
	return min(max(p, 0), 1)
}

// TestServerViewIndependentOfInput: the masked vector the server receives
// from a client has the same distribution whether the client's input is
// all -Clip with weight 1 or all +Clip with weight MaxWeight: over many
// seeded rounds, a chi-square and a Kolmogorov-Smirnov test accept that
// the two samples come from one distribution (and from the uniform one
// over the ring). With masking disabled, the same tests tell the inputs
// apart at once: the control shows the tests have the power to notice.
func TestServerViewIndependentOfInput(t *testing.T) {
	trials := 600
	if testing.Short() {
		trials = 150
	}
	const alpha = 1e-3
	for _, masked := range []bool{true, false} {
		a := views(t, trials, 1<<20, -1, 1, masked)
		b := views(t, trials, 2<<20, +1, 1000, masked)
		pChi, pKS := chiSquare2(a, b, 64), ks2(a, b)
		t.Logf("masked=%v: %d values each, chi-square p = %.3g, KS p = %.3g", masked, len(a), pChi, pKS)
		if masked && (pChi < alpha || pKS < alpha) {
			t.Errorf("masked views differ with the input: chi-square p = %g, KS p = %g", pChi, pKS)
		}
		if !masked && (pChi > 1e-9 || pKS > 1e-9) {
			t.Errorf("control: unmasked views not told apart: chi-square p = %g, KS p = %g", pChi, pKS)
		}
		if masked {
			uniform := make([]float64, len(a))
			for i := range uniform {
				uniform[i] = (float64(i) + 0.5) / float64(len(uniform))
			}
			if p := ks2(a, uniform); p < alpha {
				t.Errorf("masked view is not uniform over the ring: KS p = %g", p)
			}
		}
	}
}
