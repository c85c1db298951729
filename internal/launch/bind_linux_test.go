package launch

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// threadCPUs returns the Cpus_allowed_list of every thread of this process.
func threadCPUs() []string {
	tasks, _ := filepath.Glob("/proc/self/task/*/status")
	var out []string
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // the thread exited
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
				out = append(out, strings.TrimSpace(v))
			}
		}
	}
	return out
}

// TestBind: with Bind every thread of local rank i runs only on the
// (i mod n)-th CPU the launcher may use, one more rank than CPUs wrapping
// around, and the launcher's own threads keep their CPUs.
func TestBind(t *testing.T) {
	cpus, err := allowedCPUs()
	require.NoError(t, err)
	require.NotEmpty(t, cpus)
	before := threadCPUs()
	n := len(cpus) + 1
	var l lines
	j := job(n, "cpus")
	j.Bind = true
	j.Output = l.output()
	r, err := Start(context.Background(), j)
	require.NoError(t, err)
	require.NoError(t, r.Wait())
	for i, p := range r.Procs() {
		want := strconv.Itoa(cpus[i%len(cpus)])
		assert.Equal(t, cpus[i%len(cpus)], p.CPU, "rank %d", i)
		require.NotEmpty(t, l.out[i], "rank %d printed nothing", i)
		for _, got := range l.out[i] {
			assert.Equal(t, want, got, "a thread of rank %d", i)
		}
	}
	for _, c := range threadCPUs() {
		assert.Contains(t, before, c, "a launcher thread kept a rank's binding")
	}

	// Without Bind a rank may run wherever the launcher may.
	l = lines{}
	j = job(1, "cpus")
	j.Output = l.output()
	r, err = Start(context.Background(), j)
	require.NoError(t, err)
	require.NoError(t, r.Wait())
	assert.Equal(t, -1, r.Procs()[0].CPU)
	for _, got := range l.out[0] {
		assert.Equal(t, before[0], got)
	}
}
