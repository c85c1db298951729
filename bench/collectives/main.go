// Command collectives measures gdist's collectives in the format of
// nccl-tests: ranks run as separate OS processes (this program re-executes
// itself, one process per rank, GOMAXPROCS=1 each) connected by the TCP
// transport over loopback (or shared memory, -transport), and sweep message
// sizes for all_reduce, all_gather, reduce_scatter and broadcast.
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
//	go run ./bench/collectives -ops all_reduce -np 2 -b 16M -e 16M -transport tcp,shm
//
// Flags: -b and -e are the smallest and largest sizes in bytes (suffixes K,
// M, G), -f the factor between sizes, -n the timed iterations per size (-w
// warm-up iterations), -ops a comma-separated list of collectives, -np a
// comma-separated list of world sizes, -small the all-reduce small-message
// threshold (-1 keeps dist.DefaultSmallThreshold), -check=false skips the
// #wrong check. -transport is a comma-separated list of values of
// GDIST_TRANSPORT — tcp (TCP between every pair), shm (shared memory
// between the ranks of this host, or fail) and auto (what gdist.InitFromEnv
// does by default: shared memory where it sets up) — every rank joining
// with gdist.InitFromEnv: one job per world size and transport, the
// transports of a world size back to back, so that their tables compare
// within one run. Each table's header says how rank 0 reached its peers.
// -group runs each collective on the job's group ("world"), on a subgroup
// of all the ranks made with NewGroup ("sub": the same members, so the
// same world size, through the subgroup machinery), or on both one after
// the other at every size ("world,sub"), with a group column and, for the
// subgroup's rows, its time as a ratio to the world's (sub/world).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gdist/gdist"
	config "github.com/gdist/gdist/internal/options"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/internal/cli"
	"github.com/gdist/gdist/internal/launch"
	"github.com/gdist/gdist/internal/rawtcp"
)

// childEnv marks a process started by the launcher as one rank.
const childEnv = "GDIST_BENCH_COLLECTIVES_CHILD"

// transportEnv tells a rank which transport of -transport its job uses.
const transportEnv = "GDIST_BENCH_COLLECTIVES_TRANSPORT"

type options struct {
	minBytes, maxBytes int64
	factor             int
	iters, warmup      int
	ops                []string
	nps                []int
	small              int
	check              bool
	transports         []string
	groups             []string
}

var validOps = []string{"all_reduce", "all_gather", "reduce_scatter", "broadcast"}

// validTransports are the values of -transport, GDIST_TRANSPORT's.
var validTransports = []string{"tcp", "shm", "auto"}

// errUsage reports bad command-line arguments (already printed).
var errUsage = errors.New("collectives: usage")

func main() { cli.Main("collectives", errUsage, run) }

// run is the program: the launcher, or one rank when childEnv is set.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("collectives", flag.ContinueOnError)
	fs.SetOutput(stderr)
	opts, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if os.Getenv(childEnv) != "" {
		if err := runRank(ctx, opts, stdout); err != nil {
			return fmt.Errorf("rank %s: %w", os.Getenv(launch.EnvRank), err)
		}
		return nil
	}
	return launchAll(ctx, opts, args, stdout, stderr)
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
	grs := fs.String("group", "world", "groups to run each collective on, comma-separated: world (the job's group) and sub (a subgroup of every rank)")
	trs := fs.String("transport", "tcp", "transports to run, comma-separated, one job each per world size: tcp, shm (shared memory, Linux) or auto (gdist.InitFromEnv with GDIST_TRANSPORT=auto)")
	if err := cli.Parse(fs, args, errUsage); err != nil {
		return o, err
	}
	var err error
	bad := func(format string, a ...any) (options, error) {
		return o, cli.Usagef(fs, errUsage, format, a...)
	}
	if o.minBytes, err = parseSize(*minB); err != nil {
		return bad("-b: %v", err)
	}
	if o.maxBytes, err = parseSize(*maxB); err != nil {
		return bad("-e: %v", err)
	}
	if o.minBytes < 1 || o.maxBytes < o.minBytes {
		return bad("need 1 <= -b <= -e, got %d and %d", o.minBytes, o.maxBytes)
	}
	if o.factor < 2 || o.iters < 1 || o.warmup < 0 {
		return bad("need -f >= 2, -n >= 1, -w >= 0")
	}
	for _, op := range strings.Split(*ops, ",") {
		if !slices.Contains(validOps, op) {
			return bad("unknown collective %q (want some of %s)", op, strings.Join(validOps, ","))
		}
		o.ops = append(o.ops, op)
	}
	for _, tr := range strings.Split(*trs, ",") {
		if !slices.Contains(validTransports, tr) {
			return bad("unknown transport %q (want some of %s)", tr, strings.Join(validTransports, ","))
		}
		o.transports = append(o.transports, tr)
	}
	for _, gr := range strings.Split(*grs, ",") {
		if gr != "world" && gr != "sub" {
			return bad("unknown group %q (want world, sub or both)", gr)
		}
		o.groups = append(o.groups, gr)
	}
	for _, s := range strings.Split(*nps, ",") {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 64 {
			return bad("bad -np entry %q", s)
		}
		o.nps = append(o.nps, n)
	}
	return o, nil
}

