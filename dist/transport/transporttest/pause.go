package transporttest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
)

// PauseThenFreeze checks a transport's heartbeat against rank peer, a
// process that stop and resume suspend and resume (SIGSTOP, SIGCONT).
// pending delivers the error of a receive from peer, posted before. It
// pauses peer for timeout - transport.PauseMargin, which must not be taken
// for a death: pending stays quiet while peer is stopped and for the
// margin and a second after it resumed (had the resumed peer taken this
// rank for dead, it would have left and the receive failed). Then it stops
// peer for good: pending must fail with a *transport.PeerError naming
// peer unresponsive, between timeout - 5/4 interval and timeout + 1 s
// later.
// It returns that error.
func PauseThenFreeze(t *testing.T, peer int, stop, resume func() error, pending <-chan error, timeout, interval time.Duration) error {
	t.Helper()
	pause := timeout - transport.PauseMargin
	require.NoError(t, stop())
	time.Sleep(pause)
	require.NoError(t, resume())
	select {
	case err := <-pending:
		t.Fatalf("a pause of %v was taken for a death: %v", pause, err)
	case <-time.After(transport.PauseMargin + time.Second):
	}

	require.NoError(t, stop())
	stopped := time.Now()
	select {
	case err := <-pending:
		el := time.Since(stopped)
		var pe *transport.PeerError
		require.ErrorAs(t, err, &pe)
		require.Equal(t, peer, pe.Rank)
		require.ErrorIs(t, err, transport.ErrPeerUnresponsive)
		t.Logf("survived a %v pause; a freeze named after %v: %v", pause, el.Round(time.Millisecond), err)
		// The last heartbeat went out up to an interval before the stop,
		// and is seen up to a quarter interval (a monitor tick) late or
		// early.
		assert.GreaterOrEqual(t, el, timeout-interval-interval/4, "not before the timeout")
		assert.Less(t, el, timeout+time.Second)
		return err
	case <-time.After(timeout + 5*time.Second):
		t.Fatal("a frozen peer was not named")
	}
	return nil
}
