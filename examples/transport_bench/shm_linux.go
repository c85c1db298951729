//go:build linux

package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"time"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/shm"
	"github.com/gdist/gdist/internal/benchutil"
	"github.com/gdist/gdist/internal/cli"
	"github.com/gdist/gdist/internal/rawtcp"
)

// The shared-memory section: the same ping-pong and streams over
// dist/transport/shm between the same two processes, each round right
// after the same measurement over gdist's TCP transport (and raw TCP), an
// idle receiver's CPU use over both, and the dist all-reduce over shm.

const shmSupported = true

type shmTransport = *shm.Transport

// Tags of the shm section.
const tagIdle = 5

type shmResults struct {
	tcpPP, shmPP     []latency         // per round, paired
	rawBW, tcpBW     map[int][]float64 // bytes/s per round, by size, paired with shmBW
	shmBW            map[int][]float64
	idleTCP, idleShm float64   // fraction of a core used by rank 1 blocked in a receive
	tcpAR, shmAR     []float64 // busbw per round, paired: each round both, back to back
	rawBidir         []float64 // raw exchange before each shm all-reduce round
	shmARSmall       latency   // 4096 float32
	shmARSmallRTT    float64   // its median / the shm ping-pong median
}

// setupShm connects the two ranks over shared memory too. The socket name
// is derived from the job token and the master address, which both ranks
// know and nobody outside the job does.
func (b *bench) setupShm(ctx context.Context, master string) error {
	tok := os.Getenv("GDIST_TOKEN")
	sum := sha256.Sum256([]byte("transport_bench shm\x00" + tok + "\x00" + master))
	name := "@gdist-" + hex.EncodeToString(sum[:12])
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	opts := []shm.Option{shm.WithToken([]byte(tok))}
	if cfg.ShmRing > 0 {
		opts = append(opts, shm.WithRingSize(cfg.ShmRing))
	}
	if cfg.ShmSingleCopy >= 0 {
		opts = append(opts, shm.WithSingleCopy(cfg.ShmSingleCopy))
	}
	tr, err := shm.Rendezvous(sctx, b.rank, 2, name, opts...)
	if err != nil {
		return err
	}
	b.shm = tr
	return nil
}

// measureShm runs, for cfg.Rounds rounds, the TCP and the shm ping-pong
// back to back, then for every size raw TCP, gdist TCP and shm streams.
func (b *bench) measureShm(ctx context.Context, res *results) error {
	r := &shmResults{rawBW: map[int][]float64{}, tcpBW: map[int][]float64{}, shmBW: map[int][]float64{}}
	res.shm = r
	for round := range cfg.Rounds {
		var tl, sl latency
		var err error
		for k := range 2 {
			if (k == 0) == (round%2 == 0) {
				tl, err = b.pingPongOn(ctx, b.tr)
			} else {
				sl, err = b.pingPongOn(ctx, b.shm)
			}
			if err != nil {
				return fmt.Errorf("ping-pong: %w", err)
			}
		}
		r.tcpPP, r.shmPP = append(r.tcpPP, tl), append(r.shmPP, sl)
	}
	for _, size := range cfg.Sizes {
		n := max(cfg.StreamMiB<<20/size, 8)
		for round := range cfg.Rounds {
			raw, err := b.rawStream(ctx, size, n)
			if err != nil {
				return err
			}
			tb, err := b.streamOn(ctx, b.tr, size, n)
			if err != nil {
				return err
			}
			sb, err := b.streamOn(ctx, b.shm, size, n)
			if err != nil {
				return err
			}
			if round%2 == 1 { // alternate which transport goes last
				if tb, err = b.streamOn(ctx, b.tr, size, n); err != nil {
					return err
				}
			}
			r.rawBW[size] = append(r.rawBW[size], raw)
			r.tcpBW[size] = append(r.tcpBW[size], tb)
			r.shmBW[size] = append(r.shmBW[size], sb)
		}
	}
	var err error
	if r.idleTCP, err = b.idle(ctx, b.tr); err != nil {
		return fmt.Errorf("idle tcp: %w", err)
	}
	if r.idleShm, err = b.idle(ctx, b.shm); err != nil {
		return fmt.Errorf("idle shm: %w", err)
	}
	return nil
}

