// Command transport_bench measures gdist's TCP transport against raw TCP
// between the same two processes, in the same run, and prints absolute
// numbers and ratios to raw:
//
//   - raw TCP (package net only): ping-pong RTT of an 8-byte message
//     (median and mean) and one-way streaming bandwidth at 1 KiB, 64 KiB,
//     1 MiB and 16 MiB messages (the receiver acks at the end);
//   - the gdist tcp transport: the same ping-pong and streams;
//   - dist all-reduce (sum) latency at 4096 and 32768 float32 and the bus
//     bandwidth of a 16 MiB ring all-reduce.
//
// Run alone, it re-executes itself as rank 1 and both processes meet over
// loopback. Under a launcher (RANK, WORLD_SIZE=2, MASTER_ADDR, MASTER_PORT,
// GDIST_TOKEN set, as gdistrun does) it uses those instead. Each rank runs
// with GOMAXPROCS=1 unless -gomaxprocs says otherwise.
//
// # Usage
//
//	go run ./examples/transport_bench
//	go run ./examples/transport_bench -rounds 5 -pingpong-iters 50000
//	gdistrun -n 2 -- go run ./examples/transport_bench
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/tcp"
)

// config is what both ranks must agree on; rank 0 sends its own to rank 1.
type config struct {
	Procs         int
	PingPongIters int
	Warmup        int
	StreamMiB     int
	Rounds        int
	ARIters       int
	ARBigIters    int
	NoAllReduce   bool
	SockBuf       int
	QueueMiB      int
	Sizes         []int
}

var (
	cfg        config
	cpuprofile = flag.String("cpuprofile", "", "write each rank's CPU profile to `file`.rankN")
)

func init() {
	flag.IntVar(&cfg.Procs, "gomaxprocs", 1, "GOMAXPROCS of each rank")
	flag.IntVar(&cfg.PingPongIters, "pingpong-iters", 20000, "timed ping-pong round trips per round")
	flag.IntVar(&cfg.Warmup, "warmup", 2000, "untimed ping-pong round trips before each timed run")
	flag.IntVar(&cfg.StreamMiB, "stream-mib", 256, "MiB sent per streaming measurement (at least 8 messages)")
	flag.IntVar(&cfg.Rounds, "rounds", 5, "rounds per measurement; raw and gdist run back to back in each")
	flag.IntVar(&cfg.ARIters, "allreduce-iters", 1000, "timed all-reduces at 4096 and 32768 float32")
	flag.IntVar(&cfg.ARBigIters, "allreduce-big-iters", 10, "timed 16 MiB all-reduces")
	flag.BoolVar(&cfg.NoAllReduce, "no-allreduce", false, "skip the dist all-reduce measurements")
	flag.Func("sizes", "comma-separated stream message sizes in bytes (default 1024,65536,1048576,16777216)", func(v string) error {
		cfg.Sizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				return fmt.Errorf("bad size %q", f)
			}
			cfg.Sizes = append(cfg.Sizes, n)
		}
		return nil
	})
	flag.IntVar(&cfg.QueueMiB, "queue-mib", 0, "gdist receive queue limit per peer in MiB (0: the transport's default)")
	flag.IntVar(&cfg.SockBuf, "sockbuf", 0, "kernel socket buffer size for both raw and gdist connections (0: kernel default)")
}

var defaultSizes = []int{1 << 10, 64 << 10, 1 << 20, 16 << 20}

// Tags the benchmark uses on the transport directly.
const (
	tagSetup  = 1
	tagPing   = 2
	tagStream = 3
	tagAck    = 4
)

func main() {
	log.SetFlags(0)
	cfg.Sizes = defaultSizes
	flag.Parse()
	child, err := ensureEnv()
	if err != nil {
		log.Fatal(err)
	}
	err = run()
	if child != nil {
		if err != nil {
			child.Process.Kill()
		}
		if werr := child.Wait(); werr != nil && err == nil {
			err = fmt.Errorf("rank 1: %w", werr)
		}
	}
	if err != nil {
		log.Fatal(err)
	}
}

