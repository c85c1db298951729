package mailbox

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

type msg struct {
	id   int
	data []byte
}

var errGone = errors.New("gone")

func TestFIFOAndTags(t *testing.T) {
	m := New[msg](2, 0, nil)
	ctx := context.Background()
	for i := range 5 {
		require.NoError(t, m.Put(ctx, 1, 7, msg{id: i}, 1))
	}
	require.NoError(t, m.Put(ctx, 1, 8, msg{id: 100}, 1))
	got, err := m.Get(ctx, 1, 8)
	require.NoError(t, err)
	assert.Equal(t, 100, got.id, "tags are independent")
	for i := range 5 {
		got, err := m.Get(ctx, 1, 7)
		require.NoError(t, err)
		assert.Equal(t, i, got.id)
	}
	assert.Zero(t, m.Len(), "drained queues are removed")
}

// TestDrainedQueuesGoAway: however many distinct tags pass through, only
// queues with messages or waiters remain.
func TestDrainedQueuesGoAway(t *testing.T) {
	m := New[msg](2, 0, nil)
	ctx := context.Background()
	for tag := range uint32(10_000) {
		require.NoError(t, m.Put(ctx, 0, tag, msg{id: int(tag)}, 8))
		got, err := m.Get(ctx, 0, tag)
		require.NoError(t, err)
		require.Equal(t, int(tag), got.id)
	}
	assert.Zero(t, m.Len())
	// Waiting first, then the message.
	done := make(chan msg)
	go func() {
		got, _ := m.Get(ctx, 1, 5)
		done <- got
	}()
	require.Eventually(t, func() bool { return m.Len() == 1 }, time.Second, time.Millisecond, "a waiting Get keeps its queue")
	require.NoError(t, m.Put(ctx, 1, 5, msg{id: 9}, 1))
	assert.Equal(t, 9, (<-done).id)
	assert.Zero(t, m.Len())
	// A Get that gives up leaves nothing behind.
	cctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	_, err := m.Get(cctx, 1, 6)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Zero(t, m.Len())
	// Nor does a GetInto.
	_, _, _, err = m.GetInto(cctx, 1, 6, make([]byte, 4))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Zero(t, m.Len())
}

// TestSteadyStateNoAlloc: Put+Get and Claim+Complete+GetInto on one tag
// reuse queue structs and posts.
func TestSteadyStateNoAlloc(t *testing.T) {
	m := New[msg](2, 1<<20, nil)
	ctx := context.Background()
	dst := make([]byte, 8)
	round := func() {
		if err := m.Put(ctx, 0, 3, msg{id: 1}, 8); err != nil {
			panic(err)
		}
		if _, err := m.Get(ctx, 0, 3); err != nil {
			panic(err)
		}
		if err := m.Put(ctx, 0, 4, msg{id: 2}, 8); err != nil {
			panic(err)
		}
		if _, _, direct, err := m.GetInto(ctx, 0, 4, dst); err != nil || direct {
			panic(err)
		}
	}
	for range 10 {
		round()
	}
	assert.Zero(t, testing.AllocsPerRun(1000, round))
}

// TestByteBound: a source with limit bytes queued waits; one message larger
// than the bound still passes into an empty queue; a Get makes room.
func TestByteBound(t *testing.T) {
	m := New[msg](2, 100, nil)
	ctx := context.Background()
	require.NoError(t, m.Put(ctx, 0, 1, msg{id: 1}, 250), "an oversized message passes into an empty queue")
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, m.Put(cctx, 0, 2, msg{id: 2}, 1), context.DeadlineExceeded, "full: the Put waits")
	require.NoError(t, m.Put(ctx, 1, 2, msg{id: 3}, 50), "other sources are not affected")
	res := make(chan error, 1)
	go func() { res <- m.Put(ctx, 0, 2, msg{id: 4}, 60) }()
	time.Sleep(10 * time.Millisecond)
	select {
	case <-res:
		t.Fatal("Put did not wait for space")
	default:
	}
	_, err := m.Get(ctx, 0, 1)
	require.NoError(t, err)
	require.NoError(t, <-res)
	got, err := m.Get(ctx, 0, 2)
	require.NoError(t, err)
	assert.Equal(t, 4, got.id, "the Put that gave up queued nothing")
}

