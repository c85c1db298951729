//go:build unix && !linux

package main

import "syscall"

// hogAttr: no parent-death signal outside Linux; stopHogs kills the hogs.
func hogAttr() *syscall.SysProcAttr { return nil }
