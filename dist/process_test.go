package dist

import (
	"fmt"
	"os"
)

// childEnv names the environment variable that makes the test binary run as
// one rank of a multi-process test instead of running tests.
const childEnv = "GDIST_DIST_TEST_CHILD"

func childMain(role string) int {
	fmt.Fprintln(os.Stderr, "unknown child role", role)
	return 2
}