// TestPostedReceive: a waiting GetInto is claimed by the producer, which
// fills its buffer; a queued message is returned for copying instead; a
// claim with a message queued ahead is refused.
func TestPostedReceive(t *testing.T) {
	m := New[msg](2, 0, nil)
	ctx := context.Background()
	assert.Nil(t, m.Claim(0, 1), "nothing posted")

	dst := make([]byte, 4)
	type res struct {
		msg    msg
		n      int
		direct bool
		err    error
	}
	rc := make(chan res, 1)
	go func() {
		mm, n, direct, err := m.GetInto(ctx, 0, 1, dst)
		rc <- res{mm, n, direct, err}
	}()
	var p *Post[msg]
	require.Eventually(t, func() bool { p = m.Claim(0, 1); return p != nil }, time.Second, time.Millisecond)
	assert.Nil(t, m.Claim(0, 1), "a post is claimed once")
	copy(p.Dst, "abcd")
	m.Complete(p, msg{id: 5}, 4, nil)
	r := <-rc
	require.NoError(t, r.err)
	assert.True(t, r.direct)
	assert.Equal(t, 5, r.msg.id)
	assert.Equal(t, "abcd", string(dst[:r.n]))
	assert.Zero(t, m.Len())

	// Queued first: not claimable, GetInto hands it out for copying.
	require.NoError(t, m.Put(ctx, 0, 1, msg{id: 6, data: []byte("xy")}, 2))
	mm, _, direct, err := m.GetInto(ctx, 0, 1, dst)
	require.NoError(t, err)
	assert.False(t, direct)
	assert.Equal(t, 6, mm.id)

	// A claimed receive waits for Complete even when its context ends.
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		mm, n, direct, err := m.GetInto(cctx, 0, 2, dst)
		rc <- res{mm, n, direct, err}
	}()
	require.Eventually(t, func() bool { p = m.Claim(0, 2); return p != nil }, time.Second, time.Millisecond)
	cancel()
	select {
	case <-rc:
		t.Fatal("a claimed GetInto returned before Complete")
	case <-time.After(20 * time.Millisecond):
	}
	m.Complete(p, msg{id: 7}, 3, nil)
	r = <-rc
	require.NoError(t, r.err)
	assert.Equal(t, 7, r.msg.id)
	assert.Equal(t, 3, r.n)
}

// TestCloseAndFailSource: CloseSource delivers what was queued, then
// reports the error; FailSource drops what was queued (through drop) and
// reports at once; neither touches other sources.
func TestCloseAndFailSource(t *testing.T) {
	var mu sync.Mutex
	var dropped []int
	m := New[msg](3, 0, func(x msg) { mu.Lock(); dropped = append(dropped, x.id); mu.Unlock() })
	ctx := context.Background()
	require.NoError(t, m.Put(ctx, 1, 1, msg{id: 1}, 1))
	require.NoError(t, m.Put(ctx, 2, 1, msg{id: 2}, 1))
	waiting := make(chan error, 2)
	go func() { _, err := m.Get(ctx, 1, 9); waiting <- err }()
	go func() { _, _, _, err := m.GetInto(ctx, 2, 9, nil); waiting <- err }()
	require.Eventually(t, func() bool { return m.Len() == 4 }, time.Second, time.Millisecond)

	m.CloseSource(1, errGone)
	require.ErrorIs(t, <-waiting, errGone)
	got, err := m.Get(ctx, 1, 1)
	require.NoError(t, err)
	assert.Equal(t, 1, got.id, "queued before the close: still delivered")
	_, err = m.Get(ctx, 1, 1)
	require.ErrorIs(t, err, errGone)
	require.ErrorIs(t, m.Put(ctx, 1, 1, msg{}, 1), errGone)

	m.FailSource(2, errGone)
	require.ErrorIs(t, <-waiting, errGone)
	_, err = m.Get(ctx, 2, 1)
	require.ErrorIs(t, err, errGone, "queued before the failure: dropped")
	assert.Equal(t, []int{2}, dropped)

	require.NoError(t, m.Put(ctx, 0, 1, msg{id: 3}, 1), "source 0 is not affected")
	got, err = m.Get(ctx, 0, 1)
	require.NoError(t, err)
	assert.Equal(t, 3, got.id)
	assert.Zero(t, m.Len())
}

