package gdist

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/internal/procjob"
)

// Subgroups with the ranks as OS processes, joined by InitFromEnv over TCP
// and over shared memory: two disjoint pairs all-reducing at once, a 2x2
// mesh whose groups alternate, a desync within a subgroup, and a rank
// killed while only its subgroup is busy.

// groupsTransports are the transports the tests run on.
func groupsTransports() []string {
	if runtime.GOOS == "linux" {
		return []string{"tcp", "shm"}
	}
	return []string{"tcp"}
}

// startGroupsJob starts n ranks in role over transport tr.
func startGroupsJob(t *testing.T, n int, role, tr string) []*procjob.Proc {
	t.Helper()
	return procjob.Start(t, n, procjob.Config{RoleEnv: childEnv, Role: role, LogStderr: true,
		Env: []string{"GOMAXPROCS=1", EnvTransport + "=" + tr}})
}

// TestProcessDisjointPairs: in a job of 4, pairs {0,1} and {2,3} all-reduce
// vectors of different lengths at the same time, 1000 times, every result
// checked exactly; then the pairs' groups and a 2x2 mesh ("dp" and "pp")
// take turns.
func TestProcessDisjointPairs(t *testing.T) {
	for _, tr := range groupsTransports() {
		t.Run(tr, func(t *testing.T) {
			for r, p := range startGroupsJob(t, 4, "groups-pairs", tr) {
				require.NoError(t, p.Wait(3*time.Minute), "rank %d", r)
				assert.Contains(t, p.Lines(), "ok", "rank %d", r)
			}
		})
	}
}

// TestProcessSubgroupDesync: the members of a subgroup call different
// collectives: both get a desync naming the other, and the ranks outside
// the subgroup learn of it.
func TestProcessSubgroupDesync(t *testing.T) {
	for _, tr := range groupsTransports() {
		t.Run(tr, func(t *testing.T) {
			procs := startGroupsJob(t, 4, "groups-desync", tr)
			for r, p := range procs {
				require.NoError(t, p.Wait(time.Minute), "rank %d", r)
				l := strings.Join(p.Lines(), "\n")
				assert.Contains(t, l, "desync=true", "rank %d", r)
				if r == 1 || r == 3 {
					assert.Contains(t, l, fmt.Sprintf("member=%d", (4-r)/2), "rank %d", r)
				}
			}
		})
	}
}

// TestProcessSubgroupKill SIGKILLs rank 3 while only its pair {2,3} is
// busy: rank 2's all-reduce fails naming it (as rank 3 and as member 1 of
// the pair), and ranks 0 and 1, which wait on nothing but the job, learn
// it as fast.
func TestProcessSubgroupKill(t *testing.T) {
	for _, tr := range groupsTransports() {
		t.Run(tr, func(t *testing.T) {
			procs := startGroupsJob(t, 4, "groups-kill", tr)
			for r, p := range procs {
				_, err := p.Await(0, 30*time.Second, func(string) bool { return true })
				require.NoError(t, err, "rank %d did not start", r)
				require.Equal(t, "running", p.Lines()[0], "rank %d", r)
			}
			killedAt := time.Now()
			require.NoError(t, procs[3].Kill())
			for r, p := range procs[:3] {
				i, err := p.Await(1, 10*time.Second, func(string) bool { return true })
				require.NoError(t, err, "rank %d: nothing 10 s after the kill", r)
				l := p.Lines()[i]
				took := time.Since(killedAt)
				t.Logf("rank %d after %v: %s", r, took.Round(time.Millisecond), l)
				assert.Less(t, took, 5*time.Second, "rank %d", r)
				assert.Contains(t, l, "culprit=3 ", "rank %d", r)
				assert.Contains(t, l, "lost=true", "rank %d", r)
				if r == 2 {
					assert.Contains(t, l, "member=1 ", "rank 2 names its partner in the pair")
				}
			}
			for r, p := range procs[:3] {
				assert.NoError(t, p.Wait(time.Minute), "rank %d", r)
			}
		})
	}
}

