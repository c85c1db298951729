// Command hier compares the flat and the hierarchical (topology-aware)
// all-reduce of a job whose ranks sit on two "hosts": 4 OS processes
// (GOMAXPROCS=1 each) over the TCP transport, ranks 0 and 1 on host 0 and
// ranks 2 and 3 on host 1. Each rank wraps its transport in one that reports
// that host map (transport.Topology) and counts the payload bytes it sends
// to the other host, so dist runs its hierarchical collectives
// (dist.WithHierarchical(true)) or the flat ring and recursive doubling
// (false) on the same job layout.
//
// With -netns (Linux, root, iproute2), the two hosts are two network
// namespaces joined by one veth pair rate-limited with tc tbf at -rate on
// both ends: traffic within a host goes through that namespace's loopback,
// traffic between the hosts through the shaped link, as on two machines.
// The namespaces (and with them the link) are removed at the end, also
// when the run fails. Without -netns, every rank is on this machine's
// loopback and crossing a "host" costs nothing extra: that run shows the
// algorithms' own overhead.
//
// Jobs alternate between flat and hierarchical (-runs of each); for every
// size the program prints the median time per all-reduce (of the slowest
// rank, mean over -n iterations), the busbw (2(n-1)/n x size / time, GB =
// 1e9 bytes), the mean bytes per rank sent to the other host per
// all-reduce, the ratio hier/flat of the median times, and #wrong: the
// elements, over every rank and job, of one more (untimed) all-reduce per
// size on fresh input that differ from the exact sum.
//
// # Usage
//
//	go run ./bench/hier -b 64K -e 16M -n 10
//	sudo go run ./bench/hier -netns -rate 1gbit -b 1M -e 16M -n 5 -runs 3
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/tcp"
	"github.com/gdist/gdist/internal/cli"
	"github.com/gdist/gdist/internal/launch"
	"github.com/gdist/gdist/internal/portpick"
)

// childEnv marks a process started by this program as one rank.
const childEnv = "GDIST_BENCH_HIER_CHILD"

var errUsage = errors.New("hier: usage")

func main() { cli.Main("hier", errUsage, run) }

// hosts is the job layout: two hosts of two ranks.
var hosts = []int{0, 0, 1, 1}

