// Command transport_bench measures gdist's TCP transport against raw TCP
// between the same two processes, in the same run, and prints absolute
// numbers and ratios to raw:
//
//   - raw TCP (package net only, through internal/rawtcp, the baseline every
//     benchmark shares): ping-pong RTT of an 8-byte message
//     (median and mean) and one-way streaming bandwidth at 1 KiB, 64 KiB,
//     1 MiB and 16 MiB messages (the receiver acks at the end);
//   - the gdist tcp transport: the same ping-pong and streams;
//   - dist all-reduce (sum) latency at 4096 and 32768 float32 and the bus
//     bandwidth of a 16 MiB ring all-reduce;
//   - on Linux (-shm, the default there), the shared-memory transport
//     (dist/transport/shm) between the same processes: ping-pong and
//     streams paired round by round with gdist TCP (and raw TCP), the CPU
//     use of an idle rank blocked in a receive over each, and the dist
//     16 MiB all-reduce over shm against the TCP one, back to back in every
//     round (-shm-ring and -shm-single-copy set the shm transport's ring
//     size and single-copy threshold).
//
// Run alone, it starts both ranks itself (re-executed twice through
// internal/launch, with a fresh job token) and prints rank 0's report; the
// ranks meet over loopback. Under a launcher (RANK, WORLD_SIZE=2, MASTER_ADDR, MASTER_PORT,
// GDIST_TOKEN set, as gdistrun does) it uses those instead. Each rank runs
// with GOMAXPROCS=1 unless -gomaxprocs says otherwise; with -pin (Linux)
// the ranks it starts itself are bound to one CPU each (launch.Job.Bind,
// what gdistrun -bind-to core does), so that the two never share a CPU (on
// a loaded machine the kernel sometimes puts both on one, which shows as a
// run of much slower shm ping-pongs). Under a launcher, bind there.
//
// # Usage
//
//	go run ./examples/transport_bench
//	go run ./examples/transport_bench -rounds 5 -pingpong-iters 50000
//	go run ./examples/transport_bench -pin
//	gdistrun -n 2 -- go run ./examples/transport_bench
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/tcp"
	"github.com/gdist/gdist/internal/cli"
	"github.com/gdist/gdist/internal/launch"
	"github.com/gdist/gdist/internal/rawtcp"
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
	Shm           bool
	ShmRing       int // 0: the shm default
	ShmSingleCopy int // -1: the shm default
	Pin           bool
}

var (
	cfg        config
	cpuprofile string
)

// errUsage reports bad command-line arguments (already printed).
var errUsage = errors.New("transport_bench: usage")