// ensureEnv starts rank 1 as a child process when no launcher did, and sets
// this process up as rank 0.
func ensureEnv() (*exec.Cmd, error) {
	if os.Getenv("RANK") != "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	tok := make([]byte, 32)
	rand.Read(tok)
	env := []string{"WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port, "GDIST_TOKEN=" + hex.EncodeToString(tok)}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, os.Args[1:]...)
	cmd.Env = append(append(os.Environ(), env...), "RANK=1")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	for _, kv := range append(env, "RANK=0") {
		k, v, _ := cut(kv)
		os.Setenv(k, v)
	}
	return cmd, nil
}

func cut(kv string) (string, string, bool) {
	for i := range kv {
		if kv[i] == '=' {
			return kv[:i], kv[i+1:], true
		}
	}
	return kv, "", false
}

type bench struct {
	rank int
	tr   *tcp.Transport
	raw  *net.TCPConn
}

func run() error {
	rank, err := strconv.Atoi(os.Getenv("RANK"))
	if err != nil {
		return fmt.Errorf("RANK: %w", err)
	}
	if w := os.Getenv("WORLD_SIZE"); w != "2" {
		return fmt.Errorf("transport_bench needs exactly 2 ranks, WORLD_SIZE=%q", w)
	}
	host, port := os.Getenv("MASTER_ADDR"), os.Getenv("MASTER_PORT")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()

	opts := []tcp.Option{tcp.WithToken([]byte(os.Getenv("GDIST_TOKEN")))}
	if cfg.SockBuf > 0 {
		opts = append(opts, tcp.WithSocketBuffer(cfg.SockBuf))
	}
	if cfg.QueueMiB > 0 {
		opts = append(opts, tcp.WithQueueLimit(cfg.QueueMiB<<20))
	}
	tr, err := tcp.Rendezvous(ctx, rank, 2, net.JoinHostPort(host, port), opts...)
	if err != nil {
		return err
	}
	defer tr.Close()
	b := &bench{rank: rank, tr: tr}
	if err := b.agree(ctx, host); err != nil {
		return err
	}
	runtime.GOMAXPROCS(cfg.Procs)
	if *cpuprofile != "" {
		f, err := os.Create(fmt.Sprintf("%s.rank%d", *cpuprofile, rank))
		if err != nil {
			return err
		}
		defer f.Close()
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}

	res := &results{}
	if err := b.measure(ctx, res); err != nil {
		return err
	}
	if !cfg.NoAllReduce {
		if err := b.allReduce(ctx, res); err != nil {
			return err
		}
	}
	if rank == 0 {
		res.print(os.Stdout)
	}
	return nil
}

// agree makes rank 1 adopt rank 0's configuration and opens the raw TCP
// connection (rank 0 listens next to the master address and sends its
// address over the transport; nothing of gdist is on the raw path).
func (b *bench) agree(ctx context.Context, host string) error {
	if b.rank == 0 {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return err
		}
		defer ln.Close()
		msg, _ := json.Marshal(struct {
			Cfg  config
			Addr string
		}{cfg, ln.Addr().String()})
		if err := b.tr.Send(ctx, 1, tagSetup, transport.Header{}, msg); err != nil {
			return err
		}
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		b.raw = c.(*net.TCPConn)
	} else {
		m, err := b.tr.Recv(ctx, 0, tagSetup)
		if err != nil {
			return err
		}
		var setup struct {
			Cfg  config
			Addr string
		}
		if err := json.Unmarshal(m.Payload, &setup); err != nil {
			return err
		}
		cfg = setup.Cfg
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", setup.Addr)
		if err != nil {
			return err
		}
		b.raw = c.(*net.TCPConn)
	}
	b.raw.SetNoDelay(true)
	if cfg.SockBuf > 0 {
		b.raw.SetReadBuffer(cfg.SockBuf)
		b.raw.SetWriteBuffer(cfg.SockBuf)
	}
	return nil
}

// sync lines both ranks up on the raw connection.
func (b *bench) sync() error {
	var x [1]byte
	if b.rank == 0 {
		if _, err := b.raw.Write(x[:]); err != nil {
			return err
		}
		_, err := io.ReadFull(b.raw, x[:])
		return err
	}
	if _, err := io.ReadFull(b.raw, x[:]); err != nil {
		return err
	}
	_, err := b.raw.Write(x[:])
	return err
}

