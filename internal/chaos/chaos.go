// Package chaos lets a program kill itself at a chosen step, for the chaos
// tests of the examples: GDIST_CHAOS_KILL is a list of "rank:step:restart"
// triples separated by commas, and rank `rank` SIGKILLs itself right after
// step `step` when GDIST_RESTART_COUNT (set by gdistrun -max-restarts) is
// `restart`.
//
// # Usage
//
//	kill := chaos.Step(rank)
//	for step := ... {
//		// train one step
//		if step == kill {
//			chaos.KillSelf()
//		}
//	}
package chaos

import (
	"os"
	"strconv"
	"strings"
)

// Env is the variable Step reads.
const Env = "GDIST_CHAOS_KILL"

// Step returns the step after which rank must kill itself in this attempt,
// or -1.
func Step(rank int) int64 {
	restart := os.Getenv("GDIST_RESTART_COUNT")
	if restart == "" {
		restart = "0"
	}
	for _, spec := range strings.Split(os.Getenv(Env), ",") {
		f := strings.Split(spec, ":")
		if len(f) != 3 || f[0] != strconv.Itoa(rank) || f[2] != restart {
			continue
		}
		if s, err := strconv.ParseInt(f[1], 10, 64); err == nil {
			return s
		}
	}
	return -1
}