// parseSize parses a message size such as 8, 64K or 16M.
func parseSize(s string) (int64, error) {
	n, err := config.ParseBytes(s)
	if err != nil {
		return 0, fmt.Errorf("bad size %q: %w", s, err)
	}
	return int64(n), nil
}

// launchAll runs one job per world size in opts.nps and transport in
// opts.transports, the transports of one world size back to back.
func launchAll(ctx context.Context, opts options, args []string, stdout, stderr io.Writer) error {
	for _, np := range opts.nps {
		for _, tr := range opts.transports {
			if err := launchJob(ctx, np, tr, args, stdout, stderr); err != nil {
				return fmt.Errorf("np=%d, transport %s: %w", np, tr, err)
			}
		}
	}
	return nil
}

// launchJob starts np copies of this program as the ranks of one job
// (GOMAXPROCS=1 each, a fresh token and master port) and relays rank 0's
// output and every rank's stderr, prefixed by rank.
func launchJob(ctx context.Context, np int, tr string, args []string, stdout, stderr io.Writer) error {
	errs := launch.Synced(stderr)
	out := launch.Synced(stdout)
	r, err := launch.Start(ctx, launch.Job{
		Spec:  launch.Spec{NProc: np},
		Args:  args,
		Env:   []string{childEnv + "=1", transportEnv + "=" + tr},
		Procs: 1,
		Output: func(rank int) (io.Writer, io.Writer) {
			e := launch.NewPrefixWriter(errs, fmt.Sprintf("[%d] ", rank))
			if rank == 0 {
				return launch.NewPrefixWriter(out, ""), e
			}
			return nil, e
		},
	})
	if err != nil {
		return err
	}
	return r.Wait()
}

// join makes this rank's group with gdist.InitFromEnv, GDIST_TRANSPORT
// set to tr.
func join(ctx context.Context, tr string, gopts []dist.Option) (*dist.ProcessGroup, error) {
	if err := os.Setenv(gdist.EnvTransport, tr); err != nil {
		return nil, err
	}
	return gdist.InitFromEnv(ctx, gdist.WithGroupOptions(gopts...))
}

// routes says how this rank reaches its peers (gdist.InitFromEnv's transport
// tells).
func routes(g *dist.ProcessGroup) string {
	if v, ok := g.Transport().(interface{ Summary() string }); ok {
		return v.Summary()
	}
	return fmt.Sprintf("%T", g.Transport())
}