type latency struct{ median, mean time.Duration }

func summarize(d []time.Duration) latency {
	if len(d) == 0 {
		return latency{}
	}
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return latency{median: s[len(s)/2], mean: sum / time.Duration(len(s))}
}

type results struct {
	rawPP, gdistPP []latency         // per round
	rawBW, gdistBW map[int][]float64 // bytes/s per round, by size
	rawBidir       []float64         // bytes/s each way, 16 MiB both ways at once, per round
	arBusbw        []float64         // 16 MiB all-reduce busbw, per round (paired with rawBidir)
	ar             []arResult
}

type arResult struct {
	count int
	lat   latency
	busbw float64 // bytes/s; only for the bandwidth run
	// pairedRTT is the median over rounds of (all-reduce median / raw
	// ping-pong RTT median measured just before it); latency runs only.
	pairedRTT float64
	isBand    bool
}

// measure runs the ping-pong and every stream size for cfg.Rounds rounds.
// Within a round raw and gdist run back to back (which goes first alternates
// between rounds), so each round yields a paired ratio that shares the
// machine's load at that moment.
func (b *bench) measure(ctx context.Context, res *results) error {
	res.rawBW, res.gdistBW = map[int][]float64{}, map[int][]float64{}
	for r := range cfg.Rounds {
		rawFirst := r%2 == 0
		var raw, gd latency
		var err error
		for k := range 2 {
			if (k == 0) == rawFirst {
				raw, err = b.rawPingPong()
			} else {
				gd, err = b.gdistPingPong(ctx)
			}
			if err != nil {
				return fmt.Errorf("ping-pong: %w", err)
			}
		}
		res.rawPP, res.gdistPP = append(res.rawPP, raw), append(res.gdistPP, gd)
	}
	for _, size := range cfg.Sizes {
		n := max(cfg.StreamMiB<<20/size, 8)
		for r := range cfg.Rounds {
			rawFirst := r%2 == 0
			var raw, gd float64
			var err error
			for k := range 2 {
				if (k == 0) == rawFirst {
					raw, err = b.rawStream(size, n)
				} else {
					gd, err = b.gdistStream(ctx, size, n)
				}
				if err != nil {
					return fmt.Errorf("stream %s: %w", sizeName(size), err)
				}
			}
			res.rawBW[size] = append(res.rawBW[size], raw)
			res.gdistBW[size] = append(res.gdistBW[size], gd)
		}
	}
	return nil
}

func (b *bench) rawPingPong() (latency, error) {
	if err := b.sync(); err != nil {
		return latency{}, err
	}
	buf := make([]byte, 8)
	lat := make([]time.Duration, 0, cfg.PingPongIters)
	for i := range cfg.Warmup + cfg.PingPongIters {
		if b.rank == 0 {
			t0 := time.Now()
			if _, err := b.raw.Write(buf); err != nil {
				return latency{}, err
			}
			if _, err := io.ReadFull(b.raw, buf); err != nil {
				return latency{}, err
			}
			if i >= cfg.Warmup {
				lat = append(lat, time.Since(t0))
			}
		} else {
			if _, err := io.ReadFull(b.raw, buf); err != nil {
				return latency{}, err
			}
			if _, err := b.raw.Write(buf); err != nil {
				return latency{}, err
			}
		}
	}
	return summarize(lat), nil
}

func (b *bench) gdistPingPong(ctx context.Context) (latency, error) {
	if err := b.sync(); err != nil {
		return latency{}, err
	}
	buf := make([]byte, 8)
	lat := make([]time.Duration, 0, cfg.PingPongIters)
	other := 1 - b.rank
	for i := range cfg.Warmup + cfg.PingPongIters {
		if b.rank == 0 {
			t0 := time.Now()
			if err := b.tr.Send(ctx, other, tagPing, transport.Header{}, buf); err != nil {
				return latency{}, err
			}
			m, err := b.tr.Recv(ctx, other, tagPing)
			if err != nil {
				return latency{}, err
			}
			b.tr.Release(m.Payload)
			if i >= cfg.Warmup {
				lat = append(lat, time.Since(t0))
			}
		} else {
			m, err := b.tr.Recv(ctx, other, tagPing)
			if err != nil {
				return latency{}, err
			}
			err = b.tr.Send(ctx, other, tagPing, transport.Header{}, m.Payload)
			b.tr.Release(m.Payload)
			if err != nil {
				return latency{}, err
			}
		}
	}
	return summarize(lat), nil
}

