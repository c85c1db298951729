// Command peers measures gdist beside Open MPI on the same machine, in one
// run: the same ping-pongs, one-way streams and in-place float32 sum
// all-reduces between 2 ranks (separate OS processes, on shared memory for
// both: gdist's default transport on one host, Open MPI's vader BTL), in
// interleaved rounds, and prints each figure of both with the median of the
// per-round ratios gdist / Open MPI.
//
// The Open MPI side is mpi/mpi_peer.c, built with mpicc from
// Debian's Open MPI packages; the gdist side is this program's worker (-worker),
// which makes the same calls through dist.ProcessGroup: Send and RecvInto
// for MPI_Send and MPI_Recv, AllReduce for MPI_Allreduce(MPI_IN_PLACE), and
// Barrier. Both time each round trip and each all-reduce on its own with a
// monotonic clock and report medians; a stream is timed from a barrier to
// the receiver's acknowledgement of the last message. Each gdist rank runs
// with GOMAXPROCS=1.
//
// # Usage
//
//	bench/peers/run.sh                  # installs Open MPI if missing, builds mpi_peer, runs 5 rounds
//	bench/peers/run.sh -rounds 9 -bind none
//	go run ./bench/peers -mpi /path/to/mpi_peer -rounds 5
//	go run ./bench/peers                # gdist only (no -mpi)
//
// -bind core (the default) binds rank r of either job to CPU r, which is
// what mpirun does by default for 2 ranks (gdistrun -bind-to core); -bind none
// leaves both to the kernel. mpirun runs with --mca pml ob1 --mca btl
// self,vader (shared memory) unless OMPI_MCA_pml or OMPI_MCA_btl is set, and
// with --allow-run-as-root when run as root. Ratios are gdist / Open MPI: for
// times lower is better for gdist, for bandwidths higher. -cpuprofile f
// writes each gdist rank's CPU profile of its last round to f.rankN.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gdist/gdist"
	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/internal/cli"
	"github.com/gdist/gdist/internal/launch"
)

type options struct {
	worker      bool
	mpi         string
	mpirun      string
	rounds      int
	bind        string
	ppSizes     []int
	streamSizes []int
	arSizes     []int
	ppIters     int
	ppWarmup    int
	streamMiB   int
	arIters     int
	arWarmup    int
	small       int
	cpuprofile  string
}

// figure is one measurement, as both peers print it after "RESULT ".
type figure struct {
	Kind     string  `json:"kind"` // pingpong, stream, allreduce
	Bytes    int     `json:"bytes"`
	MedianUS float64 `json:"median_us,omitempty"`
	MeanUS   float64 `json:"mean_us,omitempty"`
	GBps     float64 `json:"gbps,omitempty"`  // stream
	Busbw    float64 `json:"busbw,omitempty"` // all-reduce, GB/s
	Wrong    int     `json:"wrong"`
}

// errUsage reports bad command-line arguments (already printed).
var errUsage = errors.New("peers: usage")

func main() { cli.Main("peers", errUsage, run) }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("peers", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if o.worker {
		if err := worker(ctx, o, stdout); err != nil {
			return fmt.Errorf("worker: %w", err)
		}
		return nil
	}
	return compare(ctx, o, stdout, stderr)
}

