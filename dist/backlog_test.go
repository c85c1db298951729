package dist

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/tcp"
	"github.com/gdist/gdist/dist/transport/transporttest"
)

// backlogStall makes issue 21's stall on gs (two ranks whose receive
// queues hold limit bytes per sender): rank 1 sends rank 0 a message of
// size bytes under tag 5 that rank 0 never receives, then both all-reduce;
// rank 1's part waits behind the unreceived message until the collective
// times out. It returns both ranks' errors.
func backlogStall(gs []*ProcessGroup, size int) []error {
	c := &cluster{gs: gs}
	return c.run(func(r int, g *ProcessGroup) error {
		if r == 1 {
			if err := g.Send(bg, 0, 5, make([]byte, size)); err != nil {
				return fmt.Errorf("the unreceived message: %w", err)
			}
		} else {
			time.Sleep(50 * time.Millisecond) // rank 1 sends before rank 0 receives
		}
		return g.AllReduce(bg, F32(make([]float32, 64<<10)), Sum)
	})
}

// requireBacklogNamed checks that both ranks' errors name the unreceived
// message: the rank that timed out in a *TimeoutError, its peer in the
// notice it received.
func requireBacklogNamed(t *testing.T, errs []error, size int) {
	t.Helper()
	want := fmt.Sprintf("from rank 1 to rank 0, tag 5: 1 message, %d bytes", size)
	timedOut := 0
	for r, err := range errs {
		require.ErrorIs(t, err, ErrTimeout, "rank %d", r)
		assert.Contains(t, err.Error(), want, "rank %d names the unreceived message", r)
		var te *TimeoutError
		if errors.As(err, &te) {
			timedOut++
			assert.Contains(t, te.Queued, transport.Queued{From: 1, To: 0, Tag: 5, Messages: 1, Bytes: size}, "rank %d", r)
		}
	}
	assert.Positive(t, timedOut, "a rank timed out")
	t.Logf("rank 0: %v\nrank 1: %v", errs[0], errs[1])
}

// TestTimeoutNamesBacklogLocal is issue 21's eighth defect in-process: an
// unreceived message larger than the receive queue's bound makes the next
// all-reduce time out, and the timeout says why.
func TestTimeoutNamesBacklogLocal(t *testing.T) {
	const limit, size = 1 << 20, 2<<20 + 3
	c := localCluster(t, transporttest.NewLocal(t, 2, transport.WithLocalQueueLimit(limit)), WithTimeout(500*time.Millisecond))
	requireBacklogNamed(t, backlogStall(c.gs, size), size)
}

// TestStallReportNamesBacklog: the stall report, logged before the
// timeout, names the unreceived message too.
func TestStallReportNamesBacklog(t *testing.T) {
	const limit, size = 1 << 20, 2<<20 + 3
	var logs transporttest.LogBuffer
	c := localCluster(t, transporttest.NewLocal(t, 2, transport.WithLocalQueueLimit(limit)), WithTimeout(time.Second),
		WithStallThreshold(200*time.Millisecond), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	backlogStall(c.gs, size)
	assert.Contains(t, logs.String(), "stalled: waiting")
	assert.Contains(t, logs.String(), fmt.Sprintf("from rank 1 to rank 0, tag 5: 1 message, %d bytes", size))
}

// TestTimeoutNamesBacklogTCP is TestTimeoutNamesBacklogLocal over TCP,
// where only the receiving rank sees the queue: rank 0's timeout (or, if
// rank 1 timed out first, the notice it sent) names it.
func TestTimeoutNamesBacklogTCP(t *testing.T) {
	const limit, size = 1 << 20, 2<<20 + 3
	ts := tcpMesh(t, 2, tcp.WithQueueLimit(limit))
	c := tcpCluster(t, ts, WithTimeout(500*time.Millisecond))
	errs := backlogStall(c.gs, size)
	assert.Contains(t, errs[0].Error(), fmt.Sprintf("from rank 1 to rank 0, tag 5: 1 message, %d bytes", size))
	t.Logf("rank 0: %v\nrank 1: %v", errs[0], errs[1])
}

// TestBacklogListsOwnAndSent: Local reports what is queued at a rank and
// what it sent that waits at another; dist leaves out its own traffic.
func TestBacklogListsOwnAndSent(t *testing.T) {
	ls := transporttest.NewLocal(t, 3)
	ctx := context.Background()
	require.NoError(t, ls[1].Send(ctx, 0, 7, transport.Header{}, make([]byte, 10)))
	require.NoError(t, ls[1].Send(ctx, 0, 7, transport.Header{}, make([]byte, 5)))
	require.NoError(t, ls[0].Send(ctx, 2, 9, transport.Header{}, make([]byte, 3)))
	assert.Equal(t, []transport.Queued{{From: 1, To: 0, Tag: 7, Messages: 2, Bytes: 15}, {From: 0, To: 2, Tag: 9, Messages: 1, Bytes: 3}},
		ls[0].Queued())
	assert.Equal(t, []transport.Queued{{From: 1, To: 0, Tag: 7, Messages: 2, Bytes: 15}}, ls[1].Queued())
	assert.Empty(t, describeQueued(nil))
}
