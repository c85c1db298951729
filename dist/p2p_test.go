package dist

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPointToPoint(t *testing.T) {
	c := newCluster(t, 3)
	requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
		ctx := bg
		next, prev := (r+1)%3, (r+2)%3
		if err := g.Send(ctx, next, 5, []byte{byte(r)}); err != nil {
			return err
		}
		if err := g.Send(ctx, next, 6, F32([]float32{float32(r), 0.5}).Bytes()); err != nil {
			return err
		}
		if err := g.Send(ctx, next, 7, F64([]float64{float64(r), 0.25, -1}).Bytes()); err != nil {
			return err
		}
		if err := g.Send(ctx, next, 8, F32([]float32{1, 2, 3}).Bytes()); err != nil {
			return err
		}
		if err := g.Send(ctx, next, 9, F64([]float64{4, 5}).Bytes()); err != nil {
			return err
		}
		if err := g.Send(ctx, next, 10, F32([]float32{1, 2}).Bytes()); err != nil {
			return err
		}
		if err := g.Send(ctx, next, 11, []byte{1, 2, 3}); err != nil {
			return err
		}

		p, err := g.Recv(ctx, prev, 5)
		require.NoError(t, err)
		assert.Equal(t, []byte{byte(prev)}, p)
		f := make([]float32, 2)
		n, err := g.RecvInto(ctx, prev, 6, F32(f).Bytes())
		require.NoError(t, err)
		assert.Equal(t, 8, n)
		assert.Equal(t, []float32{float32(prev), 0.5}, f)
		d := make([]float64, 3)
		n, err = g.RecvInto(ctx, prev, 7, F64(d).Bytes())
		require.NoError(t, err)
		assert.Equal(t, 24, n)
		assert.Equal(t, []float64{float64(prev), 0.25, -1}, d)
		into := make([]float32, 3)
		_, err = g.RecvInto(ctx, prev, 8, F32(into).Bytes())
		require.NoError(t, err)
		assert.Equal(t, []float32{1, 2, 3}, into)
		into64 := make([]float64, 2)
		_, err = g.RecvInto(ctx, prev, 9, F64(into64).Bytes())
		require.NoError(t, err)
		assert.Equal(t, []float64{4, 5}, into64)
		n, err = g.RecvInto(ctx, prev, 10, F32(make([]float32, 3)).Bytes())
		require.NoError(t, err)
		assert.Equal(t, 8, n, "a shorter message: its length is returned")
		n, err = g.RecvInto(ctx, prev, 11, F32(make([]float32, 0)).Bytes())
		require.ErrorIs(t, err, ErrMessageTooLong)
		assert.Equal(t, 3, n)

		// Self-sends loop back.
		require.NoError(t, g.Send(ctx, r, 12, []byte("me")))
		p, err = g.Recv(ctx, r, 12)
		require.NoError(t, err)
		assert.Equal(t, "me", string(p))
		return nil
	}))
}

// TestPointToPointAfterAbort checks that point-to-point calls belong to
// the group's failure domain: after a failure they fail with the group's
// error, and a blocked receive is woken by a failure elsewhere.
func TestPointToPointAfterAbort(t *testing.T) {
	t.Run("after", func(t *testing.T) {
		c := newCluster(t, 2)
		errs := c.run(func(r int, g *ProcessGroup) error {
			return g.AllReduce(bg, F32(make([]float32, 1+r)), Sum) // desync
		})
		for _, err := range errs {
			require.ErrorAs(t, err, new(*DesyncError))
		}
		for r, err := range c.run(func(r int, g *ProcessGroup) error {
			if r == 0 {
				return g.Send(bg, 1, 1, F32([]float32{42}).Bytes())
			}
			_, err := g.Recv(bg, 0, 1)
			return err
		}) {
			require.ErrorIs(t, err, ErrAborted, "rank %d", r)
			require.ErrorIs(t, err, ErrDesync, "rank %d", r)
		}
	})
	t.Run("blocked", func(t *testing.T) {
		c := newCluster(t, 3)
		got := make(chan error, 1)
		go func() {
			_, err := c.gs[1].Recv(bg, 2, 5) // rank 2 never sends
			got <- err
		}()
		time.Sleep(20 * time.Millisecond)
		user := errors.New("training diverged")
		err := c.gs[0].Abort("train", user)
		require.ErrorIs(t, err, user)
		select {
		case err := <-got:
			var pe *PeerError
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, 0, pe.Rank)
			assert.Equal(t, "recv", pe.Op)
			var a *AbortError
			require.ErrorAs(t, err, &a)
			assert.Equal(t, KindUser, a.Kind)
			assert.Equal(t, "train", a.Op)
			assert.Contains(t, a.Msg, "training diverged")
		case <-time.After(5 * time.Second):
			t.Fatal("blocked receive not woken by the abort")
		}
	})
}