// runRank is one rank's side of the benchmark.
func runRank(ctx context.Context, o options, out io.Writer) (err error) {
	var gopts []dist.Option
	if o.small >= 0 {
		gopts = append(gopts, dist.WithSmallThreshold(o.small))
	}
	tr := os.Getenv(transportEnv)
	if tr == "" {
		tr = o.transports[0]
	}
	ictx, cancel := context.WithTimeout(ctx, 60*time.Second)
	g, err := join(ictx, tr, gopts)
	cancel()
	if err != nil {
		return err
	}
	defer cli.Close(&err, g)
	n := g.WorldSize()
	sub, err := g.NewGroup(ctx, all(n))
	if err != nil {
		return err
	}
	groups := map[string]*dist.ProcessGroup{"world": g, "sub": sub}
	raw, err := rawBaseline(ctx, g)
	lat, bw := raw.LatencyUs/1e6, raw.StreamGBps*1e9
	if err != nil {
		return fmt.Errorf("raw TCP baseline: %w", err)
	}
	if g.Rank() == 0 {
		fmt.Fprintf(out, "# gdist collectives: np=%d, transport %s (rank 0: %s), one OS process per rank, GOMAXPROCS=1, float32, in place\n", n, tr, routes(g))
		if n > 1 {
			fmt.Fprintf(out, "# raw TCP baseline (ranks 0 <-> 1, same processes): one-way latency %.1f us, streaming %.2f GB/s, 2-rank ring exchange of %d MiB %.1f ms\n",
				raw.LatencyUs, raw.StreamGBps, raw.ExchangeBytes>>20, raw.ExchangeMs)
		}
		fmt.Fprintf(out, "#\n# %10s %12s %6s %6s %5s %6s %10s %8s %8s %7s %8s %7s %9s\n", "size", "count", "type", "redop", "root", "group", "time", "algbw", "busbw", "#wrong", "lat/raw", "bw/raw", "sub/world")
		fmt.Fprintf(out, "# %10s %12s %6s %6s %5s %6s %10s %8s %8s %7s %8s %7s %9s\n", "(B)", "(elements)", "", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "", "", "")
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
			world := math.NaN()
			for _, gname := range o.groups {
				r, err := measure(ctx, groups[gname], op, count, o)
				if err != nil {
					return fmt.Errorf("%s of %d bytes on %s: %w", op, 4*count, gname, err)
				}
				if g.Rank() != 0 {
					continue
				}
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
				ratio := math.NaN()
				if gname == "world" {
					world = r.seconds
				} else {
					ratio = r.seconds / world
				}
				fmt.Fprintf(out, "  %10d %12d %6s %6s %5d %6s %10.1f %8.3f %8.3f %7d %8.1f %7.3f %9.3f\n",
					4*count, count, "float", redop, root, gname, r.seconds*1e6, algbw, busbw, r.wrong, latRatio, bwRatio, ratio)
			}
		}
	}
	return g.Barrier(ctx)
}

// all returns 0, 1, ..., n-1.
func all(n int) []int {
	r := make([]int, n)
	for i := range r {
		r[i] = i
	}
	return r
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
			return g.AllReduce(ctx, dist.F32(dst), dist.Sum)
		case "all_gather":
			return g.AllGather(ctx, dist.F32(dst), dist.F32(src))
		case "reduce_scatter":
			return g.ReduceScatter(ctx, dist.F32(dst), dist.F32(src), dist.Sum)
		default:
			return g.Broadcast(ctx, dist.F32(dst), 0)
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
	if err := g.AllReduce(ctx, dist.F64(t), dist.Max); err != nil {
		return result{}, err
	}
	w := []float64{stat[1]}
	if err := g.AllReduce(ctx, dist.F64(w), dist.Sum); err != nil {
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

// tagRawAddr carries the raw-socket baseline's listener address.
const tagRawAddr = 1

// rawBaseline measures plain TCP between ranks 0 and 1 of this job (the
// same processes the collectives run in) with package rawtcp: the one-way
// latency of an 8-byte ping-pong, the bandwidth of a 64 MiB stream and the
// 2-rank ring exchange of 16 MiB, as seen by rank 0. Other ranks wait.
func rawBaseline(ctx context.Context, g *dist.ProcessGroup) (rawtcp.Figures, error) {
	var f rawtcp.Figures
	if g.WorldSize() < 2 || g.Rank() > 1 {
		return f, g.Barrier(ctx)
	}
	c, err := rawtcp.Connect(ctx, g, g.Rank(), 1-g.Rank(), tagRawAddr)
	if err != nil {
		return f, err
	}
	defer c.Close()
	if f, err = c.Measure(ctx, rawtcp.Config{ExchangeBytes: 16 << 20, ExchangeReps: 4}); err != nil {
		return f, err
	}
	return f, g.Barrier(ctx)
}