// rawStream sends n messages of size bytes from rank 0 to rank 1, which acks
// once it has read them all; it returns bytes per second.
func (b *bench) rawStream(size, n int) (float64, error) {
	buf := make([]byte, size)
	var ack [1]byte
	once := func(n int) (time.Duration, error) {
		if err := b.sync(); err != nil {
			return 0, err
		}
		t0 := time.Now()
		if b.rank == 0 {
			for range n {
				if _, err := b.raw.Write(buf); err != nil {
					return 0, err
				}
			}
			if _, err := io.ReadFull(b.raw, ack[:]); err != nil {
				return 0, err
			}
		} else {
			for range n {
				if _, err := io.ReadFull(b.raw, buf); err != nil {
					return 0, err
				}
			}
			if _, err := b.raw.Write(ack[:]); err != nil {
				return 0, err
			}
		}
		return time.Since(t0), nil
	}
	if _, err := once(max(n/10, 2)); err != nil { // warm-up
		return 0, err
	}
	d, err := once(n)
	return float64(size) * float64(n) / d.Seconds(), err
}

func (b *bench) gdistStream(ctx context.Context, size, n int) (float64, error) {
	buf := make([]byte, size)
	once := func(n int) (time.Duration, error) {
		if err := b.sync(); err != nil {
			return 0, err
		}
		t0 := time.Now()
		if b.rank == 0 {
			for range n {
				if err := b.tr.Send(ctx, 1, tagStream, transport.Header{}, buf); err != nil {
					return 0, err
				}
			}
			m, err := b.tr.Recv(ctx, 1, tagAck)
			if err != nil {
				return 0, err
			}
			b.tr.Release(m.Payload)
		} else {
			for range n {
				m, err := b.tr.Recv(ctx, 0, tagStream)
				if err != nil {
					return 0, err
				}
				b.tr.Release(m.Payload)
			}
			if err := b.tr.Send(ctx, 0, tagAck, transport.Header{}, []byte{1}); err != nil {
				return 0, err
			}
		}
		return time.Since(t0), nil
	}
	if _, err := once(max(n/10, 2)); err != nil {
		return 0, err
	}
	d, err := once(n)
	return float64(size) * float64(n) / d.Seconds(), err
}

// rawExchange has both ranks send n messages of size bytes to each other
// at the same time over the raw connection; it returns bytes per second in
// each direction. A 2-rank ring all-reduce moves data the same way.
func (b *bench) rawExchange(size, n int) (float64, error) {
	out, in := make([]byte, size), make([]byte, size)
	if err := b.sync(); err != nil {
		return 0, err
	}
	t0 := time.Now()
	werr := make(chan error, 1)
	go func() {
		for range n {
			if _, err := b.raw.Write(out); err != nil {
				werr <- err
				return
			}
		}
		werr <- nil
	}()
	for range n {
		if _, err := io.ReadFull(b.raw, in); err != nil {
			return 0, err
		}
	}
	if err := <-werr; err != nil {
		return 0, err
	}
	d := time.Since(t0)
	if err := b.sync(); err != nil {
		return 0, err
	}
	return float64(size) * float64(n) / d.Seconds(), nil
}