// idle has rank 1 block in a receive over tr for about a second and
// measures, from its process CPU time, the fraction of a core it used
// from the first millisecond on; rank 0 gets the figure.
func (b *bench) idle(ctx context.Context, tr transport.Transport) (float64, error) {
	if err := b.raw.Sync(ctx); err != nil {
		return 0, err
	}
	const window = time.Second
	if b.rank == 0 {
		time.Sleep(window + 200*time.Millisecond)
		if err := tr.Send(ctx, 1, tagIdle, transport.Header{}, []byte{1}); err != nil {
			return 0, err
		}
		m, err := tr.Recv(ctx, 1, tagIdle)
		if err != nil {
			return 0, err
		}
		if len(m.Payload) != 8 {
			return 0, fmt.Errorf("idle: got %d bytes", len(m.Payload))
		}
		return math.Float64frombits(binary.LittleEndian.Uint64(m.Payload)), nil
	}
	done := make(chan error, 1)
	go func() { _, err := tr.Recv(ctx, 0, tagIdle); done <- err }()
	time.Sleep(time.Millisecond)
	c0, w0 := benchutil.CPUTime(), time.Now()
	time.Sleep(window)
	c1, w1 := benchutil.CPUTime(), time.Now()
	if err := <-done; err != nil {
		return 0, err
	}
	frac := float64(c1-c0) / float64(w1.Sub(w0))
	return frac, tr.Send(ctx, 0, tagIdle, transport.Header{}, binary.LittleEndian.AppendUint64(nil, math.Float64bits(frac)))
}

