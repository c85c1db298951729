// Command hier compares the flat and the hierarchical (topology-aware)
// all-reduce over the transports a job really uses: 4 OS processes
// (GOMAXPROCS=1 each), launched through internal/launch as gdistrun does,
// that join with gdist.InitFromEnv, ranks 0 and 1 on host 0 and ranks 2 and
// 3 on host 1. A job is flat (GDIST_HIERARCHICAL=0: ring and recursive
// doubling over all 4 ranks) or hierarchical (GDIST_HIERARCHICAL=1), over
// TCP only (GDIST_TRANSPORT=tcp) or hybrid (GDIST_TRANSPORT=auto: shared
// memory between the ranks of a host, TCP between the hosts). -transport
// picks the transports; the default, tcp,auto, measures the four
// combinations side by side.
//
// Without -netns every rank is on this machine's loopback and the hosts
// are simulated with GDIST_HOST_ID (ranks 0 and 1 "hostA", 2 and 3
// "hostB"): crossing a "host" costs nothing extra, so that run shows the
// algorithms' and the transports' own costs. With -netns (Linux, root,
// iproute2), the two hosts are two network namespaces joined by one veth
// pair rate-limited with tc tbf at -rate on both ends, started as two
// launches of two ranks (one per "machine", as a multi-node job is) whose
// host identity is the default one (boot id, host name and network
// namespace; GDIST_HOST_ID is not set), so the namespaces alone make them
// two hosts. Traffic within a host then goes through that namespace's
// loopback or shared memory, traffic between the hosts through the shaped
// link. The namespaces (and with them the link) are removed at the end,
// also when the run fails.
//
// Every rank reports, once per job, the host map (Hosts) and the route to
// each peer ((*hybrid.Transport).Via: self, shm or tcp) that its transport
// set up; the table's header shows them per transport, and the run fails
// if two jobs of one transport got different routes or a host map other
// than 0,0,1,1. Jobs run in rounds of one job per combination, the order
// rotated each round (-runs rounds). For every size the program prints,
// per combination, the median over its jobs of the time per all-reduce
// (of the slowest rank, mean over -n iterations), the ratios of those
// medians (hier/flat per transport; hybrid/tcp per algorithm), the mean
// payload bytes per rank sent to the other host per all-reduce (counted by
// the group's own metrics, which every rank turns on), and #wrong: the
// elements, over every rank and job, of one more (untimed) all-reduce per
// size on fresh input that differ from the exact sum. The load average of
// the machine before and after the run is printed too, and two more
// tables: the range (min-max) of the jobs' times, and the CPU time of the
// ranks per all-reduce (user + system, all 4 ranks), which on a machine
// with fewer cores than ranks is time a rank could not compute or
// communicate.
//
// # Usage
//
//	go run ./bench/hier -b 256K -e 16M -n 10 -runs 5
//	sudo go run ./bench/hier -netns -rate 1gbit -b 256K -e 16M -n 5 -runs 3
//	go run ./bench/hier -transport auto   # hybrid only: flat and hierarchical
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gdist/gdist"
	config "github.com/gdist/gdist/internal/options"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/metrics"
	"github.com/gdist/gdist/dist/transport/hybrid"
	"github.com/gdist/gdist/internal/benchutil"
	"github.com/gdist/gdist/internal/cli"
	"github.com/gdist/gdist/internal/launch"
)

// childEnv marks a process started by this program as one rank.
const childEnv = "GDIST_BENCH_HIER_CHILD"

var errUsage = errors.New("hier: usage")

func main() { cli.Main("hier", errUsage, run) }

// hosts is the job layout: two hosts of two ranks.
var hosts = []int{0, 0, 1, 1}

// hostIDs are the GDIST_HOST_ID values of the two simulated hosts (without
// -netns).
var hostIDs = []string{"hostA", "hostB"}

type options struct {
	minBytes, maxBytes int64
	iters, warmup      int
	runs               int
	netns              bool
	rate               string
	transports         []string // GDIST_TRANSPORT values: tcp, auto
}

// mode is one combination a job runs: a transport and an algorithm.
type mode struct {
	transport string // GDIST_TRANSPORT
	hier      bool   // GDIST_HIERARCHICAL=1
}

