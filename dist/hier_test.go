package dist

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/internal/coll"
	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/transporttest"
)

// hostLayouts are the host maps the hierarchical collectives are checked
// on, by world size: blocks, round robin, one big host and a lone rank,
// uneven blocks, one host per rank but for a pair. Each has several hosts and a host with several ranks.
func hostLayouts(n int) [][]int {
	var ls [][]int
	add := func(h []int) {
		for _, l := range ls {
			if slices.Equal(l, h) {
				return
			}
		}
		ls = append(ls, h)
	}
	blocks := make([]int, n) // (0,0,1,1), (0,0,1,1,2,2), ...
	rr := make([]int, n)     // (0,1,0,1), ...
	last := make([]int, n)   // (0,0,0,1)
	uneven := make([]int, n) // (0,1,1,2,2,3,3, ...)
	spread := make([]int, n) // (0,1,2,...,n-2,n-2)
	for r := range n {
		spread[r] = min(r, n-2)
		blocks[r] = r / 2
		rr[r] = r % 2
		if r == n-1 {
			last[r] = 1
		}
		uneven[r] = min(r, 1+(r-1)/2)
		if r == 0 {
			uneven[r] = 0
		}
	}
	for _, h := range [][]int{blocks, rr, last, uneven, spread} {
		if err := transport.CheckHosts(h); err == nil && coll.NewPlan(h, 0) != nil {
			add(h)
		}
	}
	return ls
}

// newHostCluster is n in-process ranks whose transport reports the host
// map hosts.
func newHostCluster(t testing.TB, hosts []int, opts ...Option) *cluster {
	t.Helper()
	return localCluster(t, transporttest.NewLocal(t, len(hosts), transport.WithHosts(hosts)), opts...)
}

func TestHierPlan(t *testing.T) {
	for _, tc := range []struct {
		hosts []int
		hier  bool
	}{
		{[]int{0, 0, 0, 0}, false}, // one host
		{[]int{0, 1, 2, 3}, false}, // one rank per host
		{[]int{0, 0, 1, 1}, true},
		{[]int{0, 1, 0, 1}, true},
		{[]int{0, 0, 0, 1}, true},
		{[]int{0, 1, 2, 2}, true},
	} {
		t.Run(fmt.Sprint(tc.hosts), func(t *testing.T) {
			c := newHostCluster(t, tc.hosts)
			for r, g := range c.gs {
				require.Equal(t, tc.hier, g.net.Hier != nil, "rank %d", r)
				if g.net.Hier == nil {
					continue
				}
				p := g.net.Hier
				assert.Equal(t, tc.hosts[r], p.Host())
				local, me := p.Local()
				assert.Equal(t, r, local[me], "rank %d is its own local member", r)
				for _, m := range local {
					assert.Equal(t, p.Host(), tc.hosts[m])
				}
				for h, l := range p.Leaders() {
					assert.Equal(t, h, tc.hosts[l])
					assert.Equal(t, l, slices.Index(tc.hosts, h), "leader of host %d is its lowest rank", h)
				}
			}
		})
	}
	t.Run("off", func(t *testing.T) {
		c := newHostCluster(t, []int{0, 0, 1, 1}, WithHierarchical(false))
		for _, g := range c.gs {
			assert.Nil(t, g.net.Hier)
		}
	})
	t.Run("env", func(t *testing.T) {
		t.Setenv(EnvHierarchical, "0")
		c := newHostCluster(t, []int{0, 0, 1, 1})
		assert.Nil(t, c.gs[0].net.Hier)
		c = newHostCluster(t, []int{0, 0, 1, 1}, WithHierarchical(true))
		assert.NotNil(t, c.gs[0].net.Hier, "the option wins over the environment")
		t.Setenv(EnvHierarchical, "1")
		c = newHostCluster(t, []int{0, 0, 1, 1})
		assert.NotNil(t, c.gs[0].net.Hier)
		t.Setenv(EnvHierarchical, "yes")
		_, err := New(transporttest.NewLocal(t, 1)[0])
		require.ErrorIs(t, err, ErrEnv)
	})
}

// badTopology reports a host map that breaks the Topology contract.
type badTopology struct {
	*transport.Local
	hosts []int
}

func (b badTopology) Hosts() []int { return b.hosts }

