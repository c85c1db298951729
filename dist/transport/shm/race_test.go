//go:build linux && race

package shm

const raceEnabled = true
