package tcp

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/tcp/internal/wire"
)

// requireInitTimeout checks that err is an *InitTimeoutError of rank and
// returns it.
func requireInitTimeout(t *testing.T, err error, rank int) *InitTimeoutError {
	t.Helper()
	var it *InitTimeoutError
	require.ErrorAs(t, err, &it)
	require.ErrorIs(t, err, ErrInitTimeout)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, rank, it.Rank)
	return it
}

// TestInitTimeoutNamesMissingRanks: New gives up after the init timeout
// naming the ranks that never connected, on the accepting and on the
// dialing side.
func TestInitTimeoutNamesMissingRanks(t *testing.T) {
	lns, addrs := listeners(t, 3)
	lns[1].Close() // rank 1 never comes
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 3)
	took := make([]time.Duration, 3)
	for _, i := range []int{0, 2} {
		wg.Go(func() {
			start := time.Now()
			_, errs[i] = New(ctx, i, 3, lns[i], addrs, WithToken(testToken), WithLogger(quiet()),
				WithInitTimeout(500*time.Millisecond))
			took[i] = time.Since(start)
		})
	}
	wg.Wait()
	it := requireInitTimeout(t, errs[0], 0)
	assert.Equal(t, []int{1}, it.Missing, "rank 2 connected to rank 0; rank 1 did not")
	assert.Equal(t, 500*time.Millisecond, it.Timeout)
	it = requireInitTimeout(t, errs[2], 2)
	assert.Equal(t, []int{1}, it.Missing)
	require.Error(t, it.Last, "the dial to rank 1 kept failing")
	assert.Contains(t, it.Error(), "rank 1 never joined")
	for _, i := range []int{0, 2} {
		assert.Less(t, took[i], 3*time.Second, "rank %d", i)
		assert.GreaterOrEqual(t, took[i], 500*time.Millisecond, "rank %d", i)
	}

	// The caller's context, when it ends first, is reported as such.
	lns, addrs = listeners(t, 2)
	defer lns[1].Close()
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err := New(cctx, 0, 2, lns[0], addrs, WithToken(testToken), WithLogger(quiet()), WithInitTimeout(time.Minute))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	var it2 *InitTimeoutError
	require.NotErrorAs(t, err, &it2)
}

// TestRendezvousRefusalsOnEverySide: a rank with a wrong token or world
// size fails at once with the reason; rank 0 fails at the init timeout
// naming it and what it refused.
func TestRendezvousRefusalsOnEverySide(t *testing.T) {
	for _, c := range []struct {
		name       string
		opts       []Option
		world      int
		reason     wire.RejectReason
		wantReason string
	}{
		{"token", []Option{WithToken([]byte("not the job token, but long"))}, 2, wire.RejectAuth,
			"authentication failed: wrong GDIST_TOKEN?"},
		{"world", []Option{WithToken(testToken)}, 3, wire.RejectWorld,
			"world size mismatch: world size 3, this job has 2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			master := freeAddr(t)
			ctx := context.Background()
			const timeout = 1500 * time.Millisecond
			r0 := make(chan error, 1)
			start := time.Now()
			go func() {
				_, err := Rendezvous(ctx, 0, 2, master, WithToken(testToken), WithLogger(quiet()), WithInitTimeout(timeout))
				r0 <- err
			}()
			_, err := Rendezvous(ctx, 1, c.world, master, append(c.opts, WithLogger(quiet()), WithInitTimeout(timeout))...)
			requireRejected(t, err, c.reason)
			assert.Less(t, time.Since(start), timeout, "rank 1 fails at once: %v", err)
			t.Logf("rank 1: %v", err)

			err = <-r0
			el := time.Since(start)
			it := requireInitTimeout(t, err, 0)
			t.Logf("rank 0 after %v: %v", el.Round(time.Millisecond), err)
			assert.Less(t, el, timeout+time.Second)
			assert.Equal(t, []int{1}, it.Missing)
			require.NotEmpty(t, it.Refused)
			r := it.Refused[0]
			assert.Equal(t, 1, r.Rank)
			assert.Equal(t, c.reason, r.Code)
			assert.Equal(t, c.wantReason, r.Reason)
			assert.Contains(t, err.Error(), "rank 1 never joined")
			assert.Contains(t, err.Error(), c.wantReason)
		})
	}
}

// TestRendezvousTimeoutWhileRegistered: a rank waiting for the table
// reports that it waits for rank 0, which names the rank that is missing.
func TestRendezvousTimeoutWhileRegistered(t *testing.T) {
	master := freeAddr(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() {
			// Rank 1 gives up first: when rank 0 does, it closes the
			// connection rank 1 waits on (see below).
			_, errs[i] = Rendezvous(ctx, i, 3, master, WithToken(testToken), WithLogger(quiet()),
				WithInitTimeout(time.Duration(1000-300*i)*time.Millisecond))
		})
	}
	wg.Wait()
	it := requireInitTimeout(t, errs[0], 0)
	assert.Equal(t, []int{2}, it.Missing)
	it = requireInitTimeout(t, errs[1], 1)
	assert.Empty(t, it.Missing)
	assert.Contains(t, it.Waiting, "waiting for the table")

	// When rank 0 gives up first, a registered rank learns it at once.
	master = freeAddr(t)
	for i := range 2 {
		wg.Go(func() {
			_, errs[i] = Rendezvous(ctx, i, 3, master, WithToken(testToken), WithLogger(quiet()),
				WithInitTimeout(time.Duration(500+1000*i)*time.Millisecond))
		})
	}
	start := time.Now()
	wg.Wait()
	requireInitTimeout(t, errs[0], 0)
	require.Error(t, errs[1])
	assert.Contains(t, errs[1].Error(), "rank 0 ended the rendezvous")
	assert.Less(t, time.Since(start), 1500*time.Millisecond)

	// Without rank 0 at all, rank 1 names rank 0.
	_, err := Rendezvous(ctx, 1, 2, freeAddr(t), WithToken(testToken), WithLogger(quiet()),
		WithInitTimeout(300*time.Millisecond))
	it = requireInitTimeout(t, err, 1)
	assert.Equal(t, []int{0}, it.Missing)
	require.Error(t, it.Last)
}