// allReduce measures dist's all-reduce (sum, float32) over the same
// transport. The group takes the transport over and closes it.
func (b *bench) allReduce(ctx context.Context, res *results) error {
	pg, err := dist.New(b.tr)
	if err != nil {
		return err
	}
	defer pg.Close()
	// Each round measures a raw ping-pong right before the all-reduces, so
	// the paired ratio compares them under the same machine conditions.
	for _, count := range []int{4096, 32768} {
		data := make([]float32, count)
		lat := make([]time.Duration, 0, cfg.ARIters)
		var rawMed, arMed []float64
		perRound := max(cfg.ARIters/max(cfg.Rounds, 1), 50)
		for round := range cfg.Rounds {
			raw, err := b.rawPingPong()
			if err != nil {
				return fmt.Errorf("raw ping-pong: %w", err)
			}
			if err := pg.Barrier(ctx); err != nil {
				return err
			}
			var rl []time.Duration
			for i := range perRound + 50*(1-min(round, 1)) {
				for k := range data {
					data[k] = 1
				}
				t0 := time.Now()
				if err := pg.AllReduce(ctx, data, dist.Sum); err != nil {
					return fmt.Errorf("all-reduce %d: %w", count, err)
				}
				if round > 0 || i >= 50 {
					rl = append(rl, time.Since(t0))
				}
			}
			if data[0] != 2 || data[count-1] != 2 {
				return fmt.Errorf("all-reduce %d: got %v, want 2", count, data[0])
			}
			lat = append(lat, rl...)
			rawMed = append(rawMed, float64(raw.median))
			arMed = append(arMed, float64(summarize(rl).median))
		}
		a := arResult{count: count, lat: summarize(lat)}
		if b.rank == 0 {
			a.pairedRTT = medianRatio(arMed, rawMed)
		}
		res.ar = append(res.ar, a)
	}
	// The 16 MiB all-reduce runs in rounds, each right after a raw 16 MiB
	// exchange between the same processes, so that each round's ratio
	// compares the two under the same machine conditions.
	const big = 4 << 20 // float32: 16 MiB
	data := make([]float32, big)
	n := float64(pg.WorldSize())
	busbw := func(d time.Duration) float64 { return float64(4*big) / d.Seconds() * 2 * (n - 1) / n }
	var all []time.Duration
	perRound := max(cfg.ARBigIters/max(cfg.Rounds, 1), 3)
	for round := range cfg.Rounds {
		bw, err := b.rawExchange(16<<20, max(cfg.StreamMiB/16, 4))
		if err != nil {
			return fmt.Errorf("raw exchange: %w", err)
		}
		res.rawBidir = append(res.rawBidir, bw)
		var lat []time.Duration
		for i := range 1 + perRound {
			if err := pg.Barrier(ctx); err != nil {
				return err
			}
			t0 := time.Now()
			if err := pg.AllReduce(ctx, data, dist.Sum); err != nil {
				return fmt.Errorf("all-reduce 16 MiB: %w", err)
			}
			if d := time.Since(t0); i >= 1 || round > 0 {
				lat = append(lat, d)
			}
		}
		all = append(all, lat...)
		res.arBusbw = append(res.arBusbw, busbw(summarize(lat).median))
	}
	l := summarize(all)
	res.ar = append(res.ar, arResult{count: big, lat: l, busbw: busbw(l.median), isBand: true})
	return nil
}

// medianRatio returns the median over rounds of gdist[i]/raw[i].
func medianRatio(gdist, raw []float64) float64 {
	r := make([]float64, len(raw))
	for i := range raw {
		r[i] = gdist[i] / raw[i]
	}
	slices.Sort(r)
	if len(r)%2 == 1 {
		return r[len(r)/2]
	}
	return (r[len(r)/2-1] + r[len(r)/2]) / 2
}

func medians(ls []latency) []float64 {
	out := make([]float64, len(ls))
	for i, l := range ls {
		out[i] = float64(l.median)
	}
	return out
}

func means(ls []latency) []float64 {
	out := make([]float64, len(ls))
	for i, l := range ls {
		out[i] = float64(l.mean)
	}
	return out
}

func bestLatency(ls []latency) latency {
	b := ls[0]
	for _, l := range ls[1:] {
		b.median = min(b.median, l.median)
		b.mean = min(b.mean, l.mean)
	}
	return b
}

func us(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/1e3) }

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