// parseFlags parses args into cfg and cpuprofile.
func parseFlags(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("transport_bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg = config{Sizes: defaultSizes}
	fs.StringVar(&cpuprofile, "cpuprofile", "", "write each rank's CPU profile to `file`.rankN")
	fs.IntVar(&cfg.Procs, "gomaxprocs", 1, "GOMAXPROCS of each rank")
	fs.IntVar(&cfg.PingPongIters, "pingpong-iters", 20000, "timed ping-pong round trips per round")
	fs.IntVar(&cfg.Warmup, "warmup", 2000, "untimed ping-pong round trips before each timed run")
	fs.IntVar(&cfg.StreamMiB, "stream-mib", 256, "MiB sent per streaming measurement (at least 8 messages)")
	fs.IntVar(&cfg.Rounds, "rounds", 5, "rounds per measurement; raw and gdist run back to back in each")
	fs.IntVar(&cfg.ARIters, "allreduce-iters", 1000, "timed all-reduces at 4096 and 32768 float32")
	fs.IntVar(&cfg.ARBigIters, "allreduce-big-iters", 10, "timed 16 MiB all-reduces")
	fs.BoolVar(&cfg.NoAllReduce, "no-allreduce", false, "skip the dist all-reduce measurements")
	fs.Func("sizes", "comma-separated stream message sizes in bytes (default 1024,65536,1048576,16777216)", func(v string) error {
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
	fs.IntVar(&cfg.QueueMiB, "queue-mib", 0, "gdist receive queue limit per peer in MiB (0: the transport's default)")
	fs.BoolVar(&cfg.Shm, "shm", shmSupported, "also measure the shared-memory transport (dist/transport/shm) against TCP")
	fs.IntVar(&cfg.ShmRing, "shm-ring", 0, "shm ring size per direction in bytes, a power of two (0: the transport's default)")
	fs.IntVar(&cfg.ShmSingleCopy, "shm-single-copy", -1, "shm single-copy threshold in bytes, 0 disables it (-1: the transport's default)")
	fs.BoolVar(&cfg.Pin, "pin", false, "bind rank r to CPU r mod the CPUs available (Linux), so that the two ranks never share one (when it starts the ranks itself; under gdistrun use -bind-to core)")
	fs.IntVar(&cfg.SockBuf, "sockbuf", 0, "kernel socket buffer size for both raw and gdist connections (0: kernel default)")
	if err := cli.Parse(fs, args, errUsage); err != nil {
		return err
	}
	if cfg.Procs < 1 || cfg.PingPongIters < 1 || cfg.Rounds < 1 || cfg.StreamMiB < 1 || cfg.Warmup < 0 {
		return cli.Usagef(fs, errUsage, "-gomaxprocs, -pingpong-iters, -rounds and -stream-mib must be positive, -warmup not negative")
	}
	return nil
}

var defaultSizes = []int{1 << 10, 64 << 10, 1 << 20, 16 << 20}

// Tags the benchmark uses on the transport directly.
const (
	tagSetup  = 1
	tagPing   = 2
	tagStream = 3
	tagAck    = 4
)

func main() { cli.Main("transport_bench", errUsage, run) }

// run is the program. Run alone, it starts both ranks (itself, re-executed
// through package launch) and relays rank 0's report; under a launcher
// (RANK set) it is one rank.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if err := parseFlags(args, stderr); err != nil {
		return err
	}
	if os.Getenv(launch.EnvRank) != "" {
		return runRank(ctx, stdout)
	}
	errs := launch.Synced(stderr)
	r, err := launch.Start(ctx, launch.Job{
		Spec: launch.Spec{NProc: 2},
		Args: args,
		Bind: cfg.Pin,
		Output: func(rank int) (io.Writer, io.Writer) {
			e := launch.NewPrefixWriter(errs, fmt.Sprintf("[%d] ", rank))
			if rank == 0 {
				return launch.NewPrefixWriter(stdout, ""), e
			}
			return launch.NewPrefixWriter(errs, fmt.Sprintf("[%d] ", rank)), e
		},
	})
	if err != nil {
		return err
	}
	return r.Wait()
}

type bench struct {
	tcpPG *dist.ProcessGroup // the group over tr, once allReduce made it
	rank  int
	tr    *tcp.Transport
	raw   *rawtcp.Conn
	shm   shmTransport // nil unless cfg.Shm
}

// runRank is one rank of the benchmark; rank 0 writes the report to stdout.
func runRank(ctx context.Context, stdout io.Writer) (err error) {
	rank, err := strconv.Atoi(os.Getenv("RANK"))
	if err != nil {
		return fmt.Errorf("RANK: %w", err)
	}
	if w := os.Getenv("WORLD_SIZE"); w != "2" {
		return fmt.Errorf("transport_bench needs exactly 2 ranks, WORLD_SIZE=%q", w)
	}
	host, port := os.Getenv("MASTER_ADDR"), os.Getenv("MASTER_PORT")
	ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
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
	if cpuprofile != "" {
		f, err := os.Create(fmt.Sprintf("%s.rank%d", cpuprofile, rank))
		if err != nil {
			return err
		}
		defer f.Close()
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}

	if cfg.Shm {
		if err := b.setupShm(ctx, net.JoinHostPort(host, port)); err != nil {
			return fmt.Errorf("shm: %w", err)
		}
		defer b.shm.Close()
	}
	res := &results{}
	if err := b.measure(ctx, res); err != nil {
		return err
	}
	if cfg.Shm {
		if err := b.measureShm(ctx, res); err != nil {
			return fmt.Errorf("shm: %w", err)
		}
	}
	if !cfg.NoAllReduce {
		err = b.allReduce(ctx, res)
		if b.tcpPG != nil {
			defer cli.Close(&err, b.tcpPG)
		}
		if err != nil {
			return err
		}
		if cfg.Shm {
			if err := b.allReduceShm(ctx, res); err != nil {
				return fmt.Errorf("shm: %w", err)
			}
		}
	}
	if rank == 0 {
		res.print(stdout)
	}
	return nil
}

// agree makes rank 1 adopt rank 0's configuration and opens the raw TCP
// connection (rank 0 listens next to the master address and sends its
// address over the transport; nothing of gdist is on the raw path).
func (b *bench) agree(ctx context.Context, host string) error {
	if b.rank == 0 {
		ln, err := rawtcp.Listen(host)
		if err != nil {
			return err
		}
		defer ln.Close()
		msg, _ := json.Marshal(struct {
			Cfg  config
			Addr string
		}{cfg, ln.Addr()})
		if err := b.tr.Send(ctx, 1, tagSetup, transport.Header{}, msg); err != nil {
			return err
		}
		if b.raw, err = ln.Accept(ctx); err != nil {
			return err
		}
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
		if b.raw, err = rawtcp.Dial(ctx, setup.Addr); err != nil {
			return err
		}
	}
	if cfg.SockBuf > 0 {
		return b.raw.SetBuffers(cfg.SockBuf)
	}
	return nil
}

// latency is a run's round-trip times.
type latency = rawtcp.Latency

type results struct {
	rawPP, gdistPP []latency         // per round
	rawBW, gdistBW map[int][]float64 // bytes/s per round, by size
	rawBidir       []float64         // bytes/s each way, 16 MiB both ways at once, per round
	arBusbw        []float64         // 16 MiB all-reduce busbw, per round (paired with rawBidir)
	ar             []arResult
	shm            *shmResults // cfg.Shm only
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
				raw, err = b.rawPingPong(ctx)
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
					raw, err = b.rawStream(ctx, size, n)
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

func (b *bench) rawPingPong(ctx context.Context) (latency, error) {
	return b.raw.PingPong(ctx, 8, cfg.Warmup, cfg.PingPongIters)
}

func (b *bench) gdistPingPong(ctx context.Context) (latency, error) { return b.pingPongOn(ctx, b.tr) }

// pingPongOn runs the ping-pong over tr.
func (b *bench) pingPongOn(ctx context.Context, tr transport.Transport) (latency, error) {
	if err := b.raw.Sync(ctx); err != nil {
		return latency{}, err
	}
	buf := make([]byte, 8)
	lat := make([]time.Duration, 0, cfg.PingPongIters)
	other := 1 - b.rank
	for i := range cfg.Warmup + cfg.PingPongIters {
		if b.rank == 0 {
			t0 := time.Now()
			if err := tr.Send(ctx, other, tagPing, transport.Header{}, buf); err != nil {
				return latency{}, err
			}
			m, err := tr.Recv(ctx, other, tagPing)
			if err != nil {
				return latency{}, err
			}
			tr.Release(m.Payload)
			if i >= cfg.Warmup {
				lat = append(lat, time.Since(t0))
			}
		} else {
			m, err := tr.Recv(ctx, other, tagPing)
			if err != nil {
				return latency{}, err
			}
			err = tr.Send(ctx, other, tagPing, transport.Header{}, m.Payload)
			tr.Release(m.Payload)
			if err != nil {
				return latency{}, err
			}
		}
	}
	return rawtcp.Summarize(lat), nil
}

// rawStream sends n messages of size bytes from rank 0 to rank 1, which acks
// once it has read them all, after a warm-up of a tenth as many; it returns
// bytes per second.
func (b *bench) rawStream(ctx context.Context, size, n int) (float64, error) {
	if _, err := b.raw.Stream(ctx, size, max(n/10, 2)); err != nil { // warm-up
		return 0, err
	}
	return b.raw.Stream(ctx, size, n)
}

func (b *bench) gdistStream(ctx context.Context, size, n int) (float64, error) {
	return b.streamOn(ctx, b.tr, size, n)
}

// streamOn runs the one-way stream over tr.
func (b *bench) streamOn(ctx context.Context, tr transport.Transport, size, n int) (float64, error) {
	buf := make([]byte, size)
	once := func(n int) (time.Duration, error) {
		if err := b.raw.Sync(ctx); err != nil {
			return 0, err
		}
		t0 := time.Now()
		if b.rank == 0 {
			for range n {
				if err := tr.Send(ctx, 1, tagStream, transport.Header{}, buf); err != nil {
					return 0, err
				}
			}
			m, err := tr.Recv(ctx, 1, tagAck)
			if err != nil {
				return 0, err
			}
			tr.Release(m.Payload)
		} else {
			for range n {
				m, err := tr.Recv(ctx, 0, tagStream)
				if err != nil {
					return 0, err
				}
				tr.Release(m.Payload)
			}
			if err := tr.Send(ctx, 0, tagAck, transport.Header{}, []byte{1}); err != nil {
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
func (b *bench) rawExchange(ctx context.Context, size, n int) (float64, error) {
	d, err := b.raw.Exchange(ctx, size, n)
	if err != nil {
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
	b.tcpPG = pg // closed by runRank, after the shm section used it too
	// Each round measures a raw ping-pong right before the all-reduces, so
	// the paired ratio compares them under the same machine conditions.
	for _, count := range []int{4096, 32768} {
		data := make([]float32, count)
		lat := make([]time.Duration, 0, cfg.ARIters)
		var rawMed, arMed []float64
		perRound := max(cfg.ARIters/max(cfg.Rounds, 1), 50)
		for round := range cfg.Rounds {
			raw, err := b.rawPingPong(ctx)
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
				if err := pg.AllReduce(ctx, dist.F32(data), dist.Sum); err != nil {
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
			rawMed = append(rawMed, float64(raw.Median))
			arMed = append(arMed, float64(rawtcp.Summarize(rl).Median))
		}
		a := arResult{count: count, lat: rawtcp.Summarize(lat)}
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
		bw, err := b.rawExchange(ctx, 16<<20, max(cfg.StreamMiB/16, 4))
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
			if err := pg.AllReduce(ctx, dist.F32(data), dist.Sum); err != nil {
				return fmt.Errorf("all-reduce 16 MiB: %w", err)
			}
			if d := time.Since(t0); i >= 1 || round > 0 {
				lat = append(lat, d)
			}
		}
		all = append(all, lat...)
		res.arBusbw = append(res.arBusbw, busbw(rawtcp.Summarize(lat).Median))
	}
	l := rawtcp.Summarize(all)
	res.ar = append(res.ar, arResult{count: big, lat: l, busbw: busbw(l.Median), isBand: true})
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
		out[i] = float64(l.Median)
	}
	return out
}

func means(ls []latency) []float64 {
	out := make([]float64, len(ls))
	for i, l := range ls {
		out[i] = float64(l.Mean)
	}
	return out
}

func bestLatency(ls []latency) latency {
	b := ls[0]
	for _, l := range ls[1:] {
		b.Median = min(b.Median, l.Median)
		b.Mean = min(b.Mean, l.Mean)
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
	cpus := fmt.Sprintf("%d CPUs", runtime.NumCPU())
	if cfg.Pin {
		cpus = "each rank bound to one CPU (-pin)"
	}
	fmt.Fprintf(w, "transport_bench: 2 ranks (2 processes) over loopback TCP, GOMAXPROCS=%d per rank, %s, %s\n",
		cfg.Procs, runtime.Version(), cpus)
	fmt.Fprintf(w, "%d rounds; raw and gdist run back to back in each round. Absolute figures: best round of each.\n", cfg.Rounds)
	fmt.Fprintf(w, "Ratio: median over rounds of the paired gdist/raw ratio.\n\n")

	raw, gd := bestLatency(r.rawPP), bestLatency(r.gdistPP)
	fmt.Fprintf(w, "ping-pong RTT, 8 B messages, %d timed round trips per round (us)\n", cfg.PingPongIters)
	fmt.Fprintf(w, "  %-8s %10s %10s\n", "", "median", "mean")
	fmt.Fprintf(w, "  %-8s %10s %10s\n", "raw", us(raw.Median), us(raw.Mean))
	fmt.Fprintf(w, "  %-8s %10s %10s\n", "gdist", us(gd.Median), us(gd.Mean))
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

	if r.shm != nil {
		defer r.printShm(w)
	}
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
		fmt.Fprintf(w, "  %-10d %12d %10s %10s %15.2fx %21.2fx\n", a.count, 4*a.count, us(a.lat.Median), us(a.lat.Mean),
			float64(a.lat.Median)/float64(raw.Median), a.pairedRTT)
	}
	fmt.Fprintln(w, "  (paired ratio: each round a raw ping-pong, then the all-reduces; target for 4096 f32 <= 2.0x the raw RTT)")
	for _, a := range r.ar {
		if !a.isBand {
			continue
		}
		fmt.Fprintf(w, "  ring all-reduce %s (%d float32): median %s us, mean %s us\n", sizeName(4*a.count), a.count, us(a.lat.Median), us(a.lat.Mean))
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
