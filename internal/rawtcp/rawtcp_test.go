package rawtcp

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// mailbox is a two-rank Peer in one process.
type mailbox struct {
	mu sync.Mutex
	ch map[[3]int]chan []byte // (from, to, tag)
}

func (m *mailbox) q(from, to int, tag uint32) chan []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ch == nil {
		m.ch = map[[3]int]chan []byte{}
	}
	k := [3]int{from, to, int(tag)}
	if m.ch[k] == nil {
		m.ch[k] = make(chan []byte, 1)
	}
	return m.ch[k]
}

// rank is one side's view of the mailbox.
type rank struct {
	m  *mailbox
	me int
}

func (r rank) Send(ctx context.Context, to int, tag uint32, p []byte) error {
	select {
	case r.m.q(r.me, to, tag) <- append([]byte(nil), p...):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r rank) Recv(ctx context.Context, from int, tag uint32) ([]byte, error) {
	select {
	case p := <-r.m.q(from, r.me, tag):
		return p, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// pair connects ranks 0 and 1 and runs fn on both at once.
func pair(t *testing.T, fn func(c *Conn) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m := &mailbox{}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for me := range 2 {
		wg.Go(func() {
			c, err := Connect(ctx, rank{m, me}, me, 1-me, 9)
			if err != nil {
				errs[me] = err
				return
			}
			defer c.Close()
			assert.Equal(t, me == 0, c.Leader())
			errs[me] = fn(c)
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
}

func TestMeasure(t *testing.T) {
	var mu sync.Mutex
	figs := map[bool]Figures{}
	pair(t, func(c *Conn) error {
		f, err := c.Measure(context.Background(), Config{Pings: 200, StreamBytes: 8 << 20, ExchangeBytes: 1 << 20, ExchangeReps: 3})
		mu.Lock()
		figs[c.Leader()] = f
		mu.Unlock()
		return err
	})
	lead := figs[true]
	assert.Positive(t, lead.LatencyUs)
	assert.Positive(t, lead.StreamGBps)
	assert.Positive(t, lead.ExchangeMs)
	assert.Equal(t, 1<<20, lead.ExchangeBytes)
	assert.Zero(t, figs[false].StreamGBps, "the stream rate is the leader's")
	assert.Zero(t, figs[false].LatencyUs, "round trips are timed by the leader")
}

func TestPingPongStreamExchange(t *testing.T) {
	ctx := context.Background()
	pair(t, func(c *Conn) error {
		require.NoError(t, c.SetBuffers(1<<20))
		l, err := c.PingPong(ctx, 4096, 10, 50)
		if err != nil {
			return err
		}
		if c.Leader() {
			assert.Equal(t, 50, l.N)
			assert.LessOrEqual(t, l.Median, 10*l.Mean+time.Millisecond)
		} else {
			assert.Zero(t, l)
		}
		bw, err := c.Stream(ctx, 64<<10, 100)
		if err != nil {
			return err
		}
		assert.Positive(t, bw)
		d, err := c.Exchange(ctx, 1<<20, 8)
		if err != nil {
			return err
		}
		assert.Positive(t, d)
		d, err = c.Rounds(ctx, 4<<20, 4)
		assert.Positive(t, d)
		return err
	})
}

func TestSummarize(t *testing.T) {
	d := []time.Duration{5, 1, 3}
	assert.Equal(t, Latency{Median: 3, Mean: 3, N: 3}, Summarize(d))
	assert.Equal(t, []time.Duration{5, 1, 3}, d, "not modified")
	assert.Equal(t, Latency{}, Summarize(nil))
}

// TestContextEndsABlockedCall: the other side never answers; the call
// returns ctx's error.
func TestContextEndsABlockedCall(t *testing.T) {
	pair(t, func(c *Conn) error {
		if !c.Leader() {
			time.Sleep(300 * time.Millisecond) // then closes
			return nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err := c.Rounds(ctx, 1<<20, 1000)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		return nil
	})
}

func TestConnectToSelf(t *testing.T) {
	_, err := Connect(context.Background(), rank{&mailbox{}, 0}, 0, 0, 1)
	assert.Error(t, err)
}
