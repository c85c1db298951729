package dist

import (
	"context"
	"errors"
	"fmt"
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

// keptJoins returns how many joined contexts g's job keeps.
func keptJoins(g *ProcessGroup) int {
	j := &g.d.joins
	n := 0
	for i := range j.slots {
		if j.slots[i].Load() != nil {
			n++
		}
	}
	return n
}

// TestP2PJoinedContexts: point-to-point calls under a cancellable context
// reuse its join with the job's failure context, which still ends with
// either: the caller's cancellation ends a pending receive without failing
// the job, a failure of the job ends one, more contexts than the kept
// joins work at once, and joins whose context ended are let go.
func TestP2PJoinedContexts(t *testing.T) {
	t.Run("cancelled", func(t *testing.T) {
		c := newCluster(t, 2)
		ctx, cancel := context.WithCancel(bg)
		for range 3 {
			require.NoError(t, c.gs[0].Send(ctx, 1, 1, []byte{1}))
			_, err := c.gs[1].RecvInto(ctx, 0, 1, make([]byte, 1))
			require.NoError(t, err)
		}
		assert.Equal(t, 1, keptJoins(c.gs[1]), "one join, reused")
		got := make(chan error, 1)
		go func() {
			_, err := c.gs[1].RecvInto(ctx, 0, 2, make([]byte, 1))
			got <- err
		}()
		time.Sleep(20 * time.Millisecond)
		cancel()
		select {
		case err := <-got:
			require.ErrorIs(t, err, context.Canceled)
		case <-time.After(5 * time.Second):
			t.Fatal("receive not woken by its context")
		}
		require.Eventually(t, func() bool { return keptJoins(c.gs[1]) == 0 }, 5*time.Second, time.Millisecond,
			"the join of an ended context is let go")
		// The job goes on.
		require.NoError(t, c.gs[0].Send(bg, 1, 3, []byte{7}))
		b, err := c.gs[1].Recv(bg, 0, 3)
		require.NoError(t, err)
		assert.Equal(t, []byte{7}, b)
	})
	t.Run("job failure", func(t *testing.T) {
		c := newCluster(t, 2)
		ctx, cancel := context.WithCancel(bg)
		defer cancel()
		require.NoError(t, c.gs[0].Send(ctx, 1, 1, []byte{1}))
		_, err := c.gs[1].Recv(ctx, 0, 1)
		require.NoError(t, err)
		got := make(chan error, 1)
		go func() {
			_, err := c.gs[1].RecvInto(ctx, 0, 2, make([]byte, 1)) // never sent
			got <- err
		}()
		time.Sleep(20 * time.Millisecond)
		c.gs[0].Abort("train", errors.New("diverged"))
		select {
		case err := <-got:
			var pe *PeerError
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, 0, pe.Rank)
		case <-time.After(5 * time.Second):
			t.Fatal("receive under a kept join not woken by the job's failure")
		}
	})
	t.Run("many contexts", func(t *testing.T) {
		c := newCluster(t, 2)
		const n = joinSlots + 4
		errs := make(chan error, n)
		var cancels []context.CancelFunc
		for i := range n {
			ctx, cancel := context.WithCancel(bg)
			cancels = append(cancels, cancel)
			go func() {
				b := make([]byte, 1)
				_, err := c.gs[1].RecvInto(ctx, 0, uint32(10+i), b)
				if err == nil && b[0] != byte(i) {
					err = fmt.Errorf("tag %d: got %d", 10+i, b[0])
				}
				errs <- err
			}()
		}
		time.Sleep(20 * time.Millisecond)
		assert.Equal(t, joinSlots, keptJoins(c.gs[1]), "every slot in use; the others joined for one call")
		for i := range n {
			require.NoError(t, c.gs[0].Send(bg, 1, uint32(10+i), []byte{byte(i)}))
		}
		for range n {
			require.NoError(t, <-errs)
		}
		for _, cancel := range cancels {
			cancel()
		}
		require.Eventually(t, func() bool { return keptJoins(c.gs[1]) == 0 }, 5*time.Second, time.Millisecond)
	})
}