func TestNewRefusesBadTopology(t *testing.T) {
	for _, hosts := range [][]int{{0}, {0, 0, 0}, {1, 0}, {0, 2}} {
		ls := transporttest.NewLocal(t, 2)
		_, err := New(badTopology{ls[0], hosts})
		require.ErrorIs(t, err, ErrInvalidArgument, "%v", hosts)
		for _, l := range ls {
			require.NoError(t, l.Close())
		}
	}
}

// checkHierRank runs the all-reduces (every op and dtype) and broadcasts
// (every root) of checkRank on rank r and compares with the reference.
func checkHierRank(t require.TestingT, g *ProcessGroup, n, r, length int) error {
	ctx := bg
	where := func(what string) string { return fmt.Sprintf("%s n=%d rank=%d len=%d", what, n, r, length) }
	for _, op := range allOps {
		if err := checkAllReduceOp(ctx, t, g, n, r, length, op, where); err != nil {
			return err
		}
	}
	if err := checkBroadcasts(ctx, t, g, length, where); err != nil {
		return err
	}
	// The other collectives still work between hierarchical ones.
	return g.Barrier(ctx)
}

func TestHierMatchReference(t *testing.T) {
	for n := 2; n <= 8; n++ {
		for _, hosts := range hostLayouts(n) {
			for _, cfg := range algoConfigs {
				t.Run(fmt.Sprintf("n=%d/hosts=%v/%s", n, hosts, cfg.name), func(t *testing.T) {
					t.Parallel()
					c := newHostCluster(t, hosts, cfg.opts...)
					require.NotNil(t, c.gs[0].net.Hier)
					requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
						for _, length := range testLengths(n) {
							if err := checkHierRank(t, g, n, r, length); err != nil {
								return err
							}
						}
						return nil
					}))
				})
			}
		}
	}
}

// TestHierLarge checks vectors larger than the default segment on the
// default (chain and ring) path, summed and averaged, and broadcast.
func TestHierLarge(t *testing.T) {
	layouts := [][]int{{0, 0, 1, 1}, {0, 1, 0, 1, 2}}
	if testing.Short() {
		layouts = layouts[:1]
	}
	const length = 1<<20 + 3 // 4 MiB + 12 bytes of float32
	for _, hosts := range layouts {
		t.Run(fmt.Sprint(hosts), func(t *testing.T) {
			n := len(hosts)
			c := newHostCluster(t, hosts)
			results := make([][]float32, n)
			bcast := make([][]float32, n)
			requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
				d := make([]float32, length)
				for i := range d {
					d[i] = float32(exactInput(Mean, r, i))
				}
				results[r] = d
				if err := g.AllReduce(bg, F32(d), Mean); err != nil {
					return err
				}
				b := make([]float32, length)
				for i := range b {
					b[i] = float32(r*1000 + i%1000)
				}
				bcast[r] = b
				return g.Broadcast(bg, F32(b), n-1)
			}))
			want := refAllReduce(Mean, Float32, n, length)
			for r := range n {
				for i, v := range results[r] {
					if float64(v) != want[i] {
						require.Failf(t, "wrong value", "rank %d [%d] = %v, want %v", r, i, v, want[i])
					}
				}
				for i, v := range bcast[r] {
					if v != float32((n-1)*1000+i%1000) {
						require.Failf(t, "wrong value", "broadcast rank %d [%d] = %v", r, i, v)
					}
				}
			}
		})
	}
}

// TestHierBitwiseIdentical: random data, so rounding depends on the
// reduction order; every rank must still end with the same bits.
func TestHierBitwiseIdentical(t *testing.T) {
	for _, hosts := range [][]int{{0, 0, 1, 1}, {0, 1, 0, 1, 2}, {0, 0, 0, 1, 1, 2, 2, 2}} {
		for _, cfg := range algoConfigs {
			t.Run(fmt.Sprintf("%v/%s", hosts, cfg.name), func(t *testing.T) {
				t.Parallel()
				requireSameBits(t, newHostCluster(t, hosts, cfg.opts...), len(hosts), BFloat16)
			})
		}
	}
}