// transportName is how the table calls a GDIST_TRANSPORT value.
func transportName(t string) string {
	if t == "auto" {
		return "hyb"
	}
	return t
}

func (m mode) String() string {
	alg := "flat"
	if m.hier {
		alg = "hier"
	}
	return alg + "-" + transportName(m.transport)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("hier", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	var b, e, tr string
	fs.StringVar(&b, "b", "256K", "smallest size in bytes (suffixes K, M, G)")
	fs.StringVar(&e, "e", "16M", "largest size in bytes; sizes grow by 4x")
	fs.IntVar(&o.iters, "n", 10, "timed iterations per size")
	fs.IntVar(&o.warmup, "w", 3, "warm-up iterations per size")
	fs.IntVar(&o.runs, "runs", 3, "rounds of jobs (one job per transport and algorithm each)")
	fs.BoolVar(&o.netns, "netns", false, "put the two hosts in network namespaces joined by a shaped link (root)")
	fs.StringVar(&o.rate, "rate", "1gbit", "tc tbf rate of the link between the hosts (with -netns)")
	fs.StringVar(&tr, "transport", "tcp,auto", "comma-separated GDIST_TRANSPORT values to measure: tcp (TCP only), auto (hybrid: shared memory within a host)")
	if err := cli.Parse(fs, args, errUsage); err != nil {
		return err
	}
	var err error
	if o.minBytes, err = parseSize(b); err != nil {
		return cli.Usagef(fs, errUsage, "-b: %v", err)
	}
	if o.maxBytes, err = parseSize(e); err != nil {
		return cli.Usagef(fs, errUsage, "-e: %v", err)
	}
	if o.minBytes < 4 || o.maxBytes < o.minBytes || o.iters < 1 || o.warmup < 0 || o.runs < 1 {
		return cli.Usagef(fs, errUsage, "need 4 <= -b <= -e, -n >= 1, -w >= 0, -runs >= 1")
	}
	if o.transports, err = parseTransports(tr); err != nil {
		return cli.Usagef(fs, errUsage, "-transport: %v", err)
	}
	if os.Getenv(childEnv) != "" {
		return rank(ctx, o, stdout)
	}
	return drive(ctx, o, args, stdout, stderr)
}

// parseSize parses a message size such as 8, 64K or 16M.
func parseSize(s string) (int64, error) {
	n, err := config.ParseBytes(s)
	if err != nil {
		return 0, fmt.Errorf("bad size %q: %w", s, err)
	}
	return int64(n), nil
}

// parseTransports parses -transport: tcp and auto, each at most once.
func parseTransports(s string) ([]string, error) {
	var ts []string
	for t := range strings.SplitSeq(s, ",") {
		if t != "tcp" && t != "auto" {
			return nil, fmt.Errorf("%q: want tcp or auto", t)
		}
		if slices.Contains(ts, t) {
			return nil, fmt.Errorf("%q twice", t)
		}
		ts = append(ts, t)
	}
	return ts, nil
}

// result is one size of one job, as rank 0 prints it.
type result struct {
	size  int64
	us    float64 // mean time per all-reduce of the slowest rank
	cross float64 // bytes per rank per all-reduce to the other host
	wrong float64 // elements, over all ranks, of a checked all-reduce that are wrong
	cpu   float64 // CPU time (user + system) of all ranks per all-reduce, µs
}

// routes is what the ranks of one job reported about their transport, by
// rank: the host map and the route to every peer, each comma-separated.
type routes struct {
	hosts []string
	via   []string
}

func (r routes) String() string {
	var b strings.Builder
	for i, v := range r.via {
		fmt.Fprintf(&b, " r%d=%s", i, v)
	}
	fmt.Fprintf(&b, " (hosts %s)", r.hosts[0])
	return strings.TrimSpace(b.String())
}

// check reports whether every rank saw the job's host map.
func (r routes) check() error {
	want := joinInts(hosts)
	for i, h := range r.hosts {
		if h != want {
			return fmt.Errorf("rank %d's transport saw hosts %s, want %s", i, h, want)
		}
	}
	return nil
}

// drive runs the jobs and prints the table.
func drive(ctx context.Context, o options, args []string, stdout, stderr io.Writer) error {
	load0 := loadAvg()
	var ns *namespaces
	if o.netns {
		var err error
		if ns, err = newNamespaces(o.rate); err != nil {
			return err
		}
		defer ns.remove(stderr)
	}
	var modes []mode
	for _, t := range o.transports {
		modes = append(modes, mode{t, false}, mode{t, true})
	}
	res := map[mode][][]result{}
	seen := map[string]routes{} // by transport, from its first job
	job := 0
	for round := range o.runs {
		for k := range modes {
			m := modes[(round+k)%len(modes)]
			r, rt, err := runJob(ctx, o, ns, args, m, job, stderr)
			if err != nil {
				return fmt.Errorf("job %d (%v): %w", job, m, err)
			}
			if err := rt.check(); err != nil {
				return fmt.Errorf("job %d (%v): %w", job, m, err)
			}
			if first, ok := seen[m.transport]; !ok {
				seen[m.transport] = rt
			} else if first.String() != rt.String() {
				return fmt.Errorf("job %d (%v): routes %s, an earlier job of GDIST_TRANSPORT=%s had %s", job, m, rt, m.transport, first)
			}
			if len(res[m]) > 0 && len(r) != len(res[m][0]) {
				return fmt.Errorf("job %d (%v): %d sizes, an earlier job had %d", job, m, len(r), len(res[m][0]))
			}
			res[m] = append(res[m], r)
			job++
		}
	}
	where := "loopback, hosts simulated with GDIST_HOST_ID (crossing hosts costs nothing extra)"
	if ns != nil {
		where = "two network namespaces (the host identity's), link shaped with tbf at " + o.rate
	}
	fmt.Fprintf(stdout, "# all_reduce float32 sum, 4 ranks (GOMAXPROCS=1 each) on 2 hosts (0,0,1,1), gdist.InitFromEnv, %s\n", where)
	fmt.Fprintf(stdout, "# load average (1, 5, 15 min) before: %s; after: %s\n", load0, loadAvg())
	for _, t := range o.transports {
		fmt.Fprintf(stdout, "# routes %s (GDIST_TRANSPORT=%s): %s\n", transportName(t), t, seen[t])
	}
	fmt.Fprintf(stdout, "# median of %d jobs per column, alternating; time (us): mean of %d iterations, slowest rank\n", o.runs, o.iters)
	fmt.Fprintf(stdout, "# x-host: payload bytes per rank per all-reduce sent to the other host (the group's metrics); #wrong over all jobs\n")
	cols := []string{"size(B)"}
	for _, m := range modes {
		cols = append(cols, m.String())
	}
	for _, t := range o.transports {
		cols = append(cols, "hier/flat:"+transportName(t))
	}
	both := len(o.transports) == 2
	if both {
		cols = append(cols, "hyb/tcp:flat", "hyb/tcp:hier")
	}
	cols = append(cols, "x-host:flat", "x-host:hier", "#wrong")
	for i, c := range cols {
		if i > 0 {
			fmt.Fprint(stdout, " ")
		}
		fmt.Fprintf(stdout, "%*s", colWidth(c), c)
	}
	fmt.Fprintln(stdout)
	t0 := o.transports[0]
	for k := range res[modes[0]][0] {
		med := map[mode]result{}
		wrong := 0.0
		for _, m := range modes {
			med[m] = median(res[m], k)
			for _, r := range res[m] {
				wrong += r[k].wrong
			}
		}
		vals := []string{strconv.FormatInt(med[modes[0]].size, 10)}
		for _, m := range modes {
			vals = append(vals, fmt.Sprintf("%.0f", med[m].us))
		}
		ratio := func(a, b mode) string { return fmt.Sprintf("%.2f", med[a].us/med[b].us) }
		for _, t := range o.transports {
			vals = append(vals, ratio(mode{t, true}, mode{t, false}))
		}
		if both {
			vals = append(vals, ratio(mode{"auto", false}, mode{"tcp", false}), ratio(mode{"auto", true}, mode{"tcp", true}))
		}
		vals = append(vals, fmt.Sprintf("%.0f", med[mode{t0, false}].cross), fmt.Sprintf("%.0f", med[mode{t0, true}].cross), fmt.Sprintf("%.0f", wrong))
		for i, v := range vals {
			if i > 0 {
				fmt.Fprint(stdout, " ")
			}
			fmt.Fprintf(stdout, "%*s", colWidth(cols[i]), v)
		}
		fmt.Fprintln(stdout)
	}
	// The spread of the times, and the CPU the ranks used.
	fmt.Fprintf(stdout, "#\n# range of the jobs' times (us), min-max\n")
	printModes(stdout, modes, res, func(rs []result) string {
		lo, hi := rs[0].us, rs[0].us
		for _, r := range rs {
			lo, hi = min(lo, r.us), max(hi, r.us)
		}
		return fmt.Sprintf("%.0f-%.0f", lo, hi)
	})
	fmt.Fprintf(stdout, "#\n# CPU time (user+system) of the 4 ranks per all-reduce (us), median of the jobs\n")
	printModes(stdout, modes, res, func(rs []result) string {
		cpu := make([]float64, len(rs))
		for i, r := range rs {
			cpu[i] = r.cpu
		}
		slices.Sort(cpu)
		return fmt.Sprintf("%.0f", cpu[len(cpu)/2])
	})
	return nil
}

// printModes prints a table of comment lines: per size, cell(the jobs'
// results of that size) for every mode.
func printModes(w io.Writer, modes []mode, res map[mode][][]result, cell func([]result) string) {
	fmt.Fprintf(w, "# %10s", "size(B)")
	for _, m := range modes {
		fmt.Fprintf(w, " %15s", m)
	}
	fmt.Fprintln(w)
	for k := range res[modes[0]][0] {
		fmt.Fprintf(w, "# %10d", res[modes[0]][0][k].size)
		for _, m := range modes {
			var rs []result
			for _, r := range res[m] {
				rs = append(rs, r[k])
			}
			fmt.Fprintf(w, " %15s", cell(rs))
		}
		fmt.Fprintln(w)
	}
}

func colWidth(name string) int { return max(len(name), 9) }

// loadAvg returns the first three fields of /proc/loadavg, or "n/a".
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "n/a"
}