// groupsChild runs one rank of the tests above; it returns the exit code
// or -1 if role is not one of them.
func groupsChild(role string) int {
	if !strings.HasPrefix(role, "groups-") {
		return -1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	g, err := InitFromEnv(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "InitFromEnv:", err)
		return 1
	}
	defer g.Close()
	switch role {
	case "groups-pairs":
		err = childPairs(ctx, g)
	case "groups-desync":
		err = childSubgroupDesync(ctx, g)
	case "groups-kill":
		err = childSubgroupKill(ctx, g)
	default:
		err = fmt.Errorf("unknown role %s", role)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "rank %d: %v\n", g.Rank(), err)
		return 1
	}
	return 0
}

// sumCheck all-reduces x (set from r, it and i) on g and checks every
// element against the sum over the group's members.
func sumCheck(ctx context.Context, g *dist.ProcessGroup, r, it int, x []float32) error {
	for i := range x {
		x[i] = float32((r*13+it+i)%29 - 14)
	}
	if err := g.AllReduce(ctx, dist.F32(x), dist.Sum); err != nil {
		return err
	}
	for i := range x {
		var want float32
		for _, q := range g.Ranks() {
			want += float32((q*13+it+i)%29 - 14)
		}
		if x[i] != want {
			return fmt.Errorf("%s iteration %d: [%d] = %v, want %v", g.Name(), it, i, x[i], want)
		}
	}
	return nil
}

func childPairs(ctx context.Context, g *dist.ProcessGroup) error {
	r := g.Rank()
	pair, err := g.Split(ctx, r/2, r)
	if err != nil {
		return err
	}
	// The pairs at once, with different lengths (the second pair's cross
	// the ring's threshold).
	x := make([]float32, 1+(r/2)*(64<<10))
	for it := range 1000 {
		if err := sumCheck(ctx, pair, r, it, x); err != nil {
			return err
		}
	}
	m, err := dist.NewMesh(ctx, g, dist.Dim{Name: "dp", Size: 2}, dist.Dim{Name: "pp", Size: 2})
	if err != nil {
		return err
	}
	groups := []*dist.ProcessGroup{m.Group("dp"), m.Group("pp"), pair}
	y := make([]float32, 4099)
	for it := range 300 {
		if err := sumCheck(ctx, groups[it%3], r, it, y); err != nil {
			return err
		}
	}
	if err := errors.Join(m.Close(), pair.Close()); err != nil {
		return err
	}
	if err := g.Barrier(ctx); err != nil {
		return err
	}
	fmt.Println("ok")
	return nil
}

// report prints the line the parent checks for a failed call: whether it
// is a desync or a lost peer, the culprit and its member index.
func report(err error) {
	var a *dist.AbortError
	culprit := -1
	if errors.As(err, &a) {
		culprit = a.Rank
	}
	var pe *dist.PeerError
	if errors.As(err, &pe) {
		culprit = pe.Rank
	}
	member := -1
	var me *dist.MemberError
	if errors.As(err, &me) {
		member, culprit = me.Member, me.Rank
	}
	fmt.Printf("culprit=%d member=%d desync=%v lost=%v err=%s\n", culprit, member,
		errors.Is(err, dist.ErrDesync), errors.Is(err, dist.ErrPeerLost), strconv.Quote(err.Error()))
}

func childSubgroupDesync(ctx context.Context, g *dist.ProcessGroup) error {
	r := g.Rank()
	sub, err := g.NewGroup(ctx, []int{1, 3})
	if err != nil {
		// A rank still finishing the creation's all-gather when the
		// members' desync aborts the job learns of it there.
		report(err)
		return nil
	}
	switch r {
	case 1:
		err = sub.AllReduce(ctx, dist.F32(make([]float32, 8)), dist.Sum)
	case 3:
		err = sub.Broadcast(ctx, dist.F32(make([]float32, 8)), 1)
	default:
		select {
		case <-g.Failed():
			err = g.Err()
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	if err == nil {
		return errors.New("no error")
	}
	report(err)
	return nil
}

func childSubgroupKill(ctx context.Context, g *dist.ProcessGroup) error {
	r := g.Rank()
	pair, err := g.Split(ctx, r/2, r)
	if err != nil {
		return err
	}
	if err := g.Barrier(ctx); err != nil {
		return err
	}
	fmt.Println("running")
	if r < 2 { // idle: only the job can tell them
		select {
		case <-g.Failed():
			report(g.Err())
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	x := make([]float32, 1<<14)
	for {
		if err := pair.AllReduce(ctx, dist.F32(x), dist.Sum); err != nil {
			report(err)
			return nil
		}
	}
}