func parseFlags(fs *flag.FlagSet, args []string) (options, error) {
	var o options
	fs.BoolVar(&o.worker, "worker", false, "run as one gdist rank (RANK, WORLD_SIZE, ... from the environment)")
	fs.StringVar(&o.mpi, "mpi", "", "the built mpi_peer program (empty: gdist only)")
	fs.StringVar(&o.mpirun, "mpirun", "mpirun", "Open MPI's launcher")
	fs.IntVar(&o.rounds, "rounds", 5, "rounds; each runs both peers, in alternating order")
	fs.StringVar(&o.bind, "bind", "core", "core: rank r on CPU r in both jobs; none: the kernel places them")
	pp := fs.String("pp-sizes", "8,131072", "ping-pong sizes in bytes")
	st := fs.String("stream-sizes", "65536,1048576,16777216", "stream message sizes in bytes")
	ar := fs.String("ar-sizes", "16384,262144,1048576,4194304,16777216", "all-reduce sizes in bytes (float32)")
	fs.IntVar(&o.ppIters, "pp-iters", 20000, "timed round trips per ping-pong size")
	fs.IntVar(&o.ppWarmup, "pp-warmup", 2000, "untimed round trips before them")
	fs.IntVar(&o.streamMiB, "stream-mib", 256, "MiB per stream (at least 8 messages)")
	fs.IntVar(&o.arIters, "ar-iters", 200, "timed all-reduces per size (scaled down above 1 MiB, at least 20)")
	fs.IntVar(&o.arWarmup, "ar-warmup", 10, "untimed all-reduces per size")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write each gdist rank's CPU profile to `file`.rankN")
	fs.IntVar(&o.small, "small", -1, "gdist's all-reduce small-message threshold in bytes (dist.WithSmallThreshold; -1: the default)")
	if err := cli.Parse(fs, args, errUsage); err != nil {
		return o, err
	}
	var err error
	for _, l := range []struct {
		name string
		s    string
		dst  *[]int
	}{{"-pp-sizes", *pp, &o.ppSizes}, {"-stream-sizes", *st, &o.streamSizes}, {"-ar-sizes", *ar, &o.arSizes}} {
		if *l.dst, err = ints(l.s); err != nil {
			return o, cli.Usagef(fs, errUsage, "%s: %v", l.name, err)
		}
	}
	for _, s := range o.arSizes {
		if s%4 != 0 {
			return o, cli.Usagef(fs, errUsage, "-ar-sizes: %d is not a whole number of float32", s)
		}
	}
	if o.rounds < 1 || o.ppIters < 1 || o.streamMiB < 1 || o.arIters < 1 || o.ppWarmup < 0 || o.arWarmup < 0 {
		return o, cli.Usagef(fs, errUsage, "need -rounds, -pp-iters, -stream-mib, -ar-iters >= 1 and warm-ups >= 0")
	}
	if o.bind != "core" && o.bind != "none" {
		return o, cli.Usagef(fs, errUsage, "-bind %q: want core or none", o.bind)
	}
	return o, nil
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad number %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func join(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

// ---- orchestrator ----

// key names a figure across peers and rounds.
type key struct {
	kind  string
	bytes int
}

// peer runs one job of a peer and returns its figures.
type peer struct {
	name string
	run  func(ctx context.Context) ([]figure, error)
}

func compare(ctx context.Context, o options, stdout, stderr io.Writer) error {
	peers := []peer{{"gdist", func(ctx context.Context) ([]figure, error) { return runGdist(ctx, o, stderr) }}}
	if o.mpi != "" {
		peers = append(peers, peer{"Open MPI", func(ctx context.Context) ([]figure, error) { return runMPI(ctx, o, stderr) }})
	}
	fmt.Fprintf(stdout, "# peers: 2 ranks as OS processes on shared memory, bind %s, %d rounds (peers alternate first); load %s\n",
		o.bind, o.rounds, loadavg())
	got := make([]map[key][]figure, len(peers)) // per peer: figures by key, one per round
	for i := range got {
		got[i] = map[key][]figure{}
	}
	var order []key
	for round := range o.rounds {
		for k := range peers {
			i := k
			if round%2 == 1 {
				i = len(peers) - 1 - k
			}
			fs, err := peers[i].run(ctx)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", round+1, peers[i].name, err)
			}
			for _, f := range fs {
				kk := key{f.Kind, f.Bytes}
				if !slices.Contains(order, kk) {
					order = append(order, kk)
				}
				got[i][kk] = append(got[i][kk], f)
			}
		}
		fmt.Fprintf(stderr, "peers: round %d of %d done (load %s)\n", round+1, o.rounds, loadavg())
	}
	report(stdout, o, peers, got, order)
	fmt.Fprintf(stdout, "# load at the end: %s\n", loadavg())
	return nil
}

// busbwMin: all-reduces larger than this are reported by their bus
// bandwidth, smaller ones by their time.
const busbwMin = 64 << 10

// value returns the figure's headline number, its unit and whether lower
// is better.
func value(f figure) (float64, string, bool) {
	switch {
	case f.Kind == "stream":
		return f.GBps, "GB/s", false
	case f.Kind == "allreduce" && f.Bytes > busbwMin:
		return f.Busbw, "GB/s", false
	}
	return f.MedianUS, "us", true
}

func label(k key) string {
	switch k.kind {
	case "pingpong":
		return fmt.Sprintf("ping-pong RTT %s", size(k.bytes))
	case "stream":
		return fmt.Sprintf("stream %s", size(k.bytes))
	case "allreduce":
		if k.bytes > busbwMin {
			return fmt.Sprintf("all-reduce %s (%d f32) busbw", size(k.bytes), k.bytes/4)
		}
		return fmt.Sprintf("all-reduce %s (%d f32) time", size(k.bytes), k.bytes/4)
	}
	return k.kind
}

func size(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// report prints one row per figure: each peer's median over the rounds and,
// with both peers, the median of the per-round ratios gdist / Open MPI and
// their range.
func report(w io.Writer, o options, peers []peer, got []map[key][]figure, order []key) {
	fmt.Fprintf(w, "%-38s %-5s", "measure", "unit")
	for _, p := range peers {
		fmt.Fprintf(w, " %10s", p.name)
	}
	if len(peers) == 2 {
		fmt.Fprintf(w, " %14s %15s  %s", "gdist/OpenMPI", "range", "better")
	}
	fmt.Fprintln(w)
	for _, k := range order {
		var unit string
		lower := true
		vals := make([][]float64, len(peers))
		wrong := 0
		for i := range peers {
			for _, f := range got[i][k] {
				v, u, l := value(f)
				vals[i] = append(vals[i], v)
				unit, lower = u, l
				wrong += f.Wrong
			}
		}
		fmt.Fprintf(w, "%-38s %-5s", label(k), unit)
		for i := range peers {
			fmt.Fprintf(w, " %10.3f", median(vals[i]))
		}
		if len(peers) == 2 && len(vals[0]) == len(vals[1]) && len(vals[0]) > 0 {
			ratios := make([]float64, len(vals[0]))
			for r := range ratios {
				ratios[r] = vals[0][r] / vals[1][r]
			}
			better := "higher"
			if lower {
				better = "lower"
			}
			fmt.Fprintf(w, " %13.2fx %7.2f-%-6.2f  %s", median(ratios), slices.Min(ratios), slices.Max(ratios), better)
		}
		if wrong > 0 {
			fmt.Fprintf(w, "  WRONG RESULTS: %d", wrong)
		}
		fmt.Fprintln(w)
	}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// loadavg returns the first three fields of /proc/loadavg, or "?".
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// measureArgs are the measurement settings as key=value arguments
// (mpi_peer's form).
func measureArgs(o options) []string {
	return []string{
		"pp_sizes=" + join(o.ppSizes), "stream_sizes=" + join(o.streamSizes), "ar_sizes=" + join(o.arSizes),
		"pp_iters=" + strconv.Itoa(o.ppIters), "pp_warmup=" + strconv.Itoa(o.ppWarmup),
		"stream_mib=" + strconv.Itoa(o.streamMiB), "ar_iters=" + strconv.Itoa(o.arIters), "ar_warmup=" + strconv.Itoa(o.arWarmup),
	}
}

// runMPI runs one mpi_peer job of 2 ranks.
func runMPI(ctx context.Context, o options, stderr io.Writer) ([]figure, error) {
	args := []string{"-np", "2"}
	if os.Geteuid() == 0 {
		args = append(args, "--allow-run-as-root")
	}
	if os.Getenv("OMPI_MCA_pml") == "" && os.Getenv("OMPI_MCA_btl") == "" {
		args = append(args, "--mca", "pml", "ob1", "--mca", "btl", "self,vader")
	}
	args = append(args, "--bind-to", o.bind, o.mpi)
	args = append(args, measureArgs(o)...)
	cmd := exec.CommandContext(ctx, o.mpirun, args...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = launch.NewPrefixWriter(launch.Synced(stderr), "[mpi] ")
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s %s: %w", o.mpirun, strings.Join(args, " "), err)
	}
	return parseFigures(&out)
}

// parseFigures reads the RESULT lines of r.
func parseFigures(r io.Reader) ([]figure, error) {
	var fs []figure
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		v, ok := strings.CutPrefix(sc.Text(), "RESULT ")
		if !ok {
			continue
		}
		var f figure
		if err := json.Unmarshal([]byte(v), &f); err != nil {
			return nil, fmt.Errorf("bad result line %q: %w", sc.Text(), err)
		}
		fs = append(fs, f)
	}
	if len(fs) == 0 {
		return nil, errors.New("no results")
	}
	return fs, sc.Err()
}

// runGdist runs one job of 2 gdist workers (this program, GOMAXPROCS=1
// each).
func runGdist(ctx context.Context, o options, stderr io.Writer) ([]figure, error) {
	args := append([]string{"-worker"}, workerFlags(o)...)
	var (
		mu  sync.Mutex
		out bytes.Buffer
	)
	errs := launch.Synced(stderr)
	r, err := launch.Start(ctx, launch.Job{
		Spec:  launch.Spec{NProc: 2},
		Args:  args,
		Procs: 1,
		Bind:  o.bind == "core",
		Output: func(rank int) (io.Writer, io.Writer) {
			e := launch.NewPrefixWriter(errs, fmt.Sprintf("[gdist %d] ", rank))
			if rank != 0 {
				return e, e
			}
			return launch.LineFunc(func(line string) {
				mu.Lock()
				defer mu.Unlock()
				fmt.Fprintln(&out, line)
			}), e
		},
	})
	if err != nil {
		return nil, err
	}
	if err := r.Wait(); err != nil {
		return nil, err
	}
	mu.Lock()
	defer mu.Unlock()
	return parseFigures(&out)
}

// workerFlags passes the measurement settings on to the workers.
func workerFlags(o options) []string {
	return []string{
		"-pp-sizes", join(o.ppSizes), "-stream-sizes", join(o.streamSizes), "-ar-sizes", join(o.arSizes),
		"-pp-iters", strconv.Itoa(o.ppIters), "-pp-warmup", strconv.Itoa(o.ppWarmup),
		"-stream-mib", strconv.Itoa(o.streamMiB), "-ar-iters", strconv.Itoa(o.arIters), "-ar-warmup", strconv.Itoa(o.arWarmup),
		"-small", strconv.Itoa(o.small), "-cpuprofile", o.cpuprofile,
	}
}

// ---- gdist worker: mpi_peer.c's measurements through dist ----

// Tags, as in mpi_peer.c.
const (
	tagPing   = 2
	tagStream = 3
	tagAck    = 4
)

func worker(ctx context.Context, o options, stdout io.Writer) (err error) {
	var opts []gdist.Option
	if o.small >= 0 {
		opts = append(opts, gdist.WithGroupOptions(dist.WithSmallThreshold(o.small)))
	}
	g, err := gdist.InitFromEnv(ctx, opts...)
	if err != nil {
		return err
	}
	defer cli.Close(&err, g)
	if g.WorldSize() < 2 {
		return errors.New("needs at least 2 ranks")
	}
	if o.cpuprofile != "" {
		f, err := os.Create(fmt.Sprintf("%s.rank%d", o.cpuprofile, g.Rank()))
		if err != nil {
			return err
		}
		defer cli.Close(&err, f)
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	emit := func(f figure) {
		if g.Rank() == 0 {
			b, _ := json.Marshal(f)
			fmt.Fprintf(stdout, "RESULT %s\n", b)
		}
	}
	for _, s := range o.ppSizes {
		f, err := pingPong(ctx, g, s, o)
		if err != nil {
			return fmt.Errorf("ping-pong %d: %w", s, err)
		}
		emit(f)
	}
	for _, s := range o.streamSizes {
		f, err := stream(ctx, g, s, o)
		if err != nil {
			return fmt.Errorf("stream %d: %w", s, err)
		}
		emit(f)
	}
	for _, s := range o.arSizes {
		f, err := allReduce(ctx, g, s, o)
		if err != nil {
			return fmt.Errorf("all-reduce %d: %w", s, err)
		}
		emit(f)
	}
	return g.Barrier(ctx)
}

func pingPong(ctx context.Context, g *dist.ProcessGroup, size int, o options) (figure, error) {
	buf := make([]byte, size)
	lat := make([]float64, 0, o.ppIters)
	rank := g.Rank()
	other := 1 - rank
	if err := g.Barrier(ctx); err != nil {
		return figure{}, err
	}
	for i := range o.ppWarmup + o.ppIters {
		switch rank {
		case 0:
			t0 := time.Now()
			if err := g.Send(ctx, other, tagPing, buf); err != nil {
				return figure{}, err
			}
			if _, err := g.RecvInto(ctx, other, tagPing, buf); err != nil {
				return figure{}, err
			}
			if i >= o.ppWarmup {
				lat = append(lat, float64(time.Since(t0).Nanoseconds()))
			}
		case 1:
			if _, err := g.RecvInto(ctx, other, tagPing, buf); err != nil {
				return figure{}, err
			}
			if err := g.Send(ctx, other, tagPing, buf); err != nil {
				return figure{}, err
			}
		}
	}
	f := figure{Kind: "pingpong", Bytes: size}
	if rank == 0 {
		var sum float64
		for _, l := range lat {
			sum += l
		}
		f.MedianUS, f.MeanUS = median(lat)/1e3, sum/float64(len(lat))/1e3
	}
	return f, nil
}

// streamOnce sends n messages of size bytes from rank 0 to rank 1 and
// returns the time until rank 1's acknowledgement arrived.
func streamOnce(ctx context.Context, g *dist.ProcessGroup, buf []byte, n int) (time.Duration, error) {
	ack := []byte{1}
	if err := g.Barrier(ctx); err != nil {
		return 0, err
	}
	t0 := time.Now()
	switch g.Rank() {
	case 0:
		for range n {
			if err := g.Send(ctx, 1, tagStream, buf); err != nil {
				return 0, err
			}
		}
		if _, err := g.RecvInto(ctx, 1, tagAck, ack); err != nil {
			return 0, err
		}
	case 1:
		for range n {
			if _, err := g.RecvInto(ctx, 0, tagStream, buf); err != nil {
				return 0, err
			}
		}
		if err := g.Send(ctx, 0, tagAck, ack); err != nil {
			return 0, err
		}
	}
	return time.Since(t0), nil
}

func stream(ctx context.Context, g *dist.ProcessGroup, size int, o options) (figure, error) {
	n := max(o.streamMiB<<20/size, 8)
	buf := make([]byte, size)
	if _, err := streamOnce(ctx, g, buf, max(n/10, 2)); err != nil {
		return figure{}, err
	}
	d, err := streamOnce(ctx, g, buf, n)
	if err != nil {
		return figure{}, err
	}
	return figure{Kind: "stream", Bytes: size, GBps: float64(size) * float64(n) / float64(d.Nanoseconds())}, nil
}

// input is rank r's element i, as in mpi_peer.c: small integers, so that
// the sums are exact.
func input(r, i int) float32 { return float32((r*31+i*17)%61 - 30) }

func allReduce(ctx context.Context, g *dist.ProcessGroup, bytes int, o options) (figure, error) {
	count := bytes / 4
	iters := o.arIters
	if bytes > 1<<20 {
		iters = iters * (1 << 20) / bytes
	}
	iters = max(iters, 20)
	x := make([]float32, count)
	lat := make([]float64, 0, iters)
	rank, world := g.Rank(), g.WorldSize()
	for i := range o.arWarmup + iters {
		for k := range x {
			x[k] = input(rank, k)
		}
		if err := g.Barrier(ctx); err != nil {
			return figure{}, err
		}
		t0 := time.Now()
		if err := g.AllReduce(ctx, dist.F32(x), dist.Sum); err != nil {
			return figure{}, err
		}
		if i >= o.arWarmup {
			lat = append(lat, float64(time.Since(t0).Nanoseconds()))
		}
	}
	wrong := 0
	for k, v := range x {
		var want float32
		for r := range world {
			want += input(r, k)
		}
		if v != want {
			wrong++
		}
	}
	stat := []float64{median(lat)}
	if err := g.AllReduce(ctx, dist.F64(stat), dist.Max); err != nil {
		return figure{}, err
	}
	w := []float64{float64(wrong)}
	if err := g.AllReduce(ctx, dist.F64(w), dist.Sum); err != nil {
		return figure{}, err
	}
	busbw := float64(bytes) / stat[0] * 2 * float64(world-1) / float64(world)
	return figure{Kind: "allreduce", Bytes: bytes, MedianUS: stat[0] / 1e3, Busbw: busbw, Wrong: int(w[0])}, nil
}