// TestHandshakeFlood: connections that never authenticate, opened as fast
// as possible, neither keep a rank from joining nor flood the log.
func TestHandshakeFlood(t *testing.T) {
	rec := &logRecorder{}
	lns, addrs := listeners(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r0 := make(chan error, 1)
	var tr0 *Transport
	go func() {
		var err error
		tr0, err = New(ctx, 0, 2, lns[0], addrs, WithToken(testToken), WithLogger(slog.New(rec)))
		r0 <- err
	}()
	stop := make(chan struct{})
	var flood sync.WaitGroup
	var mu sync.Mutex
	opened := 0
	for range 4 {
		flood.Go(func() {
			var conns []net.Conn
			defer func() {
				for _, c := range conns {
					c.Close()
				}
			}()
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := net.Dial("tcp", addrs[0])
				if err != nil {
					continue
				}
				conns = append(conns, c)
				mu.Lock()
				opened++
				mu.Unlock()
				if len(conns) > 100 {
					conns[0].Close()
					conns = conns[1:]
				}
			}
		})
	}
	time.Sleep(500 * time.Millisecond) // every slot taken, many times over
	start := time.Now()
	tr1, err := New(ctx, 1, 2, lns[1], addrs, WithToken(testToken), WithLogger(quiet()))
	joined := time.Since(start)
	require.NoError(t, err)
	defer tr1.Close()
	require.NoError(t, <-r0)
	defer tr0.Close()
	close(stop)
	flood.Wait()
	mu.Lock()
	n := opened
	mu.Unlock()
	t.Logf("rank 1 joined in %v through a flood of %d connections", joined.Round(time.Millisecond), n)
	assert.Less(t, joined, 2*time.Second)
	require.NoError(t, tr1.Send(ctx, 0, 1, transport.Header{}, []byte("hi")))
	m, err := tr0.Recv(ctx, 1, 1)
	require.NoError(t, err)
	assert.Equal(t, "hi", string(m.Payload))

	lines := len(rec.reasons())
	refused := 0
	for _, r := range tr0.refused.list() {
		refused += r.Count
	}
	t.Logf("%d refusals, %d log lines", refused, lines)
	assert.Greater(t, refused, 64)
	assert.LessOrEqual(t, lines, refusalBurst+2)
}

// TestSelfDial is issue 21's fifth defect, forced: rank 1's rendezvous
// address (MASTER_ADDR:MASTER_PORT) is its own listener's, as when
// MASTER_PORT happens to be the ephemeral port the system gave that
// listener. Rank 1 says so at once, in words; rank 0 fails at its init
// timeout naming rank 1 as the rank that never joined.
func TestSelfDial(t *testing.T) {
	own := freeAddr(t) // rank 1 listens here, and takes it for rank 0's
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const initTimeout = 2 * time.Second
	errs := make([]error, 2)
	took := make([]time.Duration, 2)
	var wg sync.WaitGroup
	for r, master := range []string{freeAddr(t), own} {
		opts := []Option{WithToken(testToken), WithLogger(quiet()), WithInitTimeout(initTimeout)}
		if r == 1 {
			opts = append(opts, WithListenAddr(own))
		}
		wg.Go(func() {
			start := time.Now()
			tr, err := Rendezvous(ctx, r, 2, master, opts...)
			took[r], errs[r] = time.Since(start), err
			if err == nil {
				tr.Close()
			}
		})
	}
	wg.Wait()

	var se *SelfDialError
	require.ErrorAs(t, errs[1], &se)
	assert.ErrorIs(t, errs[1], ErrSelfDial)
	assert.Contains(t, errs[1].Error(), "MASTER_ADDR:MASTER_PORT ("+own+") is this process's own listener: pick a MASTER_PORT outside the ephemeral range")
	assert.Less(t, took[1], initTimeout, "rank 1 gives up at once")

	var ie *InitTimeoutError
	require.ErrorAs(t, errs[0], &ie)
	assert.Equal(t, []int{1}, ie.Missing)
	assert.Contains(t, errs[0].Error(), "rank 1 never joined")
	assert.GreaterOrEqual(t, took[0], initTimeout)
	t.Logf("rank 0: %v\nrank 1: %v", errs[0], errs[1])
}

// TestSelfDialMesh: in a job whose addresses are all given (New), a rank
// given its own address for a peer's says so too.
func TestSelfDialMesh(t *testing.T) {
	lns, addrs := listeners(t, 2)
	addrs[0] = addrs[1]
	lns[0].Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := New(ctx, 1, 2, lns[1], addrs, WithToken(testToken), WithLogger(quiet()))
	var se *SelfDialError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, SelfDialError{Rank: 1, To: 0, Addr: addrs[1]}, *se)
	assert.Contains(t, err.Error(), "rank 0's address "+addrs[1]+" is this process's own listener")
}
