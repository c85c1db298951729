package dist

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport/tcp"
	"github.com/gdist/gdist/internal/launch"
	"github.com/gdist/gdist/internal/portpick"
	"github.com/gdist/gdist/internal/procjob"
)

// Multi-process hierarchical collectives: 4 OS processes over TCP, each
// wrapping its transport in a hostTransport that reports 2 hosts of 2 ranks
// (0,0,1,1). The ranks connect by addresses the test picks (hierAddrsEnv),
// not through joinTCP's rendezvous.
const (
	hierAddrsEnv = "GDIST_DIST_TEST_HIER_ADDRS" // every rank's listen address
	hierModeEnv  = "GDIST_DIST_TEST_HIER_MODE"  // "collectives" or "kill"
)

var processHosts = []int{0, 0, 1, 1}

func startHierJob(t *testing.T, mode string) []*procjob.Proc {
	t.Helper()
	addrs := make([]string, len(processHosts))
	for r := range addrs {
		port, err := portpick.Free("127.0.0.1")
		require.NoError(t, err)
		addrs[r] = fmt.Sprintf("127.0.0.1:%d", port)
	}
	env := []string{hierAddrsEnv + "=" + strings.Join(addrs, ","), hierModeEnv + "=" + mode}
	if testing.Short() || raceEnabled {
		env = append(env, lightEnv+"=1")
	}
	return startJob(t, len(processHosts), "hier", env...)
}

// TestProcessHierCollectives checks the hierarchical all-reduces and
// broadcasts against the reference in a job of OS processes.
func TestProcessHierCollectives(t *testing.T) {
	for r, p := range startHierJob(t, "collectives") {
		assert.NoError(t, p.Wait(2*time.Minute), "rank %d", r)
	}
}

// TestProcessHierKill SIGKILLs a host's leader in the middle of a stream of
// hierarchical all-reduces: every survivor's all-reduce fails with a
// *PeerError for a lost peer within 5 s.
func TestProcessHierKill(t *testing.T) {
	const victim = 2
	killMidStream(t, startHierJob(t, "kill"), victim, "peer_error rank=2 ")
}

// childHier is one rank of a hierarchical multi-process test.
func childHier() int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g, err := hierChildGroup(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "hier child:", err)
		return 1
	}
	defer g.Close()
	if g.net.Hier == nil {
		fmt.Fprintln(os.Stderr, "hier child: the group is not hierarchical")
		return 1
	}
	if os.Getenv(hierModeEnv) == "kill" {
		return childKill(g)
	}
	lengths := []int{0, 1, g.WorldSize() - 1, 7, 333, 1<<18 + 3}
	if os.Getenv(lightEnv) != "" {
		lengths = lengths[:5]
	}
	return childCheck(g, lengths, checkHierRank)
}

// hierChildGroup connects this rank to the others over TCP and returns its
// group, on a transport that reports processHosts.
func hierChildGroup(ctx context.Context) (*ProcessGroup, error) {
	r, err := strconv.Atoi(os.Getenv(launch.EnvRank))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", launch.EnvRank, err)
	}
	addrs := strings.Split(os.Getenv(hierAddrsEnv), ",")
	if len(addrs) != len(processHosts) || r < 0 || r >= len(addrs) {
		return nil, fmt.Errorf("rank %d, %d addresses", r, len(addrs))
	}
	ln, err := net.Listen("tcp", addrs[r])
	if err != nil {
		return nil, err
	}
	t, err := tcp.New(ctx, r, len(addrs), ln, addrs, tcp.WithToken([]byte(os.Getenv(launch.EnvToken))))
	if err != nil {
		ln.Close()
		return nil, err
	}
	g, err := New(&hostTransport{Transport: t, hosts: processHosts})
	if err != nil {
		t.Close()
		return nil, err
	}
	return g, nil
}