// allReduceShm measures dist's all-reduce over shm: 4096 float32 latency,
// and 16 MiB busbw in rounds, each after a raw 16 MiB exchange, with the
// same all-reduces over gdist's TCP transport right before or after in the
// same round (alternating), the reference.
func (b *bench) allReduceShm(ctx context.Context, res *results) (err error) {
	pg, err := dist.New(b.shm)
	if err != nil {
		return err
	}
	defer cli.Close(&err, pg)
	r := res.shm
	small := make([]float32, 4096)
	var lat []time.Duration
	for i := range cfg.ARIters + 50 {
		for k := range small {
			small[k] = 1
		}
		t0 := time.Now()
		if err := pg.AllReduce(ctx, dist.F32(small), dist.Sum); err != nil {
			return err
		}
		if i >= 50 {
			lat = append(lat, time.Since(t0))
		}
	}
	if small[0] != 2 {
		return fmt.Errorf("all-reduce 4096: got %v, want 2", small[0])
	}
	r.shmARSmall = rawtcp.Summarize(lat)
	if len(r.shmPP) > 0 {
		r.shmARSmallRTT = float64(r.shmARSmall.Median) / float64(bestLatency(r.shmPP).Median)
	}
	const big = 4 << 20 // float32: 16 MiB
	data := make([]float32, big)
	busbw := func(d time.Duration) float64 { return float64(4*big) / d.Seconds() } // x 2(n-1)/n = 1 for n = 2
	perRound := max(cfg.ARBigIters/max(cfg.Rounds, 1), 3)
	for round := range cfg.Rounds {
		bw, err := b.rawExchange(ctx, 16<<20, max(cfg.StreamMiB/16, 4))
		if err != nil {
			return err
		}
		r.rawBidir = append(r.rawBidir, bw)
		for k := range 2 {
			g := pg
			if (k == 0) == (round%2 == 0) {
				g = b.tcpPG
			}
			var l []time.Duration
			for i := range 1 + perRound {
				if err := g.Barrier(ctx); err != nil {
					return err
				}
				t0 := time.Now()
				if err := g.AllReduce(ctx, dist.F32(data), dist.Sum); err != nil {
					return err
				}
				if d := time.Since(t0); i >= 1 {
					l = append(l, d)
				}
			}
			if g == pg {
				r.shmAR = append(r.shmAR, busbw(rawtcp.Summarize(l).Median))
			} else {
				r.tcpAR = append(r.tcpAR, busbw(rawtcp.Summarize(l).Median))
			}
		}
	}
	return nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func (r *results) printShm(w io.Writer) {
	s := r.shm
	fmt.Fprintf(w, "\nshared memory (dist/transport/shm) between the same processes; ratios: median over rounds of the paired ratio\n")
	tl, sl := bestLatency(s.tcpPP), bestLatency(s.shmPP)
	fmt.Fprintf(w, "ping-pong RTT, 8 B (us)\n")
	fmt.Fprintf(w, "  %-8s %10s %10s\n", "", "median", "mean")
	fmt.Fprintf(w, "  %-8s %10s %10s\n", "tcp", us(tl.Median), us(tl.Mean))
	fmt.Fprintf(w, "  %-8s %10s %10s\n", "shm", fmt.Sprintf("%.2f", float64(sl.Median)/1e3), fmt.Sprintf("%.2f", float64(sl.Mean)/1e3))
	rt := medianRatio(medians(s.shmPP), medians(s.tcpPP))
	fmt.Fprintf(w, "  %-8s %9.3fx %9.3fx   (shm/tcp; target <= 0.20x: %s)\n\n", "ratio", rt,
		medianRatio(means(s.shmPP), means(s.tcpPP)), verdict(rt <= 0.2))

	fmt.Fprintf(w, "streaming, one direction (MB/s)\n")
	fmt.Fprintf(w, "  %-8s %10s %10s %10s %10s %10s\n", "size", "raw tcp", "tcp", "shm", "shm/raw", "shm/tcp")
	for _, size := range cfg.Sizes {
		fmt.Fprintf(w, "  %-8s %10.0f %10.0f %10.0f %9.2fx %9.2fx\n", sizeName(size),
			slices.Max(s.rawBW[size])/1e6, slices.Max(s.tcpBW[size])/1e6, slices.Max(s.shmBW[size])/1e6,
			medianRatio(s.shmBW[size], s.rawBW[size]), medianRatio(s.shmBW[size], s.tcpBW[size]))
	}
	if _, ok := s.shmBW[16<<20]; ok {
		x := medianRatio(s.shmBW[16<<20], s.rawBW[16<<20])
		fmt.Fprintf(w, "  (target at 16 MiB: shm >= 1.50x raw TCP: %s)\n", verdict(x >= 1.5))
	}
	fmt.Fprintf(w, "\nidle rank blocked in a receive, CPU from 1 ms on (process CPU time / wall time)\n")
	fmt.Fprintf(w, "  tcp %.2f%%   shm %.2f%% of a core   (target shm < 5%%: %s)\n",
		100*s.idleTCP, 100*s.idleShm, verdict(s.idleShm < 0.05))
	if len(s.shmAR) == 0 {
		return
	}
	fmt.Fprintf(w, "\ndist all-reduce over shm (sum, float32, 2 ranks)\n")
	fmt.Fprintf(w, "  4096 float32: median %.1f us, mean %.1f us (%.2fx the shm ping-pong RTT)\n",
		float64(s.shmARSmall.Median)/1e3, float64(s.shmARSmall.Mean)/1e3, s.shmARSmallRTT)
	ar := medianRatio(s.shmAR, s.tcpAR)
	fmt.Fprintf(w, "  16 MiB busbw: shm %.2f GB/s (best %.2f), tcp %.2f GB/s (best %.2f), medians over rounds\n",
		median(s.shmAR)/1e9, slices.Max(s.shmAR)/1e9, median(s.tcpAR)/1e9, slices.Max(s.tcpAR)/1e9)
	fmt.Fprintf(w, "    shm/tcp %.2fx (median of the paired ratio; both back to back in each round; ratio of medians %.2fx; target >= 2x: %s)\n",
		ar, median(s.shmAR)/median(s.tcpAR), verdict(ar >= 2))
	fmt.Fprintf(w, "    = %.2fx a raw 16 MiB TCP exchange (paired rounds)\n", medianRatio(s.shmAR, s.rawBidir))
}
