// Command collectives measures gdist's collectives in the format of
// nccl-tests: ranks run as separate OS processes (this program re-executes
// itself, one process per rank, GOMAXPROCS=1 each) connected by the TCP
// transport over loopback, and sweep message sizes for all_reduce,
// all_gather, reduce_scatter and broadcast.
//
// For every size it prints size(B), count, type, redop, root, time(us) (the
// mean time per call of the slowest rank), algbw(GB/s) = size/time,
// busbw(GB/s) = algbw times 2(n-1)/n for all_reduce, (n-1)/n for all_gather
// and reduce_scatter and 1 for broadcast (GB = 1e9 bytes), and #wrong: the
// number of elements, summed over ranks, that differ from a reference
// computed from the deterministic per-rank inputs. Two more columns relate
// the figures to a raw-socket baseline measured between ranks 0 and 1 of the
// same processes in the same run (plain TCP ping-pong and streaming):
// lat/raw = time / raw one-way latency, bw/raw = busbw / raw streaming
// bandwidth. The machines are shared and noisy, so compare ratios from one
// run rather than absolute figures across runs.
//
// # Usage
//
//	go run ./bench/collectives -np 2,3,4 -b 8 -e 64M -f 2 -n 20
//	go run ./bench/collectives -ops all_reduce -np 4 -b 1K -e 1M -small 0   # force the ring
//
// Flags: -b and -e are the smallest and largest sizes in bytes (suffixes K,
// M, G), -f the factor between sizes, -n the timed iterations per size (-w
// warm-up iterations), -ops a comma-separated list of collectives, -np a
// comma-separated list of world sizes, -small the all-reduce small-message
// threshold (-1 keeps dist.DefaultSmallThreshold), -check=false skips the
// #wrong check.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/internal/benchutil"
)

// childEnv marks a process started by the launcher as one rank.
const childEnv = "GDIST_BENCH_COLLECTIVES_CHILD"

type options struct {
	minBytes, maxBytes int64
	factor             int
	iters, warmup      int
	ops                []string
	nps                []int
	small              int
	check              bool
}

var validOps = []string{"all_reduce", "all_gather", "reduce_scatter", "broadcast"}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the program: the launcher, or one rank when childEnv is set. It
// returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("collectives", flag.ContinueOnError)
	fs.SetOutput(stderr)
	opts, err := parseFlags(fs, args)
	if err != nil {
		fmt.Fprintln(stderr, "collectives:", err)
		return 2
	}
	if os.Getenv(childEnv) != "" {
		if err := runRank(context.Background(), opts, stdout); err != nil {
			fmt.Fprintf(stderr, "collectives: rank %s: %v\n", os.Getenv(dist.EnvRank), err)
			return 1
		}
		return 0
	}
	if err := launchAll(opts, args, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "collectives:", err)
		return 1
	}
	return 0
}