// median returns size k's result with the median time over runs (the
// cross-host bytes do not vary).
func median(runs [][]result, k int) result {
	var rs []result
	for _, r := range runs {
		rs = append(rs, r[k])
	}
	slices.SortFunc(rs, func(a, b result) int {
		switch {
		case a.us < b.us:
			return -1
		case a.us > b.us:
			return 1
		}
		return 0
	})
	return rs[len(rs)/2]
}

// childEnvironment is this process's environment without the variables a
// job sets per mode and host.
func childEnvironment() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case gdist.EnvHostID, gdist.EnvTransport, dist.EnvHierarchical, childEnv:
			continue
		}
		env = append(env, kv)
	}
	return env
}

// runJob runs the 4 ranks once in mode m and returns rank 0's results and
// every rank's routes. job numbers the jobs of a run (with -netns it picks
// the master port, so that no job waits for the previous one's port).
func runJob(ctx context.Context, o options, ns *namespaces, args []string, m mode, job int, stderr io.Writer) ([]result, routes, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, routes{}, err
	}
	n := len(hosts)
	var (
		mu  sync.Mutex
		res []result
		rt  = routes{hosts: make([]string, n), via: make([]string, n)}
	)
	onLine := func(line string) {
		mu.Lock()
		defer mu.Unlock()
		var r result
		if _, err := fmt.Sscanf(line, "result %d %g %g %g %g", &r.size, &r.us, &r.cross, &r.wrong, &r.cpu); err == nil {
			res = append(res, r)
			return
		}
		var rk int
		var h, v string
		if _, err := fmt.Sscanf(line, "route %d %s %s", &rk, &h, &v); err == nil && rk >= 0 && rk < n {
			rt.hosts[rk], rt.via[rk] = h, v
		}
	}
	hier := "0"
	if m.hier {
		hier = "1"
	}
	env := []string{childEnv + "=1", gdist.EnvTransport + "=" + m.transport, dist.EnvHierarchical + "=" + hier}
	// Without -netns one launch starts the 4 ranks and GDIST_HOST_ID
	// makes two hosts of them; with -netns one launch per namespace, as a
	// multi-host job is started, meeting at rank 0's address.
	spec := launch.Spec{NProc: n}
	var rankEnv func(rank int) []string
	if ns == nil {
		rankEnv = func(rank int) []string { return []string{gdist.EnvHostID + "=" + hostIDs[hosts[rank]]} }
	} else {
		token, err := launch.NewToken()
		if err != nil {
			return nil, routes{}, err
		}
		spec = launch.Spec{NProc: n / 2, NNodes: 2, MasterAddr: ns.addrs[0], MasterPort: 29500 + job%400, Token: token}
	}
	errs := launch.Synced(stderr)
	var runs []*launch.Run
	for node := range max(spec.NNodes, 1) { // one launch per node
		sp := spec
		sp.NodeRank = node
		j := launch.Job{
			Spec:    sp,
			Program: self,
			Args:    args,
			Environ: childEnvironment(),
			Env:     env,
			RankEnv: rankEnv,
			Procs:   1,
			Output: func(rank int) (io.Writer, io.Writer) {
				return launch.LineFunc(onLine), launch.NewPrefixWriter(errs, fmt.Sprintf("[%d] ", rank))
			},
		}
		if ns != nil {
			j.Program = "ip"
			j.Args = append([]string{"netns", "exec", ns.names[node], self}, args...)
		}
		r, err := launch.Start(ctx, j)
		if err != nil {
			for _, r := range runs {
				_ = r.Wait()
			}
			return nil, routes{}, err
		}
		runs = append(runs, r)
	}
	var perr error
	for _, r := range runs {
		perr = errors.Join(perr, r.Wait())
	}
	if perr != nil {
		return nil, routes{}, perr
	}
	if len(res) == 0 {
		return nil, routes{}, errors.New("rank 0 printed no results")
	}
	for r, v := range rt.via {
		if v == "" {
			return nil, routes{}, fmt.Errorf("rank %d printed no routes", r)
		}
	}
	return res, rt, nil
}

