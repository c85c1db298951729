package procjob_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist"
	"github.com/gdist/gdist/internal/procjob"
)

const childEnv = "GDIST_PROCJOB_TEST_CHILD"

func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(child(role))
	}
	os.Exit(m.Run())
}

func child(role string) int {
	switch role {
	case "env":
		for _, k := range []string{gdist.EnvRank, gdist.EnvWorldSize, gdist.EnvLocalRank, gdist.EnvMasterAddr, "EXTRA"} {
			fmt.Printf("%s=%s\n", k, os.Getenv(k))
		}
		fmt.Fprintln(os.Stderr, "to stderr")
		return 3
	case "sleep":
		fmt.Println("sleeping")
		time.Sleep(time.Minute)
	case "job":
		for _, k := range []string{gdist.EnvRank, gdist.EnvWorldSize, gdist.EnvMasterPort, gdist.EnvToken, gdist.EnvRestartCount} {
			fmt.Printf("%s=%s\n", k, os.Getenv(k))
		}
	case "tick":
		for i := 0; ; i++ {
			fmt.Println("tick", i)
			time.Sleep(20 * time.Millisecond)
		}
	}
	return 0
}

func TestStart(t *testing.T) {
	procs := procjob.Start(t, 2, procjob.Config{RoleEnv: childEnv, Role: "env", Env: []string{"EXTRA=x"}})
	for r, p := range procs {
		require.Error(t, p.Wait(time.Minute))
		assert.Equal(t, 3, p.ExitCode())
		assert.Equal(t, fmt.Sprintf("RANK=%d\nWORLD_SIZE=2\nLOCAL_RANK=%d\nMASTER_ADDR=127.0.0.1\nEXTRA=x\n", r, r), p.Output())
		assert.Equal(t, "to stderr\n", p.Stderr())
		_, err := p.Await(0, time.Second, func(l string) bool { return l == "nope" })
		assert.ErrorIs(t, err, procjob.ErrExited)
	}
	merged := procjob.Start(t, 1, procjob.Config{RoleEnv: childEnv, Role: "env", MergeStderr: true, LogStderr: true})
	require.Error(t, merged[0].Wait(time.Minute))
	assert.Contains(t, merged[0].Lines(), "to stderr")
}

func TestAwaitAndKill(t *testing.T) {
	p := procjob.Start(t, 1, procjob.Config{RoleEnv: childEnv, Role: "sleep"})[0]
	i, err := p.Await(0, time.Minute, func(l string) bool { return strings.HasPrefix(l, "sleep") })
	require.NoError(t, err)
	assert.Equal(t, 0, i)
	_, err = p.Await(1, 50*time.Millisecond, func(string) bool { return true })
	assert.True(t, errors.Is(err, procjob.ErrTimeout), "%v", err)
	require.NoError(t, p.Kill())
	<-p.Done()
	assert.Equal(t, -1, p.ExitCode())
}

// TestRestart: a restarted rank joins the same job (port and token) as the
// same rank, with GDIST_RESTART_COUNT set.
func TestRestart(t *testing.T) {
	procs := procjob.Start(t, 3, procjob.Config{RoleEnv: childEnv, Role: "job"})
	for _, p := range procs {
		require.NoError(t, p.Wait(time.Minute))
	}
	first := strings.Split(procs[1].Output(), "\n")
	again := procs[1].Restart(t)
	require.NoError(t, again.Wait(time.Minute))
	lines := strings.Split(again.Output(), "\n")
	assert.Equal(t, "RANK=1", lines[0])
	assert.Equal(t, "WORLD_SIZE=3", lines[1])
	assert.Equal(t, first[2], lines[2], "the same master port")
	assert.Equal(t, first[3], lines[3], "the same token")
	assert.Equal(t, "GDIST_RESTART_COUNT=1", lines[4])
}

// TestSignal: SIGSTOP freezes a process and SIGCONT thaws it.
func TestSignal(t *testing.T) {
	p := procjob.Start(t, 1, procjob.Config{RoleEnv: childEnv, Role: "tick"})[0]
	_, err := p.Await(0, time.Minute, func(l string) bool { return l == "tick 3" })
	require.NoError(t, err)
	p.Signal(syscall.SIGSTOP)
	time.Sleep(50 * time.Millisecond)
	n := len(p.Lines())
	time.Sleep(300 * time.Millisecond)
	assert.Equal(t, n, len(p.Lines()), "no output while stopped")
	p.Signal(syscall.SIGCONT)
	_, err = p.Await(n, time.Minute, func(string) bool { return true })
	require.NoError(t, err, "output again")
	p.Kill()
}