// TestHierDesync makes one rank call something else than a hierarchical
// all-reduce: every rank fails with a *DesyncError naming the odd rank as
// one side, and nobody hangs.
func TestHierDesync(t *testing.T) {
	variants := []struct {
		name  string
		other func(g *ProcessGroup) error
	}{
		{"broadcast", func(g *ProcessGroup) error { return g.Broadcast(bg, F32(make([]float32, 8)), 0) }},
		{"broadcast_own_root", func(g *ProcessGroup) error { return g.Broadcast(bg, F32(make([]float32, 8)), g.Rank()) }},
		{"length", func(g *ProcessGroup) error { return g.AllReduce(bg, F32(make([]float32, 9)), Sum) }},
		{"max", func(g *ProcessGroup) error { return g.AllReduce(bg, F32(make([]float32, 8)), Max) }},
		{"barrier", func(g *ProcessGroup) error { return g.Barrier(bg) }},
		{"reduce", func(g *ProcessGroup) error { return g.Reduce(bg, F32(make([]float32, 8)), Sum, 0) }},
		{"all_gather", func(g *ProcessGroup) error {
			return g.AllGather(bg, F32(make([]float32, 8*g.WorldSize())), F32(make([]float32, 8)))
		}},
	}
	for _, hosts := range [][]int{{0, 0, 1, 1}, {0, 1, 0, 1}, {0, 0, 0, 1}, {0, 1, 1}} {
		n := len(hosts)
		for odd := range n {
			for _, v := range variants {
				for _, cfg := range algoConfigs[:2] {
					t.Run(fmt.Sprintf("%v/odd=%d/%s/%s", hosts, odd, v.name, cfg.name), func(t *testing.T) {
						t.Parallel()
						c := newHostCluster(t, hosts, cfg.opts...)
						ctx, cancel := context.WithTimeout(bg, 20*time.Second)
						defer cancel()
						errs := c.run(func(r int, g *ProcessGroup) error {
							if r == odd {
								return v.other(g)
							}
							return g.AllReduce(ctx, F32(make([]float32, 8)), Sum)
						})
						for r, err := range errs {
							var de *DesyncError
							require.ErrorAs(t, err, &de, "rank %d: %v", r, err)
							// Every rank, relayed notices included, names
							// two different ranks, one of them the odd one.
							assert.NotEqual(t, de.Rank, de.Peer, "rank %d: %v", r, err)
							assert.Contains(t, []int{de.Rank, de.Peer}, odd, "rank %d: %v", r, err)
						}
					})
				}
			}
		}
	}
}

// TestHierKillMidAllReduce crashes a rank (a leader, a non-leader, the
// last) while every rank loops on large hierarchical all-reduces: every
// survivor fails with a *PeerError naming the dead rank, within 5 s.
func TestHierKillMidAllReduce(t *testing.T) {
	hosts := []int{0, 0, 1, 1}
	for _, victim := range []int{0, 1, 2, 3} {
		for _, length := range []int{1 << 18, 100} {
			t.Run(fmt.Sprintf("victim=%d/len=%d", victim, length), func(t *testing.T) {
				requireKillNamed(t, newHostCluster(t, hosts, withSegment(16<<10)), victim, length)
			})
		}
	}
}

// TestHierZeroAllocs: steady-state hierarchical all-reduces (small and
// large) and broadcasts allocate nothing on the in-process transport.
func TestHierZeroAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, tc := range []struct {
		hosts  []int
		length int
		bcast  bool
	}{
		{[]int{0, 0, 1, 1}, 4096, false},
		{[]int{0, 1, 0, 1, 2}, 1 << 18, false},
		{[]int{0, 0, 1, 1}, 4096, true},
		{[]int{0, 0, 0, 1}, 1 << 18, true},
	} {
		t.Run(fmt.Sprintf("%v/len=%d/bcast=%v", tc.hosts, tc.length, tc.bcast), func(t *testing.T) {
			c := newHostCluster(t, tc.hosts)
			bufs := make([][]float32, len(tc.hosts))
			for r := range bufs {
				bufs[r] = make([]float32, tc.length)
			}
			step, stop := lockstep(t, c, func(r int, g *ProcessGroup) error {
				if tc.bcast {
					return g.Broadcast(bg, F32(bufs[r]), len(bufs)-1)
				}
				return g.AllReduce(bg, F32(bufs[r]), Sum)
			})
			defer stop()
			for range 10 {
				step()
			}
			require.Zero(t, testing.AllocsPerRun(100, step))
		})
	}
}

// hostTransport adds a host map to a transport and counts the collective
// payload bytes it sends to ranks on other hosts.
type hostTransport struct {
	transport.Transport
	hosts []int
	cross atomic.Int64
}

func (h *hostTransport) Hosts() []int { return slices.Clone(h.hosts) }