// TestP2PJoinsLetGo: a kept join is undone once its context ends; a new
// context takes the least recently used slot without cancelling the join
// it lets go of, which calls may still use and which is undone when its
// own context ends; and once orphanMax such joins wait, calls under new
// contexts join for themselves alone.
func TestP2PJoinsLetGo(t *testing.T) {
	var j p2pJoins
	fail, failCancel := context.WithCancel(bg)
	defer failCancel()
	kept := func() int {
		n := 0
		for i := range j.slots {
			if j.slots[i].Load() != nil {
				n++
			}
		}
		return n
	}
	orphans := func() int {
		j.mu.Lock()
		defer j.mu.Unlock()
		return j.orphans
	}

	// Ended context: undone, its slot freed.
	ctx, cancel := context.WithCancel(bg)
	c, h := j.hold(ctx, ctx.Done(), fail)
	require.Zero(t, h, "a kept join holds nothing")
	require.Equal(t, 1, kept())
	c2, _ := j.hold(ctx, ctx.Done(), fail)
	require.Equal(t, c, c2, "the same join, reused")
	vctx := context.WithValue(ctx, struct{}{}, 1)
	c3, _ := j.hold(vctx, vctx.Done(), fail)
	require.Equal(t, c, c3, "a context that ends with ctx shares its join")
	require.Equal(t, 1, kept())
	cancel()
	<-c.Done()
	require.Eventually(t, func() bool { return kept() == 0 }, 5*time.Second, time.Millisecond)

	// More contexts than slots: the least recently used join is let go
	// of, not cancelled, and undone once its context ends.
	var ctxs []context.Context
	var cancels []context.CancelFunc
	var joined []context.Context
	for range joinSlots + 1 {
		ctx, cancel := context.WithCancel(bg)
		ctxs, cancels = append(ctxs, ctx), append(cancels, cancel)
		c, h := j.hold(ctx, ctx.Done(), fail)
		require.Zero(t, h)
		joined = append(joined, c)
	}
	require.Equal(t, joinSlots, kept())
	require.Equal(t, 1, orphans(), "the first context's join was let go of")
	require.NoError(t, joined[0].Err(), "and still serves the calls under it")
	c0, h0 := j.hold(ctxs[0], ctxs[0].Done(), fail)
	require.Zero(t, h0)
	require.NotEqual(t, joined[0], c0, "a new join for the first context, in the next least recently used slot")
	require.Equal(t, 2, orphans())
	require.NoError(t, joined[1].Err())
	cancels[1]()
	require.Eventually(t, func() bool { return orphans() == 1 }, 5*time.Second, time.Millisecond,
		"an orphan is undone once its context ends")
	require.Error(t, joined[1].Err())

	// orphanMax orphans waiting: calls under new contexts join for one call.
	for range orphanMax {
		ctx, cancel := context.WithCancel(bg)
		cancels = append(cancels, cancel)
		j.hold(ctx, ctx.Done(), fail)
	}
	require.Equal(t, orphanMax, orphans())
	ctx, cancel = context.WithCancel(bg)
	cancels = append(cancels, cancel)
	c, h = j.hold(ctx, ctx.Done(), fail)
	require.NotNil(t, h.cancel, "joined for this call alone")
	require.NoError(t, c.Err())
	h.release()
	require.Error(t, c.Err(), "released with the call")
	require.Equal(t, orphanMax, orphans())

	// The job's failure ends every join, kept or orphan.
	failCancel()
	require.Eventually(t, func() bool { return orphans() == 0 && kept() == 0 }, 5*time.Second, time.Millisecond)
	for _, c := range joined {
		require.Error(t, c.Err())
	}
	for _, cancel := range cancels {
		cancel()
	}
}
