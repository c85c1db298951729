package main

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/internal/procjob"
)

// roleEnv makes the test binary run the program (main) instead of the
// tests: TestTwoRanks starts it as the ranks of a job.
const roleEnv = "GDIST_MINIMAL_TEST_ROLE"

func TestMain(m *testing.M) {
	if os.Getenv(roleEnv) == "rank" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestTwoRanks runs the program as two processes, as gdistrun -n 2 does:
// both exit 0, rank 0 prints falling losses and the final check.
func TestTwoRanks(t *testing.T) {
	procs := procjob.Start(t, 2, procjob.Config{RoleEnv: roleEnv, Role: "rank", Env: []string{"GOMAXPROCS=1"}})
	for r, p := range procs {
		require.NoError(t, p.Wait(2*time.Minute), "rank %d:\n%s", r, p.Output())
	}
	out := strings.Join(procs[0].Lines(), "\n")
	t.Log(out)
	assert.Contains(t, out, "step 40/200  rank 0's loss ")
	assert.Contains(t, out, "step 200/200  rank 0's loss ")
	assert.Contains(t, out, "parameters identical on all 2 ranks (fnv64a ")
	assert.Empty(t, procs[1].Lines(), "only rank 0 prints")
	var first, last float64
	_, err := fmt.Sscanf(procs[0].Lines()[0], "step 40/200  rank 0's loss %g", &first)
	require.NoError(t, err)
	_, err = fmt.Sscanf(procs[0].Lines()[4], "step 200/200  rank 0's loss %g", &last)
	require.NoError(t, err)
	assert.Less(t, last, first/2, "the model learns")
}