func parseFlags(fs *flag.FlagSet, args []string) (options, error) {
	var o options
	minB := fs.String("b", "8", "smallest message size in bytes (K, M, G suffixes)")
	maxB := fs.String("e", "64M", "largest message size in bytes")
	fs.IntVar(&o.factor, "f", 2, "factor between successive sizes")
	fs.IntVar(&o.iters, "n", 20, "timed iterations per size")
	fs.IntVar(&o.warmup, "w", 5, "warm-up iterations per size")
	ops := fs.String("ops", strings.Join(validOps, ","), "collectives to run")
	nps := fs.String("np", "2,3,4", "world sizes to run, comma-separated")
	fs.IntVar(&o.small, "small", -1, "all-reduce small-message threshold in bytes (-1: the default)")
	fs.BoolVar(&o.check, "check", true, "check results against the reference (#wrong)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	var err error
	if o.minBytes, err = parseSize(*minB); err != nil {
		return o, err
	}
	if o.maxBytes, err = parseSize(*maxB); err != nil {
		return o, err
	}
	if o.minBytes < 1 || o.maxBytes < o.minBytes {
		return o, fmt.Errorf("need 1 <= -b <= -e, got %d and %d", o.minBytes, o.maxBytes)
	}
	if o.factor < 2 || o.iters < 1 || o.warmup < 0 {
		return o, errors.New("need -f >= 2, -n >= 1, -w >= 0")
	}
	for _, op := range strings.Split(*ops, ",") {
		if !contains(validOps, op) {
			return o, fmt.Errorf("unknown collective %q (want some of %s)", op, strings.Join(validOps, ","))
		}
		o.ops = append(o.ops, op)
	}
	for _, s := range strings.Split(*nps, ",") {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 64 {
			return o, fmt.Errorf("bad -np entry %q", s)
		}
		o.nps = append(o.nps, n)
	}
	return o, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func parseSize(s string) (int64, error) {
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "K"):
		mult, s = 1<<10, strings.TrimSuffix(s, "K")
	case strings.HasSuffix(s, "M"):
		mult, s = 1<<20, strings.TrimSuffix(s, "M")
	case strings.HasSuffix(s, "G"):
		mult, s = 1<<30, strings.TrimSuffix(s, "G")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return n * mult, nil
}

// launchAll runs one job per world size in opts.nps.
func launchAll(opts options, args []string, stdout, stderr io.Writer) error {
	for _, np := range opts.nps {
		if err := launch(np, args, stdout, stderr); err != nil {
			return fmt.Errorf("np=%d: %w", np, err)
		}
	}
	return nil
}

// launch starts np copies of this program as the ranks of one job and
// relays rank 0's output. The job gets a fresh token and master port.
func launch(np int, args []string, stdout, stderr io.Writer) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	port, err := benchutil.FreePort()
	if err != nil {
		return err
	}
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return err
	}
	base := os.Environ()
	if _, ok := stderr.(*os.File); !ok {
		stderr = &syncWriter{w: stderr} // the ranks write to it concurrently
	}
	cmds := make([]*exec.Cmd, np)
	var wg sync.WaitGroup
	for r := range np {
		cmd := exec.Command(exe, args...)
		cmd.Env = append(base,
			childEnv+"=1",
			"GOMAXPROCS=1",
			fmt.Sprintf("%s=%d", dist.EnvRank, r),
			fmt.Sprintf("%s=%d", dist.EnvWorldSize, np),
			fmt.Sprintf("%s=%d", dist.EnvLocalRank, r),
			dist.EnvMasterAddr+"=127.0.0.1",
			fmt.Sprintf("%s=%d", dist.EnvMasterPort, port),
			dist.EnvToken+"="+hex.EncodeToString(tok),
		)
		cmd.Stderr = stderr
		if r == 0 {
			out, err := cmd.StdoutPipe()
			if err != nil {
				return err
			}
			wg.Go(func() { copyLines(stdout, out) })
		}
		cmds[r] = cmd
	}
	for r, cmd := range cmds {
		if err := cmd.Start(); err != nil {
			for _, c := range cmds[:r] {
				c.Process.Kill()
				c.Wait()
			}
			return err
		}
	}
	errs := make([]error, np)
	var wwg sync.WaitGroup
	for r, cmd := range cmds {
		wwg.Go(func() {
			if r == 0 {
				wg.Wait() // drain stdout before Wait closes the pipe
			}
			errs[r] = cmd.Wait()
			if errs[r] != nil { // one rank failed: stop the job
				for _, c := range cmds {
					c.Process.Kill()
				}
			}
		})
	}
	wwg.Wait()
	for r, err := range errs {
		if err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
	}
	return nil
}

// syncWriter serialises writes to w.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func copyLines(w io.Writer, r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fmt.Fprintln(w, sc.Text())
	}
}

