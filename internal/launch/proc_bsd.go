//go:build unix && !linux

package launch

import "syscall"

// sysProcAttr puts a child in a process group of its own, so that a signal
// to the group reaches everything it spawned.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// waitExited reports false: without waitid(WNOWAIT) the caller reaps first
// and cleans up the process group afterwards.
func waitExited(int) bool { return false }