func (h *hostTransport) Send(ctx context.Context, to int, tag uint32, hd transport.Header, p []byte) error {
	if tag == TagReservedBase+tagColl && h.hosts[to] != h.hosts[h.Rank()] {
		h.cross.Add(int64(len(p)))
	}
	return h.Transport.Send(ctx, to, tag, hd, p)
}

// TestHierCrossHostBytes counts what crosses hosts in one 16 MiB
// all-reduce of 4 ranks on 2 hosts, flat and hierarchical: the leaders'
// 2-rank ring moves 2*(1/2)*16 MiB each way, 32 MiB in all; the flat ring
// 2*(3/4)*16 MiB on each of the links that cross (plus one byte per
// hierarchical announce message that crosses).
func TestHierCrossHostBytes(t *testing.T) {
	const size = 16 << 20
	for _, tc := range []struct {
		hosts      []int
		crossLinks int // links r -> r+1 of the flat ring that cross hosts
	}{{[]int{0, 0, 1, 1}, 2}, {[]int{0, 1, 0, 1}, 4}} {
		for _, hier := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/hier=%v", tc.hosts, hier), func(t *testing.T) {
				n := len(tc.hosts)
				ls := transporttest.NewLocal(t, n)
				hts := make([]*hostTransport, n)
				gs := make([]*ProcessGroup, n)
				for r := range n {
					hts[r] = &hostTransport{Transport: ls[r], hosts: tc.hosts}
					g, err := New(hts[r], WithHierarchical(hier))
					require.NoError(t, err)
					gs[r] = g
				}
				require.Equal(t, hier, gs[0].net.Hier != nil)
				c := &cluster{gs: gs}
				t.Cleanup(func() {
					for _, g := range gs {
						require.NoError(t, g.Close())
					}
				})
				requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
					return g.AllReduce(bg, F32(make([]float32, size/4)), Sum)
				}))
				var total int64
				per := make([]int64, n)
				for r, h := range hts {
					per[r] = h.cross.Load()
					total += per[r]
				}
				t.Logf("cross-host bytes per rank %v, mean %.1f MiB", per, float64(total)/float64(n)/(1<<20))
				// Two leaders, each 2*(1/2) of the vector, and the 1-byte
				// announce messages r -> r+1 that cross.
				want := int64(2*size/2*2 + tc.crossLinks)
				if !hier {
					want = int64(tc.crossLinks) * 2 * size * int64(n-1) / int64(n)
				}
				assert.Equal(t, want, total)
			})
		}
	}
}

// newTCPHostCluster is newTCPCluster with the transports reporting the host
// map hosts: ranks in this process over loopback TCP, as if on several
// hosts.
func newTCPHostCluster(t testing.TB, hosts []int, opts ...Option) *cluster {
	t.Helper()
	ts := make([]transport.Transport, len(hosts))
	for r, tr := range tcpMesh(t, len(hosts)) {
		ts[r] = &hostTransport{Transport: tr, hosts: hosts}
	}
	return tcpCluster(t, ts, opts...)
}

func TestHierTCP(t *testing.T) {
	for _, hosts := range [][]int{{0, 0, 1, 1}, {0, 1, 1}} {
		for _, cfg := range algoConfigs[:2] {
			t.Run(fmt.Sprintf("%v/%s", hosts, cfg.name), func(t *testing.T) {
				n := len(hosts)
				c := newTCPHostCluster(t, hosts, cfg.opts...)
				require.NotNil(t, c.gs[0].net.Hier)
				requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
					for _, length := range []int{0, 1, 7, 333} {
						if err := checkHierRank(t, g, n, r, length); err != nil {
							return err
						}
					}
					return nil
				}))
			})
		}
	}
}