// runRank is one rank's side of the benchmark.
func runRank(ctx context.Context, o options, out io.Writer) error {
	var gopts []dist.Option
	if o.small >= 0 {
		gopts = append(gopts, dist.WithSmallThreshold(o.small))
	}
	ictx, cancel := context.WithTimeout(ctx, 60*time.Second)
	g, err := dist.InitFromEnv(ictx, gopts...)
	cancel()
	if err != nil {
		return err
	}
	defer g.Close()
	n := g.WorldSize()
	lat, bw, err := rawBaseline(ctx, g)
	if err != nil {
		return fmt.Errorf("raw TCP baseline: %w", err)
	}
	if g.Rank() == 0 {
		fmt.Fprintf(out, "# gdist collectives: np=%d, TCP over loopback, one OS process per rank, GOMAXPROCS=1, float32, in place\n", n)
		if n > 1 {
			fmt.Fprintf(out, "# raw TCP baseline (ranks 0 <-> 1, same processes): one-way latency %.1f us, streaming %.2f GB/s\n", lat*1e6, bw/1e9)
		}
		fmt.Fprintf(out, "#\n# %10s %12s %6s %6s %5s %10s %8s %8s %7s %8s %7s\n", "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "lat/raw", "bw/raw")
		fmt.Fprintf(out, "# %10s %12s %6s %6s %5s %10s %8s %8s %7s %8s %7s\n", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "", "")
	}
	for _, op := range o.ops {
		if g.Rank() == 0 {
			fmt.Fprintf(out, "# %s\n", op)
		}
		for size := o.minBytes; size <= o.maxBytes; size *= int64(o.factor) {
			count := int(size / 4)
			if op == "all_gather" || op == "reduce_scatter" {
				count -= count % n
			}
			if count == 0 {
				continue
			}
			r, err := measure(ctx, g, op, count, o)
			if err != nil {
				return fmt.Errorf("%s of %d bytes: %w", op, 4*count, err)
			}
			if g.Rank() == 0 {
				bytes := float64(4 * count)
				algbw := bytes / r.seconds / 1e9
				busbw := algbw * busFactor(op, n)
				redop, root := "sum", -1
				if op == "all_gather" || op == "broadcast" {
					redop = "none"
				}
				if op == "broadcast" {
					root = 0
				}
				latRatio, bwRatio := math.NaN(), math.NaN()
				if n > 1 {
					latRatio, bwRatio = r.seconds/lat, busbw*1e9/bw
				}
				fmt.Fprintf(out, "  %10d %12d %6s %6s %5d %10.1f %8.3f %8.3f %7d %8.1f %7.3f\n",
					4*count, count, "float", redop, root, r.seconds*1e6, algbw, busbw, r.wrong, latRatio, bwRatio)
			}
		}
	}
	return g.Barrier(ctx)
}

func busFactor(op string, n int) float64 {
	switch op {
	case "all_reduce":
		return 2 * float64(n-1) / float64(n)
	case "all_gather", "reduce_scatter":
		return float64(n-1) / float64(n)
	}
	return 1
}

type result struct {
	seconds float64 // mean time per call of the slowest rank
	wrong   int     // wrong elements, summed over ranks
}

// input is rank r's deterministic element i: small integers, so that sums
// over up to 64 ranks are exact in float32 whatever the reduction order.
func input(r, i int) float32 { return float32((r*31+i*17)%61 - 30) }

// measure times one collective of count elements (the total buffer for
// all_gather and reduce_scatter) and checks one more call's result.
func measure(ctx context.Context, g *dist.ProcessGroup, op string, count int, o options) (result, error) {
	n, me := g.WorldSize(), g.Rank()
	var src, dst []float32
	switch op {
	case "all_gather":
		src, dst = make([]float32, count/n), make([]float32, count)
	case "reduce_scatter":
		src, dst = make([]float32, count), make([]float32, count/n)
	default:
		dst = make([]float32, count)
	}
	fill := func() {
		switch op {
		case "all_gather":
			for i := range src {
				src[i] = input(me, i)
			}
		case "reduce_scatter":
			for i := range src {
				src[i] = input(me, i)
			}
		default:
			for i := range dst {
				dst[i] = input(me, i)
			}
		}
	}
	call := func() error {
		switch op {
		case "all_reduce":
			return g.AllReduce(ctx, dst, dist.Sum)
		case "all_gather":
			return g.AllGather(ctx, dst, src)
		case "reduce_scatter":
			return g.ReduceScatter(ctx, dst, src, dist.Sum)
		default:
			return g.Broadcast(ctx, dst, 0)
		}
	}
	fill()
	for range o.warmup {
		if err := call(); err != nil {
			return result{}, err
		}
	}
	if err := g.Barrier(ctx); err != nil {
		return result{}, err
	}
	start := time.Now()
	for range o.iters {
		if err := call(); err != nil {
			return result{}, err
		}
	}
	stat := []float64{time.Since(start).Seconds() / float64(o.iters), 0}
	if o.check {
		fill()
		if err := call(); err != nil {
			return result{}, err
		}
		stat[1] = float64(countWrong(op, n, me, dst))
	}
	// The slowest rank's time; the wrong elements of all ranks.
	t := []float64{stat[0]}
	if err := g.AllReduceF64(ctx, t, dist.Max); err != nil {
		return result{}, err
	}
	w := []float64{stat[1]}
	if err := g.AllReduceF64(ctx, w, dist.Sum); err != nil {
		return result{}, err
	}
	return result{seconds: t[0], wrong: int(w[0])}, nil
}

// countWrong compares this rank's result with the reference.
func countWrong(op string, n, me int, dst []float32) int {
	wrong := 0
	switch op {
	case "all_reduce":
		for i, v := range dst {
			var want float32
			for r := range n {
				want += input(r, i)
			}
			if v != want {
				wrong++
			}
		}
	case "all_gather":
		b := len(dst) / n
		for i, v := range dst {
			if v != input(i/b, i%b) {
				wrong++
			}
		}
	case "reduce_scatter":
		for i, v := range dst {
			var want float32
			for r := range n {
				want += input(r, me*len(dst)+i)
			}
			if v != want {
				wrong++
			}
		}
	case "broadcast":
		for i, v := range dst {
			if v != input(0, i) {
				wrong++
			}
		}
	}
	return wrong
}

// rawBaseline measures plain TCP between ranks 0 and 1 of this job (the
// same processes the collectives run in): the one-way latency of an 8-byte
// ping-pong and the bandwidth of a 64 MiB stream, as seen by rank 0. Other
// ranks wait.
func rawBaseline(ctx context.Context, g *dist.ProcessGroup) (lat, bw float64, err error) {
	const (
		tag       = 1
		pings     = 2000
		streamLen = 64 << 20
		chunk     = 1 << 20
	)
	if g.WorldSize() < 2 || g.Rank() > 1 {
		return 0, 0, g.Barrier(ctx)
	}
	var conn net.Conn
	if g.Rank() == 1 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, 0, err
		}
		defer ln.Close()
		if err := g.Send(ctx, 0, tag, []byte(ln.Addr().String())); err != nil {
			return 0, 0, err
		}
		if conn, err = ln.Accept(); err != nil {
			return 0, 0, err
		}
	} else {
		addr, err := g.Recv(ctx, 1, tag)
		if err != nil {
			return 0, 0, err
		}
		if conn, err = net.Dial("tcp", string(addr)); err != nil {
			return 0, 0, err
		}
	}
	defer conn.Close()
	buf := make([]byte, chunk)
	if g.Rank() == 1 {
		for range pings {
			if _, err := io.ReadFull(conn, buf[:8]); err != nil {
				return 0, 0, err
			}
			if _, err := conn.Write(buf[:8]); err != nil {
				return 0, 0, err
			}
		}
		if _, err := io.CopyN(io.Discard, conn, streamLen); err != nil {
			return 0, 0, err
		}
		if _, err := conn.Write(buf[:1]); err != nil {
			return 0, 0, err
		}
		return 0, 0, g.Barrier(ctx)
	}
	start := time.Now()
	for range pings {
		if _, err := conn.Write(buf[:8]); err != nil {
			return 0, 0, err
		}
		if _, err := io.ReadFull(conn, buf[:8]); err != nil {
			return 0, 0, err
		}
	}
	lat = time.Since(start).Seconds() / pings / 2
	start = time.Now()
	for sent := 0; sent < streamLen; sent += chunk {
		if _, err := conn.Write(buf); err != nil {
			return 0, 0, err
		}
	}
	if _, err := io.ReadFull(conn, buf[:1]); err != nil {
		return 0, 0, err
	}
	bw = streamLen / time.Since(start).Seconds()
	return lat, bw, g.Barrier(ctx)
}
