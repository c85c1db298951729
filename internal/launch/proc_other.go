//go:build !unix

package launch

import (
	"errors"
	"os"
	"syscall"
)

func sysProcAttr() *syscall.SysProcAttr { return nil }

func waitExited(int) bool { return false }

// signalGroup kills process pid; other platforms have no process groups
// and no SIGTERM, so every signal is a kill.
func signalGroup(pid int, _ os.Signal) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return nil
	}
	if err := p.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

func signalNumber(os.Signal) int { return 0 }

func exitStatus(st *os.ProcessState) int {
	if c := st.ExitCode(); c > 0 {
		return c
	}
	return 1
}
