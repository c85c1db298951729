package procjob_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
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