func (r *results) print(w io.Writer) {
	fmt.Fprintf(w, "transport_bench: 2 ranks (2 processes) over loopback TCP, GOMAXPROCS=%d per rank, %s, %d CPUs\n",
		cfg.Procs, runtime.Version(), runtime.NumCPU())
	fmt.Fprintf(w, "%d rounds; raw and gdist run back to back in each round. Absolute figures: best round of each.\n", cfg.Rounds)
	fmt.Fprintf(w, "Ratio: median over rounds of the paired gdist/raw ratio.\n\n")

	raw, gd := bestLatency(r.rawPP), bestLatency(r.gdistPP)
	fmt.Fprintf(w, "ping-pong RTT, 8 B messages, %d timed round trips per round (us)\n", cfg.PingPongIters)
	fmt.Fprintf(w, "  %-8s %10s %10s\n", "", "median", "mean")
	fmt.Fprintf(w, "  %-8s %10s %10s\n", "raw", us(raw.median), us(raw.mean))
	fmt.Fprintf(w, "  %-8s %10s %10s\n", "gdist", us(gd.median), us(gd.mean))
	rttRatio := medianRatio(medians(r.gdistPP), medians(r.rawPP))
	fmt.Fprintf(w, "  %-8s %9.2fx %9.2fx   (gdist/raw; target <= 1.30x: %s)\n\n", "ratio",
		rttRatio, medianRatio(means(r.gdistPP), means(r.rawPP)), verdict(rttRatio <= 1.3))

	fmt.Fprintf(w, "streaming, one direction, %d MiB per measurement (MB/s, 1 MB = 1e6 B)\n", cfg.StreamMiB)
	fmt.Fprintf(w, "  %-8s %10s %10s %8s\n", "size", "raw", "gdist", "ratio")
	ratio16 := math.NaN()
	for _, s := range cfg.Sizes {
		rb, gb := slices.Max(r.rawBW[s]), slices.Max(r.gdistBW[s])
		ratio := medianRatio(r.gdistBW[s], r.rawBW[s])
		fmt.Fprintf(w, "  %-8s %10.0f %10.0f %7.2fx\n", sizeName(s), rb/1e6, gb/1e6, ratio)
		if s == 16<<20 {
			ratio16 = ratio
		}
	}
	if !math.IsNaN(ratio16) {
		fmt.Fprintf(w, "  (gdist/raw; target at 16 MiB >= 0.90x: %s)\n", verdict(ratio16 >= 0.9))
	}
	fmt.Fprintln(w)

	if len(r.ar) == 0 {
		fmt.Fprintln(w, "all-reduce: skipped (-no-allreduce)")
		return
	}
	fmt.Fprintln(w, "dist all-reduce (sum, float32, 2 ranks)")
	fmt.Fprintf(w, "  %-10s %12s %10s %10s %16s %22s\n", "count", "bytes", "median us", "mean us", "median/raw RTT", "paired ratio (median)")
	for _, a := range r.ar {
		if a.isBand {
			continue
		}
		fmt.Fprintf(w, "  %-10d %12d %10s %10s %15.2fx %21.2fx\n", a.count, 4*a.count, us(a.lat.median), us(a.lat.mean),
			float64(a.lat.median)/float64(raw.median), a.pairedRTT)
	}
	fmt.Fprintln(w, "  (paired ratio: each round a raw ping-pong, then the all-reduces; target for 4096 f32 <= 2.0x the raw RTT)")
	for _, a := range r.ar {
		if !a.isBand {
			continue
		}
		fmt.Fprintf(w, "  ring all-reduce %s (%d float32): median %s us, mean %s us\n", sizeName(4*a.count), a.count, us(a.lat.median), us(a.lat.mean))
		fmt.Fprintf(w, "  busbw %.2f GB/s (busbw = algbw x 2(n-1)/n)\n", a.busbw/1e9)
		if raw16, ok := r.rawBW[16<<20]; ok {
			fmt.Fprintf(w, "    = %.2fx the best raw one-way 16 MiB stream (%.2f GB/s)\n", a.busbw/slices.Max(raw16), slices.Max(raw16)/1e9)
		}
		if len(r.rawBidir) > 0 && len(r.rawBidir) == len(r.arBusbw) {
			bi := slices.Max(r.rawBidir)
			fmt.Fprintf(w, "    = %.2fx a raw 16 MiB exchange, both ways at once like the 2-rank ring (best %.2f GB/s each way);\n",
				a.busbw/bi, bi/1e9)
			fmt.Fprintf(w, "      median over rounds of the paired ratio (each round: raw exchange, then all-reduces): %.2fx\n",
				medianRatio(r.arBusbw, r.rawBidir))
		}
	}
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}
