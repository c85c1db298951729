package hybrid_test

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	before := devSHM()
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
		if after := devSHM(); !slices.Equal(before, after) {
			fmt.Fprintf(os.Stderr, "/dev/shm changed: before %v, after %v\n", before, after)
			code = 1
		}
	}
	os.Exit(code)
}

// devSHM lists the gdist entries of /dev/shm (nil if it does not exist).
// Other programs on the machine may create files there meanwhile, so only
// names mentioning gdist count. (The shared memory itself is anonymous
// memfds, which never appear there.)
func devSHM() []string {
	es, err := os.ReadDir("/dev/shm")
	if err != nil {
		return nil
	}
	var names []string
	for _, e := range es {
		if strings.Contains(strings.ToLower(e.Name()), "gdist") {
			names = append(names, e.Name())
		}
	}
	return names
}