// BenchmarkAllReduceHier compares the flat and the hierarchical all-reduce
// of 4 ranks on 2 simulated hosts (0,0,1,1) in this process, on the
// in-process transport (where crossing a "host" costs nothing extra, so
// this measures the algorithms' own overhead) and on loopback TCP.
func BenchmarkAllReduceHier(b *testing.B) {
	hosts := []int{0, 0, 1, 1}
	for _, tr := range []string{"local", "tcp"} {
		for _, size := range []int{16 << 10, 1 << 20, 16 << 20} {
			for _, hier := range []bool{false, true} {
				name := "flat"
				if hier {
					name = "hier"
				}
				b.Run(fmt.Sprintf("%s/bytes=%d/%s", tr, size, name), func(b *testing.B) {
					var c *cluster
					if tr == "tcp" {
						c = newTCPHostCluster(b, hosts, WithHierarchical(hier))
					} else {
						c = newHostCluster(b, hosts, WithHierarchical(hier))
					}
					bufs := make([][]float32, len(hosts))
					for r := range bufs {
						bufs[r] = make([]float32, size/4)
					}
					step, stop := lockstep(b, c, func(r int, g *ProcessGroup) error {
						return g.AllReduce(bg, F32(bufs[r]), Sum)
					})
					defer stop()
					for range 3 {
						step()
					}
					b.SetBytes(int64(size))
					b.ReportAllocs()
					b.ResetTimer()
					for b.Loop() {
						step()
					}
				})
			}
		}
	}
}

// TestHierAlgorithmName: the timeline names the hierarchical collectives.
func TestHierAlgorithmName(t *testing.T) {
	c := newHostCluster(t, []int{0, 0, 1, 1})
	g := c.gs[0]
	for kind, want := range map[opKind]string{kAllReduce: "hierarchical", kBroadcast: "hierarchical", kReduce: "tree", kAllGather: "ring"} {
		assert.Equal(t, want, g.algorithm(&call{kind: kind, data: make([]byte, 8)}), "%v", kind)
	}
	flat := newHostCluster(t, []int{0, 0, 1, 1}, WithHierarchical(false))
	assert.Equal(t, "recursive_doubling", flat.gs[0].algorithm(&call{kind: kAllReduce, data: make([]byte, 8)}))

	// 2 members: on one host the all-reduce from the small threshold up
	// is the shared-memory pair algorithm, across hosts it is not.
	big := make([]byte, DefaultSmallThreshold)
	for _, tc := range []struct {
		hosts []int
		opts  []Option
		small string
		large string
	}{
		{[]int{0, 0}, nil, "recursive_doubling", "pair"},
		{[]int{0, 0}, []Option{WithHierarchical(false)}, "recursive_doubling", "pair"},
		{[]int{0, 0}, []Option{withPairSegment(0)}, "recursive_doubling", "recursive_doubling"},
		{[]int{0, 1}, nil, "recursive_doubling", "recursive_doubling"},
	} {
		g := newHostCluster(t, tc.hosts, tc.opts...).gs[1]
		assert.Equal(t, tc.small, g.algorithm(&call{kind: kAllReduce, data: make([]byte, 8)}), "%v", tc.hosts)
		assert.Equal(t, tc.large, g.algorithm(&call{kind: kAllReduce, data: big}), "%v", tc.hosts)
	}
}

// TestHierMixedSetting: ranks that disagree on WithHierarchical fail (a
// *PeerError wrapping ErrProtocol where the two meet) instead of
// exchanging mismatched messages or hanging.
func TestHierMixedSetting(t *testing.T) {
	for _, length := range []int{0, 8, 100000} {
		for _, flatRank := range []int{0, 1, 3} {
			t.Run(fmt.Sprintf("len=%d/flat=%d", length, flatRank), func(t *testing.T) {
				hosts := []int{0, 0, 1, 1}
				ls := transporttest.NewLocal(t, len(hosts), transport.WithHosts(hosts))
				c := &cluster{gs: make([]*ProcessGroup, len(hosts)), ts: ls}
				for r := range hosts {
					g, err := New(ls[r], WithHierarchical(r != flatRank))
					require.NoError(t, err)
					c.gs[r] = g
				}
				t.Cleanup(func() {
					for _, g := range c.gs {
						require.NoError(t, g.Close())
					}
				})
				ctx, cancel := context.WithTimeout(bg, 20*time.Second)
				defer cancel()
				errs := c.run(func(r int, g *ProcessGroup) error {
					return g.AllReduce(ctx, F32(make([]float32, length)), Sum)
				})
				protocol := 0
				for r, err := range errs {
					require.Error(t, err, "rank %d", r)
					require.NotErrorIs(t, err, context.DeadlineExceeded, "rank %d", r)
					var pe *PeerError
					if errors.As(err, &pe) && errors.Is(err, ErrProtocol) {
						protocol++
						assert.Contains(t, []int{(flatRank + 3) % 4, flatRank, (flatRank + 1) % 4}, pe.Rank, "rank %d: %v", r, err)
					}
				}
				assert.NotZero(t, protocol, "%v", errs)
			})
		}
	}
}