// rank is one rank of a job.
func rank(ctx context.Context, o options, stdout io.Writer) (err error) {
	ictx, cancel := context.WithTimeout(ctx, 60*time.Second)
	// The metrics count the payload bytes sent to each peer; their
	// endpoint is not used.
	g, err := gdist.InitFromEnv(ictx, gdist.WithGroupOptions(dist.WithMetricsAddr("127.0.0.1:0")))
	cancel()
	if err != nil {
		return err
	}
	defer cli.Close(&err, g)
	t, ok := g.Transport().(*hybrid.Transport)
	if !ok {
		return fmt.Errorf("the group's transport is a %T, want a *hybrid.Transport", g.Transport())
	}
	r, n := g.Rank(), g.WorldSize()
	if n != len(hosts) {
		return fmt.Errorf("world of %d ranks, want %d", n, len(hosts))
	}
	topo := t.Hosts()
	via := make([]string, n)
	for p := range n {
		via[p] = t.Via(p)
	}
	fmt.Fprintf(stdout, "route %d %s %s\n", r, joinInts(topo), strings.Join(via, ","))
	var others []int // the peers on the other host, by the transport's map
	for p, h := range topo {
		if h != topo[r] {
			others = append(others, p)
		}
	}
	crossSent := func() (float64, error) { return sentTo(g.Metrics(), others) }
	for size := o.minBytes; size <= o.maxBytes; size *= 4 {
		buf := make([]float32, size/4)
		for i := range buf {
			buf[i] = float32(r + i%7)
		}
		for range o.warmup {
			if err := g.AllReduce(ctx, dist.F32(buf), dist.Sum); err != nil {
				return err
			}
		}
		if err := g.Barrier(ctx); err != nil {
			return err
		}
		before, err := crossSent()
		if err != nil {
			return err
		}
		cpu0 := benchutil.CPUTime()
		start := time.Now()
		for range o.iters {
			if err := g.AllReduce(ctx, dist.F32(buf), dist.Sum); err != nil {
				return err
			}
		}
		el := time.Since(start)
		cpu := benchutil.CPUTime() - cpu0
		after, err := crossSent()
		if err != nil {
			return err
		}
		// The slowest rank's time, the cross-host bytes of all ranks and
		// their CPU time.
		stats := []float64{el.Seconds() / float64(o.iters) * 1e6}
		if err := g.AllReduce(ctx, dist.F64(stats), dist.Max); err != nil {
			return err
		}
		bytes := []float64{(after - before) / float64(o.iters)}
		if err := g.AllReduce(ctx, dist.F64(bytes), dist.Mean); err != nil {
			return err
		}
		cpus := []float64{cpu.Seconds() / float64(o.iters) * 1e6}
		if err := g.AllReduce(ctx, dist.F64(cpus), dist.Sum); err != nil {
			return err
		}
		// One more, untimed, on fresh input, checked: the sum over the 4
		// ranks of r + i%7 is 6 + 4*(i%7), exactly.
		for i := range buf {
			buf[i] = float32(r + i%7)
		}
		if err := g.AllReduce(ctx, dist.F32(buf), dist.Sum); err != nil {
			return err
		}
		wrong := []float64{0}
		for i, v := range buf {
			if v != float32(6+4*(i%7)) {
				wrong[0]++
			}
		}
		if err := g.AllReduce(ctx, dist.F64(wrong), dist.Sum); err != nil {
			return err
		}
		if r == 0 {
			fmt.Fprintf(stdout, "result %d %g %g %g %g\n", size, stats[0], bytes[0], wrong[0], cpus[0])
		}
	}
	return g.Close()
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

// sentTo returns the payload bytes the group has sent to the given peers,
// read from its metrics (the gdist_peer_sent_bytes_total series).
func sentTo(m *metrics.Metrics, peers []int) (float64, error) {
	if m == nil {
		return 0, errors.New("the group's metrics are off")
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		return 0, fmt.Errorf("metrics: status %d", rec.Code)
	}
	want := map[string]bool{}
	for _, p := range peers {
		want[`peer="`+strconv.Itoa(p)+`"`] = true
	}
	total, found := 0.0, 0
	for line := range strings.SplitSeq(rec.Body.String(), "\n") {
		labels, ok := strings.CutPrefix(line, "gdist_peer_sent_bytes_total{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(labels, "} ")
		if !ok {
			return 0, fmt.Errorf("metrics: bad line %q", line)
		}
		if !slices.ContainsFunc(strings.Split(labels, ","), func(l string) bool { return want[l] }) {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return 0, fmt.Errorf("metrics: bad line %q: %w", line, err)
		}
		total += v
		found++
	}
	if found != len(peers) {
		return 0, fmt.Errorf("metrics: %d of %d peers' sent-bytes series found", found, len(peers))
	}
	return total, nil
}

// namespaces are the two hosts of a -netns run: network namespaces with
// one veth pair between them, each end rate-limited.
type namespaces struct {
	names []string
	addrs []string
}

func ipRun(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func newNamespaces(rate string) (*namespaces, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("-netns needs root (to create network namespaces)")
	}
	prefix := fmt.Sprintf("gdisthier%d-", os.Getpid())
	ns := &namespaces{}
	for h := range 2 {
		name := fmt.Sprintf("%shost%d", prefix, h)
		if err := ipRun("ip", "netns", "add", name); err != nil {
			ns.remove(io.Discard)
			return nil, err
		}
		ns.names = append(ns.names, name)
		ns.addrs = append(ns.addrs, fmt.Sprintf("10.232.0.%d", h+1))
	}
	tbf := []string{"root", "tbf", "rate", rate, "burst", "256kb", "latency", "25ms"}
	steps := [][]string{
		{"ip", "link", "add", "eth0", "netns", ns.names[0], "type", "veth", "peer", "name", "eth0", "netns", ns.names[1]},
	}
	for h, name := range ns.names {
		steps = append(steps,
			[]string{"ip", "-n", name, "link", "set", "lo", "up"},
			[]string{"ip", "-n", name, "addr", "add", ns.addrs[h] + "/24", "dev", "eth0"},
			[]string{"ip", "-n", name, "link", "set", "eth0", "up"},
			append([]string{"tc", "-n", name, "qdisc", "add", "dev", "eth0"}, tbf...),
		)
	}
	for _, s := range steps {
		if err := ipRun(s...); err != nil {
			ns.remove(io.Discard)
			return nil, err
		}
	}
	return ns, nil
}

// remove deletes the namespaces (and with them the veth pair).
func (ns *namespaces) remove(stderr io.Writer) {
	for _, name := range ns.names {
		if err := ipRun("ip", "netns", "del", name); err != nil {
			fmt.Fprintln(stderr, "hier:", err)
		}
	}
}