type options struct {
	minBytes, maxBytes int64
	iters, warmup      int
	runs               int
	netns              bool
	rate               string
	hier               bool   // child: hierarchical or flat
	addrs              string // child: every rank's listen address
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("hier", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	var b, e string
	fs.StringVar(&b, "b", "64K", "smallest size in bytes (suffixes K, M, G)")
	fs.StringVar(&e, "e", "16M", "largest size in bytes; sizes grow by 4x")
	fs.IntVar(&o.iters, "n", 10, "timed iterations per size")
	fs.IntVar(&o.warmup, "w", 3, "warm-up iterations per size")
	fs.IntVar(&o.runs, "runs", 3, "jobs of each mode, alternating")
	fs.BoolVar(&o.netns, "netns", false, "put the two hosts in network namespaces joined by a shaped link (root)")
	fs.StringVar(&o.rate, "rate", "1gbit", "tc tbf rate of the link between the hosts (with -netns)")
	fs.BoolVar(&o.hier, "hier", true, "(rank) hierarchical collectives")
	fs.StringVar(&o.addrs, "addrs", "", "(rank) comma-separated listen addresses of the ranks")
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
	if os.Getenv(childEnv) != "" {
		return rank(ctx, o, stdout)
	}
	return drive(ctx, o, args, stdout, stderr)
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
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return v * mult, nil
}

// result is one size of one job, as rank 0 prints it.
type result struct {
	size  int64
	us    float64 // mean time per all-reduce of the slowest rank
	cross float64 // bytes per rank per all-reduce to the other host
	wrong float64 // elements, over all ranks, of a checked all-reduce that are wrong
}

// drive runs the jobs and prints the table.
func drive(ctx context.Context, o options, args []string, stdout, stderr io.Writer) error {
	var ns *namespaces
	if o.netns {
		var err error
		if ns, err = newNamespaces(o.rate); err != nil {
			return err
		}
		defer ns.remove(stderr)
	}
	res := map[bool][][]result{}
	for i := range 2 * o.runs {
		hier := i%2 == 1
		r, err := job(ctx, o, ns, args, hier, stderr)
		if err != nil {
			return fmt.Errorf("job %d (hier=%v): %w", i, hier, err)
		}
		res[hier] = append(res[hier], r)
	}
	where := "loopback (crossing hosts costs nothing extra)"
	if ns != nil {
		where = "two network namespaces, link shaped with tbf at " + o.rate
	}
	fmt.Fprintf(stdout, "# all_reduce float32 sum, 4 ranks on 2 hosts (0,0,1,1), TCP, %s\n", where)
	fmt.Fprintf(stdout, "# median of %d jobs per mode, alternating; time: mean of %d iterations, slowest rank\n", o.runs, o.iters)
	fmt.Fprintf(stdout, "%12s %10s %10s %10s %10s %12s %12s %8s %7s\n", "size(B)", "flat(us)", "hier(us)", "flat bw", "hier bw", "flat x-host", "hier x-host", "hier/flat", "#wrong")
	for k := range res[false][0] {
		f, h := median(res[false], k), median(res[true], k)
		bw := func(us float64) float64 { return float64(f.size) / (us * 1e-6) / 1e9 * 2 * 3 / 4 }
		wrong := 0.0
		for _, mode := range res {
			for _, r := range mode {
				wrong += r[k].wrong
			}
		}
		fmt.Fprintf(stdout, "%12d %10.0f %10.0f %10.3f %10.3f %12.0f %12.0f %8.2f %7.0f\n",
			f.size, f.us, h.us, bw(f.us), bw(h.us), f.cross, h.cross, h.us/f.us, wrong)
	}
	return nil
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

// job runs the 4 ranks once and returns rank 0's results.
func job(ctx context.Context, o options, ns *namespaces, args []string, hier bool, stderr io.Writer) ([]result, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	addrs := make([]string, len(hosts))
	for r, h := range hosts {
		if ns != nil {
			addrs[r] = fmt.Sprintf("%s:%d", ns.addrs[h], 29600+r)
			continue
		}
		port, err := portpick.Free("127.0.0.1")
		if err != nil {
			return nil, err
		}
		addrs[r] = fmt.Sprintf("127.0.0.1:%d", port)
	}
	childArgs := append(slices.Clone(args), "-hier="+strconv.FormatBool(hier), "-addrs="+strings.Join(addrs, ","))
	var (
		mu   sync.Mutex
		res  []result
		perr error
	)
	onLine := func(line string) {
		var r result
		if _, err := fmt.Sscanf(line, "result %d %g %g %g", &r.size, &r.us, &r.cross, &r.wrong); err != nil {
			return
		}
		mu.Lock()
		res = append(res, r)
		mu.Unlock()
	}
	// One launch per host, as a multi-host job is started: in a namespace
	// each, with -netns.
	nodes := 1
	nproc := len(hosts)
	if ns != nil {
		nodes, nproc = 2, 2
	}
	token, err := launch.NewToken()
	if err != nil {
		return nil, err
	}
	var runs []*launch.Run
	for node := range nodes {
		j := launch.Job{
			// The ranks connect by the addresses they are given, not
			// through MASTER_ADDR (no rendezvous): the port is a
			// placeholder the multi-node spec requires.
			Spec:    launch.Spec{NProc: nproc, NNodes: nodes, NodeRank: node, MasterPort: 29599, Token: token},
			Program: self,
			Args:    childArgs,
			Env:     []string{childEnv + "=1"},
			Procs:   1,
			Output: func(rank int) (io.Writer, io.Writer) {
				if rank == 0 {
					return launch.LineFunc(onLine), stderr
				}
				return nil, stderr
			},
		}
		if ns != nil {
			j.Program = "ip"
			j.Args = append([]string{"netns", "exec", ns.names[node], self}, childArgs...)
		}
		r, err := launch.Start(ctx, j)
		if err != nil {
			for _, r := range runs {
				_ = r.Wait()
			}
			return nil, err
		}
		runs = append(runs, r)
	}
	for _, r := range runs {
		perr = errors.Join(perr, r.Wait())
	}
	if perr != nil {
		return nil, perr
	}
	if len(res) == 0 {
		return nil, errors.New("rank 0 printed no results")
	}
	return res, nil
}

// hostTransport reports the job's host map and counts the payload bytes
// sent to the other host (all of them: collectives, and the rare progress
// and abort messages).
type hostTransport struct {
	transport.Transport
	cross atomic.Int64
}

func (h *hostTransport) Hosts() []int { return slices.Clone(hosts) }

func (h *hostTransport) Send(ctx context.Context, to int, tag uint32, hd transport.Header, p []byte) error {
	if hosts[to] != hosts[h.Rank()] {
		h.cross.Add(int64(len(p)))
	}
	return h.Transport.Send(ctx, to, tag, hd, p)
}

// rank is one rank of a job.
func rank(ctx context.Context, o options, stdout io.Writer) error {
	r, err := strconv.Atoi(os.Getenv(launch.EnvRank))
	if err != nil {
		return fmt.Errorf("%s: %w", launch.EnvRank, err)
	}
	addrs := strings.Split(o.addrs, ",")
	n := len(addrs)
	if n != len(hosts) || r < 0 || r >= n {
		return fmt.Errorf("rank %d of %d addresses, want %d ranks", r, n, len(hosts))
	}
	ln, err := net.Listen("tcp", addrs[r])
	if err != nil {
		return err
	}
	ictx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	t, err := tcp.New(ictx, r, n, ln, addrs, tcp.WithToken([]byte(os.Getenv(launch.EnvToken))))
	if err != nil {
		ln.Close()
		return err
	}
	ht := &hostTransport{Transport: t}
	g, err := dist.New(ht, dist.WithHierarchical(o.hier))
	if err != nil {
		t.Close()
		return err
	}
	defer g.Close()
	for size := o.minBytes; size <= o.maxBytes; size *= 4 {
		buf := make([]float32, size/4)
		for i := range buf {
			buf[i] = float32(r + i%7)
		}
		for range o.warmup {
			if err := g.AllReduce(ctx, buf, dist.Sum); err != nil {
				return err
			}
		}
		if err := g.Barrier(ctx); err != nil {
			return err
		}
		before := ht.cross.Load()
		start := time.Now()
		for range o.iters {
			if err := g.AllReduce(ctx, buf, dist.Sum); err != nil {
				return err
			}
		}
		el := time.Since(start)
		cross := ht.cross.Load() - before
		// The slowest rank's time, and the cross-host bytes of all ranks.
		stats := []float64{el.Seconds() / float64(o.iters) * 1e6}
		if err := g.AllReduceF64(ctx, stats, dist.Max); err != nil {
			return err
		}
		bytes := []float64{float64(cross) / float64(o.iters)}
		if err := g.AllReduceF64(ctx, bytes, dist.Mean); err != nil {
			return err
		}
		// One more, untimed, on fresh input, checked: the sum over the 4
		// ranks of r + i%7 is 6 + 4*(i%7), exactly.
		for i := range buf {
			buf[i] = float32(r + i%7)
		}
		if err := g.AllReduce(ctx, buf, dist.Sum); err != nil {
			return err
		}
		wrong := []float64{0}
		for i, v := range buf {
			if v != float32(6+4*(i%7)) {
				wrong[0]++
			}
		}
		if err := g.AllReduceF64(ctx, wrong, dist.Sum); err != nil {
			return err
		}
		if r == 0 {
			fmt.Fprintf(stdout, "result %d %g %g %g\n", size, stats[0], bytes[0], wrong[0])
		}
	}
	return g.Close()
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
