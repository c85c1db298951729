package main

import "syscall"

// hogAttr: the kernel kills a hog if this program dies first.
func hogAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
