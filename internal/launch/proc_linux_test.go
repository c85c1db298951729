package launch

import (
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gone reports whether pid no longer exists or is a zombie.
func gone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// The state follows the parenthesised command name.
	for i := len(b) - 1; i > 0; i-- {
		if b[i] == ')' && i+2 < len(b) {
			return b[i+2] == 'Z'
		}
	}
	return false
}

func TestWaitExitedDoesNotReap(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=env")
	require.NoError(t, cmd.Start())
	pid := cmd.Process.Pid
	require.True(t, waitExited(pid))
	assert.NoError(t, syscall.Kill(pid, 0), "still a zombie, not reaped")
	assert.True(t, gone(pid))
	require.NoError(t, cmd.Wait())
	assert.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH)
}
