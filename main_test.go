package gdist

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Multi-process tests: the test binary re-executes itself once per rank
// with childEnv set to a role; TestMain sends such a process to childMain
// instead of running tests.

// childEnv names the environment variable that makes the test binary run as
// one rank of a multi-process test instead of running tests.
const childEnv = "GDIST_TEST_CHILD"

func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(childMain(role))
	}
	goleak.VerifyTestMain(m)
}

// childMain runs one rank of a multi-process test and returns the exit code.
// Role "init-only" joins with InitFromEnv and leaves; the "groups-" roles
// are groups_process_test.go's.
func childMain(role string) int {
	if code := groupsChild(role); code >= 0 {
		return code
	}
	if role != "init-only" {
		fmt.Fprintln(os.Stderr, "unknown child role", role)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g, err := InitFromEnv(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "InitFromEnv:", err)
		return 1
	}
	if err := g.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "Close:", err)
		return 1
	}
	return 0
}

var bg = context.Background()
