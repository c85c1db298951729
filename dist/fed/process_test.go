package fed_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/fed"
	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/internal/procjob"
)

// The processes of these tests run this test binary as a leader or a
// client (process roles below), joining from the environment procjob
// gives them, as a launcher would.
const (
	roleEnv      = "GDIST_FED_TEST_ROLE"
	roundsEnv    = "GDIST_FED_TEST_ROUNDS" // rounds the leader runs
	heartbeat    = 1 * time.Second         // GDIST_HEARTBEAT_TIMEOUT of the processes
	processModel = 64                      // values in the model
)

// TestMain runs the process roles; the tests otherwise.
func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		os.Exit(processMain(role))
	}
	mainTests(m)
}

// processMain is a leader (rank 0) or a client process. The leader runs
// the rounds GDIST_FED_TEST_ROUNDS says and prints one line per round; a
// client serves tasks until the federation ends (exit 0) or the leader is
// lost (it prints the error and exits 3).
func processMain(role string) int {
	ctx := context.Background()
	job, err := fed.FromEnv()
	if err != nil {
		fmt.Println("error:", err)
		return 2
	}
	if job.Rank == 0 {
		rounds, _ := strconv.Atoi(os.Getenv(roundsEnv))
		l, err := job.Lead(ctx, make([]float32, processModel), fed.WithRoundTimeout(20*time.Second))
		if err != nil {
			fmt.Println("error:", err)
			return 2
		}
		defer l.Close()
		fmt.Println("leader ready")
		for range rounds {
			res, err := l.Round(ctx)
			if err != nil {
				fmt.Println("error:", err)
				return 2
			}
			m := l.Model()
			fmt.Printf("round %d reported %v missing %v left %v joined %v members %d model[0] %g\n",
				res.Round, res.Reported, res.Missing, res.Left, res.Joined, res.Members, m[0])
			time.Sleep(100 * time.Millisecond)
		}
		fmt.Println("leader done")
		return 0
	}
	start := time.Now()
	c, err := job.Join(ctx, fed.WithReconnect(30*time.Second, 50*time.Millisecond, time.Second))
	if err != nil {
		fmt.Println("error:", err)
		return 2
	}
	defer c.Close()
	fmt.Printf("client %d joined\n", job.Rank)
	for {
		task, err := c.Next(ctx)
		if errors.Is(err, fed.ErrFinished) {
			fmt.Println("client finished")
			return 0
		}
		if err != nil {
			var pe *transport.PeerError
			fmt.Printf("client error after %v: %v (peer error rank %v)\n", time.Since(start).Round(time.Millisecond), err,
				errors.As(err, &pe) && pe.Rank == 0)
			return 3
		}
		// "Train": move every weight by the rank, so that the average
		// says who took part.
		w := task.Model
		for i := range w {
			w[i] += float32(job.Rank)
		}
		time.Sleep(20 * time.Millisecond)
		if err := c.Report(ctx, task, w, 1); err != nil {
			fmt.Println("report error:", err)
		}
	}
}

// round is a leader's line about one round.
type round struct {
	k                               int
	reported, missing, left, joined []int
	line                            string
}

var roundLine = regexp.MustCompile(`^round (\d+) reported \[([\d ]*)\] missing \[([\d ]*)\] left \[([\d ]*)\] joined \[([\d ]*)\]`)

func parseRound(line string) (round, bool) {
	m := roundLine.FindStringSubmatch(line)
	if m == nil {
		return round{}, false
	}
	k, _ := strconv.Atoi(m[1])
	ints := func(s string) []int {
		var out []int
		for _, f := range strings.Fields(s) {
			n, _ := strconv.Atoi(f)
			out = append(out, n)
		}
		return out
	}
	return round{k: k, reported: ints(m[2]), missing: ints(m[3]), left: ints(m[4]), joined: ints(m[5]), line: line}, true
}

// federationJob starts a leader and world-1 clients as processes; transport
// is GDIST_TRANSPORT (tcp, or auto for shared memory on this host).
func federationJob(t *testing.T, world, rounds int, transport string) []*procjob.Proc {
	return procjob.Start(t, world, procjob.Config{RoleEnv: roleEnv, Role: "fed", LogStderr: testing.Verbose(), Env: []string{
		roundsEnv + "=" + strconv.Itoa(rounds),
		"GDIST_TRANSPORT=" + transport,
		"GDIST_HEARTBEAT_TIMEOUT=" + heartbeat.String(),
		"GOMAXPROCS=1",
	}})
}

