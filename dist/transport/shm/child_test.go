//go:build linux

package shm

import (
	"errors"
)

const (
	envChild = "GDIST_SHM_TEST_CHILD"
	envName  = "GDIST_SHM_TEST_NAME"
)

func runChild(mode string) error { return errors.New("unknown child mode " + mode) }