// TestFail: Fail wakes every waiter, drops what was queued and fails every
// later call.
func TestFail(t *testing.T) {
	var dropped int
	m := New[msg](2, 10, func(msg) { dropped++ })
	ctx := context.Background()
	require.NoError(t, m.Put(ctx, 0, 1, msg{}, 10))
	errs := make(chan error, 3)
	go func() { _, err := m.Get(ctx, 1, 1); errs <- err }()
	go func() { _, _, _, err := m.GetInto(ctx, 1, 2, nil); errs <- err }()
	go func() { errs <- m.Put(ctx, 0, 3, msg{}, 5) }() // waits for space
	time.Sleep(10 * time.Millisecond)
	assert.True(t, m.Fail(errGone))
	assert.False(t, m.Fail(errors.New("second")))
	for range 3 {
		require.ErrorIs(t, <-errs, errGone)
	}
	assert.Equal(t, 1, dropped)
	_, err := m.Get(ctx, 0, 1)
	require.ErrorIs(t, err, errGone)
	require.ErrorIs(t, m.Err(), errGone)
	assert.Nil(t, m.Claim(0, 1))
}

// TestConcurrent hammers one mailbox with producers and consumers on a few
// tags, mixing Get, GetInto and claimed deliveries; every message arrives
// once, in order per (source, tag). Run with -race.
func TestConcurrent(t *testing.T) {
	const sources, tags, per = 3, 4, 500
	m := New[msg](sources, 64, nil)
	ctx := context.Background()
	var wg sync.WaitGroup
	for s := range sources {
		for tag := range uint32(tags) {
			wg.Go(func() {
				for i := range per {
					if p := m.Claim(s, tag); p != nil {
						p.Dst[0] = byte(i)
						m.Complete(p, msg{id: i}, 1, nil)
						continue
					}
					if err := m.Put(ctx, s, tag, msg{id: i}, 8); err != nil {
						t.Error(err)
						return
					}
				}
			})
			wg.Go(func() {
				dst := make([]byte, 1)
				for i := range per {
					var got msg
					var err error
					var direct bool
					if i%2 == 0 {
						got, err = m.Get(ctx, s, tag)
					} else {
						got, _, direct, err = m.GetInto(ctx, s, tag, dst)
						if direct && dst[0] != byte(i) {
							t.Errorf("direct delivery %d wrote %d", i, dst[0])
						}
					}
					if err != nil || got.id != i {
						t.Errorf("source %d tag %d: got %d (%v), want %d", s, tag, got.id, err, i)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	assert.Zero(t, m.Len())
}

// TestBurstShrinks: after a burst of many queued tags is drained, the map
// that held them is rebuilt small, however long other queues stay.
func TestBurstShrinks(t *testing.T) {
	m := New[msg](2, 0, nil)
	ctx := context.Background()
	waiter := make(chan error, 1)
	go func() { _, err := m.Get(ctx, 1, 0); waiter <- err }() // a long-lived waiter
	require.Eventually(t, func() bool { return m.Len() == 1 }, time.Second, time.Millisecond)
	for tag := range uint32(100_000) {
		require.NoError(t, m.Put(ctx, 0, tag, msg{}, 1))
	}
	m.mu.Lock()
	peak := m.peak
	m.mu.Unlock()
	assert.Equal(t, 100_001, peak)
	for tag := range uint32(100_000) {
		_, err := m.Get(ctx, 0, tag)
		require.NoError(t, err)
	}
	m.mu.Lock()
	peak = m.peak
	m.mu.Unlock()
	assert.Less(t, peak, shrinkMin, "the map was rebuilt after the burst")
	assert.Equal(t, 1, m.Len())
	require.NoError(t, m.Put(ctx, 1, 0, msg{id: 1}, 1))
	require.NoError(t, <-waiter, "the waiter kept its queue through the rebuild")
}

// TestGetReduce: a waiting GetReduce posts its combine and unit, which the
// producer finds on the claimed post; posts made by GetInto carry none,
// and a recycled post forgets them.
func TestGetReduce(t *testing.T) {
	m := New[msg](2, 0, nil)
	ctx := context.Background()
	dst := make([]byte, 8)
	called := 0
	combine := func(d, s []byte) { called++ }
	type res struct {
		n      int
		direct bool
		err    error
	}
	rc := make(chan res, 1)
	go func() {
		_, n, direct, err := m.GetReduce(ctx, 1, 3, dst, 4, combine)
		rc <- res{n, direct, err}
	}()
	var p *Post[msg]
	require.Eventually(t, func() bool { p = m.Claim(1, 3); return p != nil }, 5*time.Second, time.Millisecond)
	require.NotNil(t, p.Combine)
	assert.Equal(t, 4, p.Unit)
	p.Combine(p.Dst, make([]byte, 8))
	m.Complete(p, msg{id: 1}, 8, nil)
	r := <-rc
	require.NoError(t, r.err)
	assert.True(t, r.direct)
	assert.Equal(t, 8, r.n)
	assert.Equal(t, 1, called)

	// The same post, recycled for a GetInto, has no combine.
	go func() {
		_, n, direct, err := m.GetInto(ctx, 1, 3, dst)
		rc <- res{n, direct, err}
	}()
	require.Eventually(t, func() bool { p = m.Claim(1, 3); return p != nil }, 5*time.Second, time.Millisecond)
	assert.Nil(t, p.Combine)
	assert.Zero(t, p.Unit)
	m.Complete(p, msg{id: 2}, 0, nil)
	require.NoError(t, (<-rc).err)
}

// testPoller delivers a message of source 1 under tag 7 on its after-th
// poll: through Claim and Complete if a receive is posted, else Put.
type testPoller struct {
	m           *Mailbox[msg]
	mu          sync.Mutex
	polls       int
	after       int
	begun, ends int
	delivered   bool
}

func (p *testPoller) Begin(src int) { p.mu.Lock(); p.begun++; p.mu.Unlock() }
func (p *testPoller) End(src int)   { p.mu.Lock(); p.ends++; p.mu.Unlock() }
func (p *testPoller) Poll(src int) bool {
	p.mu.Lock()
	p.polls++
	due := p.polls == p.after
	p.mu.Unlock()
	if !due || src != 1 {
		return false
	}
	if post := p.m.Claim(1, 7); post != nil {
		n := copy(post.Dst, "polled")
		p.m.Complete(post, msg{id: 42}, n, nil)
	} else if err := p.m.Put(context.Background(), 1, 7, msg{id: 42, data: []byte("polled")}, 6); err != nil {
		panic(err)
	}
	p.mu.Lock()
	p.delivered = true
	p.mu.Unlock()
	return true
}

// TestPoller: a waiting Get or GetInto polls the Poller, which delivers
// the message on the waiting goroutine (no other goroutine involved); a
// poller that delivers nothing lets the receive block once the spin budget
// is spent, and a context ending while it polls ends the receive. Begin
// and End pair up.
func TestPoller(t *testing.T) {
	ctx := context.Background()
	t.Run("Get", func(t *testing.T) {
		m := New[msg](2, 0, nil)
		p := &testPoller{m: m, after: 100}
		m.SetPoller(p, time.Second)
		got, err := m.Get(ctx, 1, 7)
		require.NoError(t, err)
		assert.Equal(t, 42, got.id)
		assert.Equal(t, 1, p.begun)
		assert.Equal(t, 1, p.ends)
	})
	t.Run("GetInto", func(t *testing.T) {
		m := New[msg](2, 0, nil)
		p := &testPoller{m: m, after: 100}
		m.SetPoller(p, time.Second)
		dst := make([]byte, 10)
		got, n, direct, err := m.GetInto(ctx, 1, 7, dst)
		require.NoError(t, err)
		assert.True(t, direct, "the poller filled the posted receive")
		assert.Equal(t, 42, got.id)
		assert.Equal(t, "polled", string(dst[:n]))
		assert.Equal(t, p.begun, p.ends)
	})
	t.Run("budget spent", func(t *testing.T) {
		m := New[msg](2, 0, nil)
		p := &testPoller{m: m, after: -1} // never delivers
		m.SetPoller(p, time.Millisecond)
		go func() {
			time.Sleep(50 * time.Millisecond)
			assert.NoError(t, m.Put(ctx, 1, 7, msg{id: 5}, 1))
		}()
		got, err := m.Get(ctx, 1, 7)
		require.NoError(t, err)
		assert.Equal(t, 5, got.id)
		p.mu.Lock()
		defer p.mu.Unlock()
		assert.Positive(t, p.polls)
		assert.Equal(t, p.begun, p.ends)
	})
	t.Run("context", func(t *testing.T) {
		m := New[msg](2, 0, nil)
		p := &testPoller{m: m, after: -1}
		m.SetPoller(p, time.Hour)
		cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		_, _, _, err := m.GetInto(cctx, 1, 7, make([]byte, 4))
		require.ErrorIs(t, err, context.DeadlineExceeded)
		p.mu.Lock()
		defer p.mu.Unlock()
		assert.Equal(t, p.begun, p.ends)
	})
}

// TestQuiet: a receive may bypass the mailbox only while nothing is queued
// or posted for its (source, tag), no other receive waits there, and
// neither the source nor the mailbox has ended.
func TestQuiet(t *testing.T) {
	m := New[msg](2, 0, nil)
	ctx := context.Background()
	assert.True(t, m.Quiet(1, 7), "empty")
	require.NoError(t, m.Put(ctx, 1, 7, msg{id: 1}, 1))
	assert.False(t, m.Quiet(1, 7), "a message is queued")
	assert.True(t, m.Quiet(1, 8), "other tags are independent")
	assert.True(t, m.Quiet(0, 7), "other sources are independent")
	_, err := m.Get(ctx, 1, 7)
	require.NoError(t, err)
	assert.True(t, m.Quiet(1, 7), "drained")

	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _, _, _ = m.GetInto(ctx, 1, 7, make([]byte, 8))
	}()
	require.Eventually(t, func() bool { return !m.Quiet(1, 7) }, 5*time.Second, time.Millisecond,
		"a posted receive waits")
	assert.True(t, m.Quiet(1, 8), "a receive waiting on another tag")
	assert.True(t, m.Quiet(1, 7+tagBuckets), "a receive waiting on another tag of the same bucket (checked under the lock)")
	require.NoError(t, m.Put(ctx, 1, 7, msg{id: 2}, 1))
	<-done
	assert.True(t, m.Quiet(1, 7))
	for i := range m.sources[1].tagGets {
		assert.Zero(t, m.sources[1].tagGets[i].Load(), "bucket %d", i)
	}

	m.CloseSource(1, errGone)
	assert.False(t, m.Quiet(1, 7), "the source ended")
	assert.False(t, m.Quiet(-1, 7), "no such source")
	assert.True(t, m.Quiet(0, 7))
	m.Fail(errGone)
	assert.False(t, m.Quiet(0, 7), "the mailbox failed")
}
