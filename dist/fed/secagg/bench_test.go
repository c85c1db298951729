package secagg

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

var benchSizes = []struct{ n, dim int }{{5, 1e4}, {5, 1e5}, {20, 1e4}, {20, 1e5}}

func benchInputs(n, dim int) [][]float32 {
	r := rand.New(rand.NewPCG(1, 2))
	xs := make([][]float32, n)
	for i := range xs {
		xs[i] = make([]float32, dim)
		for j := range xs[i] {
			xs[i][j] = float32(r.NormFloat64() * 0.1)
		}
	}
	return xs
}

// BenchmarkRound: one secure-aggregation round in one process, every
// client and the server, float32 inputs weighted by sample counts, from
// new keys to the sum; drop=1 has one client leave after sharing its keys,
// so the server reconstructs its key and removes its masks. Reported per
// round: client-ms (one client's compute, averaged), server-ms, and
// B/client (the bytes a client that stays to the end sends and receives).
func BenchmarkRound(b *testing.B) {
	for _, sz := range benchSizes {
		for _, drop := range []int{0, 1} {
			b.Run(fmt.Sprintf("n=%d/dim=%d/drop=%d", sz.n, sz.dim, drop), func(b *testing.B) {
				benchRound(b, sz.n, sz.dim, drop)
			})
		}
	}
}

func benchRound(b *testing.B, n, dim, drop int) {
	xs := benchInputs(n, dim)
	ids := make([]int, n)
	for i := range ids {
		ids[i] = i
	}
	cfg := Config{Clients: ids, Threshold: n/2 + 1, Dim: dim, Clip: 1, MaxWeight: 60000}
	var clientT, serverT time.Duration
	var bytes int
	b.ReportAllocs()
	for b.Loop() {
		cfg.Round++
		t0 := time.Now()
		s, err := NewServer(cfg)
		if err != nil {
			b.Fatal(err)
		}
		serverT += time.Since(t0)
		cs := make([]*Client, n)
		out := map[int][]byte{}
		for st := StageAdvertise; st < StageDone; st++ {
			for id := range n {
				if st > StageShare && id < drop {
					continue
				}
				t0 := time.Now()
				var msg []byte
				switch st {
				case StageAdvertise:
					cs[id], err = NewClient(cfg, id, nil)
					if err == nil {
						msg, err = cs[id].AdvertiseKeys()
					}
				case StageShare:
					msg, err = cs[id].ShareKeys(out[id])
				case StageMask:
					msg, err = cs[id].MaskInput32(out[id], xs[id], uint64(1000+id))
				case StageUnmask:
					msg, err = cs[id].Unmask(out[id])
				}
				clientT += time.Since(t0)
				if err != nil {
					b.Fatal(err)
				}
				if id == n-1 { // a client that stays to the end
					bytes += len(out[id]) + len(msg)
				}
				t0 = time.Now()
				if err := s.Receive(id, msg); err != nil {
					b.Fatal(err)
				}
				serverT += time.Since(t0)
			}
			t0 := time.Now()
			if out, err = s.Advance(); err != nil {
				b.Fatal(err)
			}
			serverT += time.Since(t0)
		}
		if _, err := s.Sum(); err != nil {
			b.Fatal(err)
		}
	}
	rounds := float64(b.N)
	b.ReportMetric(float64(clientT.Microseconds())/1e3/rounds/float64(n), "client-ms")
	b.ReportMetric(float64(serverT.Microseconds())/1e3/rounds, "server-ms")
	b.ReportMetric(float64(bytes)/rounds, "B/client")
}

// BenchmarkPlain is the baseline: each client encodes its float32 vector
// and sample count as little-endian bytes, and the server decodes and
// accumulates the weighted sum in float64 (what plain federated averaging
// does with the vectors once they arrived).
func BenchmarkPlain(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run(fmt.Sprintf("n=%d/dim=%d", sz.n, sz.dim), func(b *testing.B) {
			xs := benchInputs(sz.n, sz.dim)
			var clientT, serverT time.Duration
			var bytes int
			b.ReportAllocs()
			for b.Loop() {
				sum := make([]float64, sz.dim)
				var total float64
				for id, x := range xs {
					t0 := time.Now()
					msg := make([]byte, 8+4*len(x))
					binary.LittleEndian.PutUint64(msg, uint64(1000+id))
					for i, v := range x {
						binary.LittleEndian.PutUint32(msg[8+4*i:], math.Float32bits(v))
					}
					clientT += time.Since(t0)
					bytes += len(msg)
					t0 = time.Now()
					w := float64(binary.LittleEndian.Uint64(msg))
					for i := range sum {
						sum[i] += w * float64(math.Float32frombits(binary.LittleEndian.Uint32(msg[8+4*i:])))
					}
					total += w
					serverT += time.Since(t0)
				}
				for i := range sum {
					sum[i] /= total
				}
			}
			rounds := float64(b.N)
			b.ReportMetric(float64(clientT.Microseconds())/1e3/rounds/float64(sz.n), "client-ms")
			b.ReportMetric(float64(serverT.Microseconds())/1e3/rounds, "server-ms")
			b.ReportMetric(float64(bytes)/rounds/float64(sz.n), "B/client")
		})
	}
}
