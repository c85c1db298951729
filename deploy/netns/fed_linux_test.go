//go:build linux

package netns_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/internal/launch"
)

// fedHeartbeat is the federation's heartbeat timeout in this test.
const fedHeartbeat = 3 * time.Second

// TestFederationLinkCut runs a federation across three namespaces — the
// leader (package dist/fed) on node 0, clients on nodes 1 and 2 — cuts
// client 2's link for 10 s and restores it. The leader must drop client 2
// within the heartbeat timeout and go on with client 1, and client 2, which
// keeps redialing with backoff, must join again and be averaged once its
// link is back; every process must end well when the federation does. The
// ranks are bench/federation's (its leader checks every round's model bit
// for bit against FedAvg of the clients that took part).
func TestFederationLinkCut(t *testing.T) {
	requireNetns(t)
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("netns: the go command is needed to build the programs: %v", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "federation")
	build := exec.Command(goTool, "build", "-o", bin, "./bench/federation")
	build.Dir = filepath.Join("..", "..")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build:\n%s", out)
	tp := newTopology(t, 3, *flagRate)
	token, err := launch.NewToken()
	require.NoError(t, err)

	const rounds, pause = 150, 200 * time.Millisecond // 30 s of rounds, at least
	ps := make([]*proc, 3)
	for k, ns := range tp.nodes {
		role := "client"
		if k == 0 {
			role = "leader"
		}
		env := []string{
			"RANK=" + strconv.Itoa(k), "WORLD_SIZE=3", "LOCAL_RANK=0",
			"MASTER_ADDR=" + tp.addrs[0], "MASTER_PORT=" + masterPort, launch.EnvToken + "=" + token,
			"GDIST_HEARTBEAT_TIMEOUT=" + fedHeartbeat.String(), "GOMAXPROCS=1",
			"GDIST_FEDERATION_BENCH_ROLE=" + role,
		}
		ps[k] = startIn(t, fmt.Sprintf("node %d", k), ns, env, bin,
			"-rounds", strconv.Itoa(rounds), "-pause", pause.String(), "-heartbeat", fedHeartbeat.String(),
			"-freeze", (fedHeartbeat + time.Second).String(), "-dim", "65536")
	}
	leader := ps[0]
	re := regexp.MustCompile(`^round (\d+) reported \[([\d ]*)\] left \[([\d ]*)\] joined \[([\d ]*)\]$`)
	seen := 0 // the leader's lines looked at so far
	round := func(want func(reported, left, joined string) bool) (line, int) {
		t.Helper()
		deadline := time.After(time.Minute)
		for {
			ls, changed := leader.out.snapshot()
			for ; seen < len(ls); seen++ {
				if m := re.FindStringSubmatch(ls[seen].text); m != nil && want(m[2], m[3], m[4]) {
					k, _ := strconv.Atoi(m[1])
					seen++
					return ls[seen-1], k
				}
			}
			select {
			case <-changed:
			case <-leader.done:
				t.Fatalf("the leader ended; output:\n%s", leader.out)
			case <-deadline:
				t.Fatalf("no such round within a minute; leader:\n%s", leader.out)
			}
		}
	}
	_, k := round(func(reported, _, _ string) bool { return reported == "1 2" })
	t.Logf("netns fed: round %d with both clients; cutting node 2's link for 10s", k)
	cutAt := time.Now()
	tp.cut(t, 2)
	l, k := round(func(_, left, _ string) bool { return strings.Contains(" "+left+" ", " 2 ") })
	dropped := l.at.Sub(cutAt)
	t.Logf("netns fed: the leader dropped client 2 after %.2fs (round %d)", dropped.Seconds(), k)
	assert.LessOrEqual(t, dropped, fedHeartbeat+detectSlack)
	_, k = round(func(reported, _, _ string) bool { return reported == "1" })
	t.Logf("netns fed: round %d went on with client 1 alone", k)

	time.Sleep(time.Until(cutAt.Add(10 * time.Second)))
	restoredAt := time.Now()
	tp.restore(t, 2)
	l, k = round(func(reported, _, _ string) bool { return reported == "1 2" })
	t.Logf("netns fed: link restored; client 2 averaged again in round %d, %.2fs later", k, l.at.Sub(restoredAt).Seconds())
	assert.Less(t, l.at.Sub(restoredAt), 20*time.Second)

	for k, p := range ps {
		require.NoError(t, p.wait(2*time.Minute), "node %d:\n%s", k, p.out)
	}
	assert.Contains(t, ps[2].stderr.String(), "reached the leader again", "client 2 reconnected by itself")
	_ = os.Remove(bin)
}
