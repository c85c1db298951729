package tcp

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/tcp/internal/wire"
)

// TestSlowLargeFrameIsLiveness: a peer whose long frame trickles in over
// many heartbeat timeouts (a slow link: it cannot send a heartbeat in the
// middle of a frame) is not taken for a silent one, and the frame arrives.
func TestSlowLargeFrameIsLiveness(t *testing.T) {
	lns, addrs := listeners(t, 2)
	lns[1].Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type res struct {
		t   *Transport
		err error
	}
	r0 := make(chan res, 1)
	go func() {
		tr, err := New(ctx, 0, 2, lns[0], addrs, WithToken(testToken), WithLogger(quiet()),
			WithHeartbeat(20*time.Millisecond, 200*time.Millisecond))
		r0 <- res{tr, err}
	}()
	conn, _, err := fakeClient(t, addrs[0], 1, 2, testToken, 0, wire.ModeMesh)
	require.NoError(t, err)
	r := <-r0
	require.NoError(t, r.err)
	defer r.t.Close()

	const size, chunk, every = 64 << 10, 1 << 10, 25 * time.Millisecond // 1.6 s: 8 timeouts
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte(i)
	}
	go func() {
		conn.Write(header(wire.Header{Kind: wire.Data, Src: 1, Tag: 3, Len: size}))
		for off := 0; off < size; off += chunk {
			time.Sleep(every)
			if _, err := conn.Write(payload[off : off+chunk]); err != nil {
				return
			}
		}
	}()
	dst := make([]byte, size)
	start := time.Now()
	_, n, err := r.t.RecvInto(ctx, 1, 3, dst)
	require.NoError(t, err, "after %v", time.Since(start))
	assert.Equal(t, size, n)
	assert.Equal(t, payload, dst)
	assert.Greater(t, time.Since(start), 4*200*time.Millisecond, "the frame took many timeouts")
}

// TestHeartbeatObserver: every link reports heartbeat round trips to the
// observer, busy or idle.
func TestHeartbeatObserver(t *testing.T) {
	var mu sync.Mutex
	got := map[[2]int][]time.Duration{}
	obs := func(self int) Option {
		return WithHeartbeatObserver(func(peer int, rtt time.Duration) {
			mu.Lock()
			got[[2]int{self, peer}] = append(got[[2]int{self, peer}], rtt)
			mu.Unlock()
		})
	}
	lns, addrs := listeners(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ts := make([]*Transport, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			ts[i], errs[i] = New(ctx, i, 3, lns[i], addrs, WithToken(testToken), WithLogger(quiet()),
				WithHeartbeat(0, 400*time.Millisecond), obs(i))
		})
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "rank %d", i)
		defer ts[i].Close()
	}
	// Keep the 0 -> 1 link busy while heartbeats run.
	busy := make(chan error, 1)
	go func() {
		p := make([]byte, 256<<10)
		for end := time.Now().Add(600 * time.Millisecond); time.Now().Before(end); {
			if err := ts[0].Send(ctx, 1, 1, transport.Header{}, p); err != nil {
				busy <- err
				return
			}
			m, err := ts[1].Recv(ctx, 0, 1)
			if err != nil {
				busy <- err
				return
			}
			ts[1].Release(m.Payload)
		}
		busy <- nil
	}()
	require.NoError(t, <-busy)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for i := range 3 {
			for j := range 3 {
				if i != j && len(got[[2]int{i, j}]) < 3 {
					return false
				}
			}
		}
		return true
	}, 5*time.Second, 10*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for k, rtts := range got {
		for _, d := range rtts {
			assert.Greater(t, d, time.Duration(0), "%v", k)
			assert.Less(t, d, 2*time.Second, "%v", k)
		}
	}
}

func TestHeartbeatOptions(t *testing.T) {
	cfg, err := apply([]Option{WithHeartbeat(0, 4*time.Second)})
	require.NoError(t, err)
	assert.Equal(t, 500*time.Millisecond, cfg.hbInterval, "derived: timeout/8")
	cfg, err = apply([]Option{WithHeartbeat(0, time.Minute)})
	require.NoError(t, err)
	assert.Equal(t, time.Second, cfg.hbInterval, "derived: at most 1 s")
	cfg, err = apply(nil)
	require.NoError(t, err)
	assert.Equal(t, DefaultHeartbeatTimeout, cfg.hbTimeout)
	assert.Equal(t, transport.DefaultHeartbeatTimeout, DefaultHeartbeatTimeout, "one default across transports")
	assert.LessOrEqual(t, DefaultHeartbeatTimeout+DefaultHeartbeatInterval/4, 11*time.Second-time.Second/2,
		"a frozen peer is named within 11 s by default, with half a second to spare")
	assert.LessOrEqual(t, DefaultHeartbeatInterval+time.Second, transport.PauseMargin,
		"the margin covers one interval and a second of slack")
	cfg, err = apply([]Option{WithHeartbeat(-1, 0)})
	require.NoError(t, err)
	assert.Negative(t, cfg.hbInterval, "disabled")
}
