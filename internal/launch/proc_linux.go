package launch

import (
	"syscall"
	"unsafe"
)

// sysProcAttr puts a child in a process group of its own, so that a signal
// to the group reaches everything it spawned, and asks the kernel to
// SIGKILL it if the launcher dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// waitExited blocks until process pid has exited, without reaping it, so
// that its pid (and so its process-group id) cannot be reused while the
// caller cleans up the group. It reports false if it could not wait.
func waitExited(pid int) bool {
	const (
		pPID    = 1          // P_PID
		wNoWait = 0x01000000 // WNOWAIT
	)
	var info [128]byte // siginfo_t
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid),
			uintptr(unsafe.Pointer(&info[0])), syscall.WEXITED|wNoWait, 0, 0)
		if errno != syscall.EINTR {
			return errno == 0
		}
	}
}
