package pipeline

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/disttest"
	"github.com/gdist/gdist/dist/timeline"
	"github.com/gdist/gdist/dist/transport/transporttest"
)

// TestTimeline: with the group's timeline on, every micro-batch's passes,
// every hidden state sent and received, and the bubbles between passes are
// on the stage's timeline.
func TestTimeline(t *testing.T) {
	const stages, m, n, steps = 2, 4, 2, 2
	path := filepath.Join(t.TempDir(), "tl.json")
	tm := mlpModel(testSizes, tensor.Float64)
	groups := disttest.Groups(t, transporttest.NewLocal(t, stages), dist.WithTimeout(30*time.Second), dist.WithTimeline(path))
	errs := disttest.Run(t, groups, func(_ int, pg *dist.ProcessGroup) error {
		_, _, err := trainStages(context.Background(), pg, tm, m, n, steps, 0.1)
		return err
	})
	require.NoError(t, errors.Join(errs...))
	for _, g := range groups {
		require.NoError(t, g.Close())
	}
	for r := range stages {
		evs, err := timeline.ReadFile(timeline.RankPath(path, r))
		require.NoError(t, err)
		count := map[string]int{}
		for _, e := range evs {
			if e.Ph == "X" {
				name := e.Name
				if i := strings.Index(name, " mb "); i >= 0 {
					name = name[:i]
				}
				count[name]++
			}
		}
		if r == 0 {
			assert.Equal(t, m*steps, count["forward"], "first stage: a forward per micro-batch and step")
			assert.Equal(t, m*steps, count["backward"])
			assert.Equal(t, m*steps, count["send to rank 1"], "activations")
			assert.Equal(t, m*steps, count["receive from rank 1"], "gradients")
		} else {
			assert.Equal(t, m*steps, count["forward+backward"], "last stage")
			assert.Equal(t, m*steps, count["receive from rank 0"])
			assert.Equal(t, m*steps, count["send to rank 0"])
		}
		assert.Positive(t, count["bubble"], "stage %d waits somewhere", r)
	}
}
