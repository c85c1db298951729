//go:build linux && !race

package shm_test

const raceEnabled = false
