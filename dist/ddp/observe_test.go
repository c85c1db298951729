package ddp

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/gorgonia"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/disttest"
	"github.com/gdist/gdist/dist/timeline"
	"github.com/gdist/gdist/dist/transport/transporttest"
)

// TestTimelineBuckets: with the group's timeline on, every step puts each
// bucket's gradients, its all-reduce and Sync's exposed wait on the rank's
// timeline, next to the collectives themselves.
func TestTimelineBuckets(t *testing.T) {
	const steps = 3
	path := filepath.Join(t.TempDir(), "tl.json")
	groups := disttest.Groups(t, transporttest.NewLocal(t, 2), dist.WithTimeout(30*time.Second), dist.WithTimeline(path))
	var nBuckets int
	errs := disttest.Run(t, groups, func(_ int, pg *dist.ProcessGroup) error {
		d, ps, _, _, vm := smallModel(t, pg, -1)
		defer vm.Close()
		solver := d.Solver(gorgonia.NewVanillaSolver(gorgonia.WithLearnRate(0.1)))
		for range steps {
			if err := vm.RunAll(); err != nil {
				return err
			}
			if err := solver.Step(gorgonia.NodesToValueGrads(ps)); err != nil {
				return err
			}
			vm.Reset()
		}
		if pg.Rank() == 0 {
			nBuckets = d.Stats().Buckets
		}
		return d.Close()
	})
	require.NoError(t, errors.Join(errs...))
	for _, g := range groups {
		require.NoError(t, g.Close())
	}
	require.Positive(t, nBuckets)
	for r := range 2 {
		evs, err := timeline.ReadFile(timeline.RankPath(path, r))
		require.NoError(t, err)
		tf := struct{ TraceEvents []timeline.TraceEvent }{evs}
		count := map[string]int{}
		for _, e := range tf.TraceEvents {
			if e.Ph == "X" {
				count[e.Name]++
				assert.GreaterOrEqual(t, e.Dur, 0.0, e.Name)
			}
		}
		buckets := 0
		for name, n := range count {
			if strings.HasPrefix(name, "bucket ") && strings.HasSuffix(name, " gradients") {
				buckets++
				assert.Equal(t, steps, n, "rank %d: %s", r, name)
				ar := strings.TrimSuffix(name, " gradients") + " all-reduce"
				assert.Equal(t, steps, count[ar], "rank %d: %s", r, ar)
			}
		}
		assert.Equal(t, nBuckets, buckets, "rank %d: every bucket", r)
		assert.Equal(t, steps, count["exposed communication"])
		assert.GreaterOrEqual(t, count["all_reduce"], nBuckets*steps, "the collectives are there too")
	}
}