// awaitRound waits for the leader's line of a round at or after from for
// which ok holds, and returns it and the line's index.
func awaitRound(t *testing.T, leader *procjob.Proc, from int, timeout time.Duration, ok func(round) bool) (round, int) {
	t.Helper()
	var got round
	i, err := leader.Await(from, timeout, func(l string) bool {
		r, parsed := parseRound(l)
		if parsed && ok(r) {
			got = r
			return true
		}
		return false
	})
	require.NoError(t, err, "leader:\n%s", leader.Output())
	return got, i
}

func transports() []string {
	return []string{"tcp", "auto"} // auto: shared memory between the processes of this host
}

// TestProcessClientKilled: a client SIGKILLed mid-federation is dropped and
// the rounds go on without it; a new process of its rank joins at a round
// boundary and its next update is averaged.
func TestProcessClientKilled(t *testing.T) {
	for _, tr := range transports() {
		t.Run(tr, func(t *testing.T) {
			procs := federationJob(t, 4, 1000, tr)
			leader := procs[0]
			_, i := awaitRound(t, leader, 0, time.Minute, func(r round) bool { return slices.Equal(r.reported, []int{1, 2, 3}) })
			require.NoError(t, procs[2].Kill())
			require.Error(t, procs[2].Wait(time.Minute))
			r, i := awaitRound(t, leader, i, time.Minute, func(r round) bool { return slices.Contains(r.left, 2) })
			t.Logf("rank 2 killed: %s", r.line)
			r, i = awaitRound(t, leader, i+1, time.Minute, func(round) bool { return true })
			assert.Equal(t, []int{1, 3}, r.reported, "the rounds go on without rank 2")

			again := procs[2].Restart(t)
			r, _ = awaitRound(t, leader, i, time.Minute, func(r round) bool { return slices.Contains(r.reported, 2) })
			t.Logf("rank 2 restarted and averaged again: %s", r.line)
			assert.Equal(t, []int{1, 2, 3}, r.reported)
			again.Kill()
		})
	}
}

// TestProcessClientFrozen: a client frozen with SIGSTOP is dropped after the
// heartbeat timeout and the rounds go on; thawed, it reconnects by itself,
// rejoins and is averaged again.
func TestProcessClientFrozen(t *testing.T) {
	for _, tr := range transports() {
		t.Run(tr, func(t *testing.T) {
			procs := federationJob(t, 4, 1000, tr)
			leader := procs[0]
			_, i := awaitRound(t, leader, 0, time.Minute, func(r round) bool { return slices.Equal(r.reported, []int{1, 2, 3}) })
			procs[3].Signal(syscall.SIGSTOP)
			stopped := time.Now()
			r, i := awaitRound(t, leader, i, time.Minute, func(r round) bool { return slices.Contains(r.left, 3) })
			dropped := time.Since(stopped)
			t.Logf("rank 3 frozen, dropped after %v: %s", dropped.Round(time.Millisecond), r.line)
			assert.Less(t, dropped, heartbeat+3*time.Second)
			r, i = awaitRound(t, leader, i+1, time.Minute, func(round) bool { return true })
			assert.Equal(t, []int{1, 2}, r.reported, "the rounds go on without rank 3")

			procs[3].Signal(syscall.SIGCONT)
			r, _ = awaitRound(t, leader, i, time.Minute, func(r round) bool { return slices.Contains(r.reported, 3) })
			t.Logf("rank 3 thawed and averaged again: %s", r.line)
		})
	}
}

// TestProcessLeaderKilled: when the leader is SIGKILLed, every client ends
// with an error naming rank 0 within the heartbeat timeout.
func TestProcessLeaderKilled(t *testing.T) {
	for _, tr := range transports() {
		t.Run(tr, func(t *testing.T) {
			procs := federationJob(t, 4, 1000, tr)
			awaitRound(t, procs[0], 0, time.Minute, func(r round) bool { return len(r.reported) == 3 })
			killed := time.Now()
			require.NoError(t, procs[0].Kill())
			for _, p := range procs[1:] {
				require.Error(t, p.Wait(time.Minute))
				after := p.Ended().Sub(killed)
				assert.Equal(t, 3, p.ExitCode(), "rank %d:\n%s", p.Rank, p.Output())
				i, err := p.Await(0, time.Second, func(l string) bool { return strings.HasPrefix(l, "client error") })
				require.NoError(t, err, p.Output())
				line := p.Lines()[i]
				assert.Contains(t, line, "peer rank 0")
				assert.Contains(t, line, "leader lost")
				assert.Contains(t, line, "(peer error rank true)")
				assert.Less(t, after, heartbeat, "rank %d ended %v after the leader", p.Rank, after)
				t.Logf("rank %d ended %v after the leader: %s", p.Rank, after.Round(time.Millisecond), line)
			}
		})
	}
}
