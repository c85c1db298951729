//go:build unix

package launch

import (
	"errors"
	"os"
	"syscall"
)

// signalGroup sends sig to the process group led by pid. A group that no
// longer exists is not an error.
func signalGroup(pid int, sig os.Signal) error {
	s, ok := sig.(syscall.Signal)
	if !ok {
		s = syscall.SIGKILL
	}
	err := syscall.Kill(-pid, s)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// signalNumber returns the number of sig, or 0 if it has none.
func signalNumber(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return int(s)
	}
	return 0
}

// exitStatus returns the exit status a shell would report for st: the exit
// code, or 128+signal for a process killed by a signal.
func exitStatus(st *os.ProcessState) int {
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	if c := st.ExitCode(); c > 0 {
		return c
	}
	return 1
}
