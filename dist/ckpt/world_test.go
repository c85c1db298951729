package ckpt_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/ckpt"
)

// TestWorldChange: with WithWorldChange a data-parallel checkpoint saved on
// 2 ranks resumes on 3 and on 1: every rank gets the step and the saved
// world size, the ranks agree (Verify), and RNG states saved per rank are
// not handed out; a pipeline stage's checkpoint is still refused.
func TestWorldChange(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	saveEvery(t, dir, 2, 2, 4)
	for _, n := range []int{3, 1} {
		runRanks(t, n, func(rank int, pg *dist.ProcessGroup) error {
			m, err := ckpt.New(pg, dir, ckpt.WithWorldChange())
			if err != nil {
				return err
			}
			defer m.Close()
			r, err := m.Resume(ctx)
			if err != nil {
				return err
			}
			assert.Equal(t, int64(4), r.Step)
			assert.Equal(t, 2, r.SavedWorld)
			return m.Verify(ctx, r.State)
		})
	}
	res, errs := resumeOn(t, 3, dir, ckpt.WithWorldChange(), ckpt.WithRankRNG())
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
		assert.Nil(t, res[r].State.RNG, "rank %d: another world's RNG streams are not handed out", r)
	}

	dir = t.TempDir()
	saveStages(t, dir, 2, 2)
	errs = resumeErrs(resumeOn(t, 3, ckpt.StageDir(dir, 0), ckpt.WithWorldChange()))
	for r, err := range errs {
		assert.ErrorIs(t, err, ckpt.ErrLayout, "rank %d", r)
	}
}
