package transporttest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/internal/options"
)

// Maker starts the n connected transports of a job; element i has rank i.
// It may register cleanups on t; the suite closes the transports itself.
type Maker func(t *testing.T, n int) []transport.Transport

// LimitedMaker is a Maker whose transports queue at most queueLimit bytes
// per source before senders wait.
type LimitedMaker func(t *testing.T, n, queueLimit int) []transport.Transport

// Option configures Run. Run applies each option in turn and fails the
// test at the first that refuses its value (an error matching
// transport.ErrInvalidArgument); a nil Option is refused the same way.
type Option func(*suite) error

// WithLimited enables the back-pressure tests, which need transports with a
// small queue limit. Without it they are skipped. mk must not be nil.
func WithLimited(mk LimitedMaker) Option {
	return func(s *suite) error {
		if mk == nil {
			return fmt.Errorf("transporttest: %w: WithLimited(nil)", transport.ErrInvalidArgument)
		}
		s.limited = mk
		return nil
	}
}

// WithoutKill skips the crash tests even if the transports implement Killer.
func WithoutKill() Option {
	return func(s *suite) error {
		s.noKill = true
		return nil
	}
}

type suite struct {
	mk      Maker
	limited LimitedMaker
	noKill  bool
}

// newSuite applies opts, in order, to a suite of the transports mk makes.
func newSuite(mk Maker, opts []Option) (*suite, error) {
	if mk == nil {
		return nil, fmt.Errorf("transporttest: %w: nil Maker", transport.ErrInvalidArgument)
	}
	s := &suite{mk: mk}
	if err := options.Apply(s, opts, "transporttest", transport.ErrInvalidArgument); err != nil {
		return nil, err
	}
	return s, nil
}

// opTimeout bounds every blocking call the suite makes, so that a broken
// transport fails the test instead of hanging it.
const opTimeout = 30 * time.Second

// prompt is how long a call may take to notice a cancelled context or a
// closed peer.
const prompt = 5 * time.Second

// Run runs the conformance suite against the transports mk makes. Subtests
// run one after the other; each closes its transports and checks for leaked
// goroutines (go.uber.org/goleak) at the end.
func Run(t *testing.T, mk Maker, opts ...Option) {
	t.Helper()
	s, err := newSuite(mk, opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 2, 3, 4} {
		t.Run(fmt.Sprintf("AllPairs/n=%d", n), func(t *testing.T) { s.allPairs(t, n) })
	}
	t.Run("FIFO", s.fifo)
	t.Run("TagMatching", s.tagMatching)
	t.Run("Sizes", s.sizes)
	t.Run("SelfSend", s.selfSend)
	t.Run("ConcurrentSenders", s.concurrentSenders)
	t.Run("BothDirectionsLarge", s.bothDirectionsLarge)
	t.Run("ReleaseReuse", s.releaseReuse)
	t.Run("BackPressure", s.backPressure)
	t.Run("BackPressureCancel", s.backPressureCancel)
	t.Run("BackPressureManySenders", s.backPressureManySenders)
	t.Run("BackPressureWakeup", s.backPressureWakeup)
	t.Run("Cancel", s.cancel)
	t.Run("InvalidRank", s.invalidRank)
	t.Run("Close", s.close)
	t.Run("CloseUnblocksSend", s.closeUnblocksSend)
	t.Run("PeerClose", s.peerClose)
	t.Run("Kill", s.kill)
	t.Run("RecvInto", s.recvInto)
	t.Run("RecvIntoTooLong", s.recvIntoTooLong)
	t.Run("RecvIntoCancel", s.recvIntoCancel)
	t.Run("RecvIntoPeerClose", s.recvIntoPeerClose)
	t.Run("ManyTags", s.manyTags)
	t.Run("Backlog", s.backlog)
}

// backlog checks transport.Backlog, where implemented: messages that
// arrived and nobody received are listed at their receiver (from, tag,
// count, bytes) until they are received.
func (s *suite) backlog(t *testing.T) {
	ts := s.start(t, 2)
	b, ok := ts[0].(transport.Backlog)
	if !ok {
		t.Skip("transporttest: no transport.Backlog")
	}
	ctx := opCtx(t)
	for i, n := range []int{10, 70000} {
		require.NoError(t, ts[1].Send(ctx, 0, 5, transport.Header{}, payload(1, 0, 5, i, n)))
	}
	want := transport.Queued{From: 1, To: 0, Tag: 5, Messages: 2, Bytes: 70010}
	require.Eventually(t, func() bool {
		return slices.Contains(b.Queued(), want)
	}, prompt, time.Millisecond, "rank 0 lists the unreceived messages: %v", b.Queued())
	for i, n := range []int{10, 70000} {
		m, err := ts[0].Recv(ctx, 1, 5)
		require.NoError(t, err)
		require.NoError(t, checkPayload(m.Payload, 1, 0, 5, i, n))
	}
	for _, q := range b.Queued() {
		assert.False(t, q.To == 0 && q.Tag == 5, "received, yet listed: %v", q)
	}
}

// start makes n transports, closes them at the end of the test and then
// checks for goroutine leaks.
func (s *suite) start(t *testing.T, n int) []transport.Transport {
	t.Helper()
	return s.started(t, n, func() []transport.Transport { return s.mk(t, n) })
}

func (s *suite) startLimited(t *testing.T, n, limit int) []transport.Transport {
	t.Helper()
	if s.limited == nil {
		t.Skip("transporttest: no LimitedMaker (WithLimited); skipping back-pressure test")
	}
	return s.started(t, n, func() []transport.Transport { return s.limited(t, n, limit) })
}

func (s *suite) started(t *testing.T, n int, mk func() []transport.Transport) []transport.Transport {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // runs last
	ts := mk()
	require.Len(t, ts, n)
	t.Cleanup(func() { closeAll(t, ts) })
	for i, tr := range ts {
		require.Equal(t, i, tr.Rank())
		require.Equal(t, n, tr.WorldSize())
	}
	return ts
}

func closeAll(t *testing.T, ts []transport.Transport) {
	var wg sync.WaitGroup
	for _, tr := range ts {
		wg.Go(func() { assert.NoError(t, tr.Close()) })
	}
	wg.Wait()
}

func opCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	t.Cleanup(cancel)
	return ctx
}

// payload returns n deterministic bytes identifying (src, dst, tag, i).
func payload(src, dst int, tag uint32, i, n int) []byte {
	b := make([]byte, n)
	fill(b, src, dst, tag, i)
	return b
}

func fill(b []byte, src, dst int, tag uint32, i int) {
	x := uint64(src)<<48 ^ uint64(dst)<<40 ^ uint64(tag)<<8 ^ uint64(i)*0x9e3779b97f4a7c15
	for k := 0; k+8 <= len(b); k += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[k:], x)
	}
	for k := len(b) &^ 7; k < len(b); k++ {
		b[k] = byte(x>>(8*(k&7))) ^ byte(k)
	}
}

func checkPayload(got []byte, src, dst int, tag uint32, i, n int) error {
	if len(got) != n {
		return fmt.Errorf("message %d from %d to %d tag %d: %d bytes, want %d", i, src, dst, tag, len(got), n)
	}
	if want := payload(src, dst, tag, i, n); !bytes.Equal(got, want) {
		return fmt.Errorf("message %d from %d to %d tag %d: wrong content", i, src, dst, tag)
	}
	return nil
}

// group runs functions concurrently and collects their errors.
type group struct {
	wg   sync.WaitGroup
	mu   sync.Mutex
	errs []error
}

func (g *group) Go(f func() error) {
	g.wg.Go(func() {
		if err := f(); err != nil {
			g.mu.Lock()
			g.errs = append(g.errs, err)
			g.mu.Unlock()
		}
	})
}

func (g *group) Wait(t *testing.T) {
	t.Helper()
	g.wg.Wait()
	require.NoError(t, errors.Join(g.errs...))
}

// allPairs: every rank sends to every rank, itself included, and receives
// from every rank in order, with the header carried unchanged.
func (s *suite) allPairs(t *testing.T, n int) {
	ts := s.start(t, n)
	ctx := opCtx(t)
	const msgs = 20
	var g group
	for src := range ts {
		g.Go(func() error {
			for i := range msgs {
				for dst := range ts {
					meta := hdr(uint64(i), uint64(src)<<32|uint64(dst))
					if err := ts[src].Send(ctx, dst, 1, meta, payload(src, dst, 1, i, 100+i)); err != nil {
						return fmt.Errorf("send %d->%d #%d: %w", src, dst, i, err)
					}
				}
			}
			return nil
		})
		for dst := range ts {
			g.Go(func() error {
				for i := range msgs {
					m, err := ts[dst].Recv(ctx, src, 1)
					if err != nil {
						return fmt.Errorf("recv %d<-%d #%d: %w", dst, src, i, err)
					}
					if m.Header != (hdr(uint64(i), uint64(src)<<32|uint64(dst))) {
						return fmt.Errorf("recv %d<-%d #%d: meta %+v", dst, src, i, m.Header)
					}
					if err := checkPayload(m.Payload, src, dst, 1, i, 100+i); err != nil {
						return err
					}
					ts[dst].Release(m.Payload)
				}
				return nil
			})
		}
	}
	g.Wait(t)
}

// fifo: thousands of messages of varying sizes on two interleaved tags
// arrive in send order per tag.
func (s *suite) fifo(t *testing.T) {
	ts := s.start(t, 2)
	ctx := opCtx(t)
	const msgs = 2000
	size := func(i int) int { return (i * 37) % 1500 }
	var g group
	g.Go(func() error {
		for i := range msgs {
			tag := uint32(10 + i%2)
			if err := ts[0].Send(ctx, 1, tag, hdr(uint64(i), 0), payload(0, 1, tag, i, size(i))); err != nil {
				return err
			}
		}
		return nil
	})
	for tag := uint32(10); tag < 12; tag++ {
		g.Go(func() error {
			for i := int(tag - 10); i < msgs; i += 2 {
				m, err := ts[1].Recv(ctx, 0, tag)
				if err != nil {
					return err
				}
				if seqOf(m.Header) != uint64(i) {
					return fmt.Errorf("tag %d: got seq %d, want %d", tag, seqOf(m.Header), i)
				}
				if err := checkPayload(m.Payload, 0, 1, tag, i, size(i)); err != nil {
					return err
				}
				ts[1].Release(m.Payload)
			}
			return nil
		})
	}
	g.Wait(t)
}

// tagMatching: a receive on tag B is not blocked by queued tag-A messages,
// and a receive posted before its message arrives gets it.
func (s *suite) tagMatching(t *testing.T) {
	ts := s.start(t, 2)
	ctx := opCtx(t)
	pending := make(chan transport.Message, 1)
	perr := make(chan error, 1)
	go func() {
		m, err := ts[1].Recv(ctx, 0, 99)
		pending <- m
		perr <- err
	}()
	for i := range 3 {
		require.NoError(t, ts[0].Send(ctx, 1, 7, hdr(uint64(i), 0), []byte{'A', byte(i)}))
	}
	require.NoError(t, ts[0].Send(ctx, 1, 8, hdr(100, 0), []byte("B")))
	require.NoError(t, ts[0].Send(ctx, 1, 99, hdr(200, 0), []byte("late")))

	m, err := ts[1].Recv(ctx, 0, 8)
	require.NoError(t, err)
	assert.Equal(t, []byte("B"), m.Payload)
	require.NoError(t, <-perr)
	assert.Equal(t, []byte("late"), (<-pending).Payload)
	for i := range 3 {
		m, err := ts[1].Recv(ctx, 0, 7)
		require.NoError(t, err)
		assert.Equal(t, []byte{'A', byte(i)}, m.Payload)
		assert.Equal(t, uint64(i), seqOf(m.Header))
	}
	// The same tag from another source is another queue.
	require.NoError(t, ts[1].Send(ctx, 1, 7, transport.Header{}, []byte("self")))
	m, err = ts[1].Recv(ctx, 1, 7)
	require.NoError(t, err)
	assert.Equal(t, []byte("self"), m.Payload)
}

// sizes: empty, small, around the usual buffer boundaries and large
// payloads arrive intact with their header, including extreme header values
// and tags.
func (s *suite) sizes(t *testing.T) {
	ts := s.start(t, 2)
	ctx := opCtx(t)
	sizes := []int{0, 1, 7, 8, 40, 63, 64, 4095, 4096, 4097, 8191, 8192, 8193, 65495, 65535, 65536, 65537, 1 << 20, 8<<20 + 3}
	tags := []uint32{0, 1, 0xFFF00000, math.MaxUint32} // any tag: the transport gives them no meaning
	var g group
	g.Go(func() error {
		for i, n := range sizes {
			tag := tags[i%len(tags)]
			meta := hdr(math.MaxUint64-uint64(i), 1<<(i%64))
			if err := ts[0].Send(ctx, 1, tag, meta, payload(0, 1, tag, i, n)); err != nil {
				return fmt.Errorf("send %d bytes: %w", n, err)
			}
		}
		return nil
	})
	for i, n := range sizes {
		tag := tags[i%len(tags)]
		m, err := ts[1].Recv(ctx, 0, tag)
		require.NoError(t, err, "%d bytes", n)
		require.NoError(t, checkPayload(m.Payload, 0, 1, tag, i, n))
		assert.Equal(t, hdr(math.MaxUint64-uint64(i), 1<<(i%64)), m.Header)
		ts[1].Release(m.Payload)
	}
	g.Wait(t)
}

// selfSend: a rank sends to itself, alone and in a larger job, and the
// sender may reuse its buffer at once.
func (s *suite) selfSend(t *testing.T) {
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			ts := s.start(t, n)
			ctx := opCtx(t)
			me := ts[n-1]
			buf := make([]byte, 1000)
			for i := range 10 {
				fill(buf, n-1, n-1, 3, i)
				require.NoError(t, me.Send(ctx, n-1, 3, hdr(uint64(i), 0), buf))
				clear(buf) // the transport must not have kept it
			}
			for i := range 10 {
				m, err := me.Recv(ctx, n-1, 3)
				require.NoError(t, err)
				require.NoError(t, checkPayload(m.Payload, n-1, n-1, 3, i, 1000))
				assert.Equal(t, uint64(i), seqOf(m.Header))
			}
		})
	}
}

// concurrentSenders: on every rank, several goroutines send to every rank on
// their own tags at once; per (source, tag) order holds.
func (s *suite) concurrentSenders(t *testing.T) {
	const n, perDst, msgs = 4, 3, 40
	ts := s.start(t, n)
	ctx := opCtx(t)
	var g group
	for src := range n {
		for dst := range n {
			for k := range perDst {
				tag := uint32(100 + k)
				g.Go(func() error {
					for i := range msgs {
						if err := ts[src].Send(ctx, dst, tag, hdr(uint64(i), 0), payload(src, dst, tag, i, 1+i*50)); err != nil {
							return fmt.Errorf("send %d->%d tag %d: %w", src, dst, tag, err)
						}
					}
					return nil
				})
				g.Go(func() error {
					for i := range msgs {
						m, err := ts[dst].Recv(ctx, src, tag)
						if err != nil {
							return fmt.Errorf("recv %d<-%d tag %d: %w", dst, src, tag, err)
						}
						if seqOf(m.Header) != uint64(i) {
							return fmt.Errorf("recv %d<-%d tag %d: seq %d, want %d", dst, src, tag, seqOf(m.Header), i)
						}
						if err := checkPayload(m.Payload, src, dst, tag, i, 1+i*50); err != nil {
							return err
						}
						ts[dst].Release(m.Payload)
					}
					return nil
				})
			}
		}
	}
	g.Wait(t)
}

// bothDirectionsLarge: two ranks send large messages to each other at the
// same time before either receives; nothing deadlocks.
func (s *suite) bothDirectionsLarge(t *testing.T) {
	ts := s.start(t, 2)
	ctx := opCtx(t)
	const msgs, size = 3, 8 << 20
	var g group
	for me := range 2 {
		other := 1 - me
		g.Go(func() error {
			for i := range msgs {
				if err := ts[me].Send(ctx, other, 5, transport.Header{}, payload(me, other, 5, i, size)); err != nil {
					return err
				}
			}
			for i := range msgs {
				m, err := ts[me].Recv(ctx, other, 5)
				if err != nil {
					return err
				}
				if err := checkPayload(m.Payload, other, me, 5, i, size); err != nil {
					return err
				}
				ts[me].Release(m.Payload)
			}
			return nil
		})
	}
	g.Wait(t)
}

// releaseReuse: payloads handed back with Release are reused without
// corrupting later messages.
func (s *suite) releaseReuse(t *testing.T) {
	ts := s.start(t, 2)
	ctx := opCtx(t)
	for i := range 200 {
		n := 1000 + (i%3)*30000
		require.NoError(t, ts[0].Send(ctx, 1, 2, transport.Header{}, payload(0, 1, 2, i, n)))
		m, err := ts[1].Recv(ctx, 0, 2)
		require.NoError(t, err)
		require.NoError(t, checkPayload(m.Payload, 0, 1, 2, i, n))
		ts[1].Release(m.Payload)
	}
}

// backPressure: with a small queue limit, a sender whose receiver does not
// receive stops after about a limit's worth, and nothing is dropped; a
// single message larger than the limit still passes.
func (s *suite) backPressure(t *testing.T) {
	const limit, size, msgs = 64 << 10, 16 << 10, 40
	ts := s.startLimited(t, 2, limit)
	ctx := opCtx(t)
	var sent atomic.Int64
	var g group
	g.Go(func() error {
		for i := range msgs {
			if err := ts[0].Send(ctx, 1, 4, hdr(uint64(i), 0), payload(0, 1, 4, i, size)); err != nil {
				return err
			}
			sent.Add(1)
		}
		return nil
	})
	time.Sleep(200 * time.Millisecond)
	got := sent.Load()
	assert.Less(t, got, int64(msgs), "the sender never waited")
	assert.LessOrEqual(t, got, int64(limit/size+1), "the sender got far beyond the queue limit")
	for i := range msgs {
		m, err := ts[1].Recv(ctx, 0, 4)
		require.NoError(t, err)
		assert.Equal(t, uint64(i), seqOf(m.Header))
		require.NoError(t, checkPayload(m.Payload, 0, 1, 4, i, size))
		ts[1].Release(m.Payload)
	}
	g.Wait(t)

	big := payload(0, 1, 6, 0, 4*limit)
	require.NoError(t, ts[0].Send(ctx, 1, 6, transport.Header{}, big))
	m, err := ts[1].Recv(ctx, 0, 6)
	require.NoError(t, err)
	require.NoError(t, checkPayload(m.Payload, 0, 1, 6, 0, 4*limit))
}

// backPressureCancel: a send waiting for queue space gives up when its
// context ends, the message it carried is not delivered, and the link goes
// on working.
func (s *suite) backPressureCancel(t *testing.T) {
	const limit, size = 64 << 10, 16 << 10
	ts := s.startLimited(t, 2, limit)
	ctx := opCtx(t)
	const fill = limit / size
	for i := range fill {
		require.NoError(t, ts[0].Send(ctx, 1, 4, hdr(uint64(i), 0), payload(0, 1, 4, i, size)))
	}
	dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := ts[0].Send(dctx, 1, 4, hdr(999, 0), payload(0, 1, 4, 999, size))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), prompt)

	cctx, cancel2 := context.WithCancel(ctx)
	go func() { time.Sleep(50 * time.Millisecond); cancel2() }()
	err = ts[0].Send(cctx, 1, 4, hdr(998, 0), payload(0, 1, 4, 998, size))
	require.ErrorIs(t, err, context.Canceled)

	for i := range fill {
		m, err := ts[1].Recv(ctx, 0, 4)
		require.NoError(t, err)
		require.Equal(t, uint64(i), seqOf(m.Header))
		ts[1].Release(m.Payload)
	}
	require.NoError(t, ts[0].Send(ctx, 1, 4, hdr(1000, 0), []byte("after")))
	m, err := ts[1].Recv(ctx, 0, 4)
	require.NoError(t, err)
	assert.Equal(t, uint64(1000), seqOf(m.Header), "a send that gave up must not deliver its message")
}

// backPressureManySenders: several goroutines of one rank blocked on a full
// queue, on different tags and with different sizes, all get through while
// the receiver drains every tag.
func (s *suite) backPressureManySenders(t *testing.T) {
	const limit = 32 << 10
	ts := s.startLimited(t, 2, limit)
	ctx := opCtx(t)
	var g group
	sizes := []int{30 << 10, 1 << 10, 20 << 10, 100, 64 << 10}
	for k, n := range sizes {
		tag := uint32(20 + k)
		g.Go(func() error {
			for i := range 10 {
				if err := ts[0].Send(ctx, 1, tag, hdr(uint64(i), 0), payload(0, 1, tag, i, n)); err != nil {
					return err
				}
			}
			return nil
		})
		g.Go(func() error {
			time.Sleep(50 * time.Millisecond)
			for i := range 10 {
				m, err := ts[1].Recv(ctx, 0, tag)
				if err != nil {
					return fmt.Errorf("tag %d #%d: %w", tag, i, err)
				}
				if err := checkPayload(m.Payload, 0, 1, tag, i, n); err != nil {
					return err
				}
				ts[1].Release(m.Payload)
			}
			return nil
		})
	}
	g.Wait(t)
}

// backPressureWakeup: when queue space frees up, a waiting send that now
// fits goes through even though another waiting send still does not — the
// receiver may be waiting for exactly that message.
func (s *suite) backPressureWakeup(t *testing.T) {
	const limit = 32 << 10
	ts := s.startLimited(t, 2, limit)
	ctx := opCtx(t)
	for round := range 5 {
		require.NoError(t, ts[0].Send(ctx, 1, 1, transport.Header{}, make([]byte, 20<<10)))
		require.NoError(t, ts[0].Send(ctx, 1, 1, transport.Header{}, make([]byte, 10<<10)))
		var g group
		g.Go(func() error { return ts[0].Send(ctx, 1, 2, transport.Header{}, make([]byte, 30<<10)) }) // waits for an empty queue
		g.Go(func() error { return ts[0].Send(ctx, 1, 3, transport.Header{}, make([]byte, 10<<10)) }) // fits once 20 KiB are taken
		time.Sleep(30 * time.Millisecond)
		m, err := ts[1].Recv(ctx, 0, 1)
		require.NoError(t, err)
		require.Len(t, m.Payload, 20<<10)
		m, err = ts[1].Recv(ctx, 0, 3)
		require.NoError(t, err, "round %d: the send that fits was not woken", round)
		require.Len(t, m.Payload, 10<<10)
		m, err = ts[1].Recv(ctx, 0, 1)
		require.NoError(t, err)
		m, err = ts[1].Recv(ctx, 0, 2)
		require.NoError(t, err)
		require.Len(t, m.Payload, 30<<10)
		g.Wait(t)
	}
}

// cancel: Recv and Send return promptly with the context's error when it is
// already done, when its deadline passes, or when it is cancelled while
// they wait; a send that did not happen delivers nothing.
func (s *suite) cancel(t *testing.T) {
	ts := s.start(t, 2)
	ctx := opCtx(t)

	done, cancel := context.WithCancel(ctx)
	cancel()
	_, err := ts[1].Recv(done, 0, 1)
	require.ErrorIs(t, err, context.Canceled)
	err = ts[0].Send(done, 1, 1, hdr(1, 0), []byte("no"))
	require.ErrorIs(t, err, context.Canceled)
	err = ts[0].Send(done, 0, 1, hdr(1, 0), []byte("no"))
	require.ErrorIs(t, err, context.Canceled)

	dl, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = ts[1].Recv(dl, 0, 1)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), prompt)

	past, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	_, err = ts[1].Recv(past, 0, 1)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	err = ts[0].Send(past, 1, 1, hdr(2, 0), []byte("no"))
	require.ErrorIs(t, err, context.DeadlineExceeded)

	wait, cancel := context.WithCancel(ctx)
	go func() { time.Sleep(50 * time.Millisecond); cancel() }()
	start = time.Now()
	_, err = ts[1].Recv(wait, 0, 1)
	require.ErrorIs(t, err, context.Canceled)
	assert.Less(t, time.Since(start), prompt)

	require.NoError(t, ts[0].Send(ctx, 1, 1, hdr(3, 0), []byte("yes")))
	m, err := ts[1].Recv(ctx, 0, 1)
	require.NoError(t, err)
	assert.Equal(t, uint64(3), seqOf(m.Header), "cancelled sends must not be delivered")
	require.NoError(t, ts[0].Send(ctx, 0, 1, hdr(4, 0), []byte("yes")))
	m, err = ts[0].Recv(ctx, 0, 1)
	require.NoError(t, err)
	assert.Equal(t, uint64(4), seqOf(m.Header), "cancelled self-sends must not be delivered")
}

func (s *suite) invalidRank(t *testing.T) {
	ts := s.start(t, 2)
	ctx := opCtx(t)
	for _, r := range []int{-1, 2, 1 << 20} {
		require.ErrorIs(t, ts[0].Send(ctx, r, 1, transport.Header{}, []byte("x")), transport.ErrInvalidRank)
		_, err := ts[0].Recv(ctx, r, 1)
		require.ErrorIs(t, err, transport.ErrInvalidRank)
	}
}

// close: Close is idempotent; it fails pending calls and every later call
// with ErrClosed.
func (s *suite) close(t *testing.T) {
	ts := s.start(t, 2)
	ctx := opCtx(t)
	require.NoError(t, ts[0].Send(ctx, 0, 1, transport.Header{}, []byte("queued")))
	pending := make(chan error, 2)
	go func() { _, err := ts[0].Recv(ctx, 1, 1); pending <- err }()
	go func() { _, err := ts[0].Recv(ctx, 0, 2); pending <- err }()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, ts[0].Close())
	require.NoError(t, ts[0].Close())
	for range 2 {
		select {
		case err := <-pending:
			require.ErrorIs(t, err, transport.ErrClosed)
		case <-time.After(prompt):
			t.Fatal("a pending Recv did not return after Close")
		}
	}
	require.ErrorIs(t, ts[0].Send(ctx, 1, 1, transport.Header{}, []byte("x")), transport.ErrClosed)
	require.ErrorIs(t, ts[0].Send(ctx, 0, 1, transport.Header{}, []byte("x")), transport.ErrClosed)
	_, err := ts[0].Recv(ctx, 1, 1)
	require.ErrorIs(t, err, transport.ErrClosed)
	_, err = ts[0].Recv(ctx, 0, 1)
	require.ErrorIs(t, err, transport.ErrClosed)
	assert.Equal(t, 0, ts[0].Rank())
	assert.Equal(t, 2, ts[0].WorldSize())
}

// closeUnblocksSend: a send waiting for queue space returns when its own
// transport closes.
func (s *suite) closeUnblocksSend(t *testing.T) {
	const limit = 16 << 10
	ts := s.startLimited(t, 2, limit)
	ctx := opCtx(t)
	require.NoError(t, ts[0].Send(ctx, 1, 1, transport.Header{}, make([]byte, limit)))
	errc := make(chan error, 1)
	go func() { errc <- ts[0].Send(ctx, 1, 1, transport.Header{}, make([]byte, limit)) }()
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, ts[0].Close())
	select {
	case err := <-errc:
		require.ErrorIs(t, err, transport.ErrClosed)
	case <-time.After(prompt):
		t.Fatal("a blocked Send did not return after Close")
	}
}

// peerClose: when a peer closes, what it sent is still delivered, then
// receives from it (pending or later) get a *PeerError wrapping
// ErrPeerClosed and sends to it fail the same way; other peers are not
// affected.
func (s *suite) peerClose(t *testing.T) {
	ts := s.start(t, 3)
	ctx := opCtx(t)
	pending := make(chan error, 1)
	go func() { _, err := ts[0].Recv(ctx, 1, 30); pending <- err }()
	for i := range 3 {
		require.NoError(t, ts[1].Send(ctx, 0, 31, hdr(uint64(i), 0), []byte{byte(i)}))
	}
	require.NoError(t, ts[1].Send(ctx, 0, 32, transport.Header{}, []byte("other tag")))
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, ts[1].Close())

	select {
	case err := <-pending:
		requirePeerErr(t, err, 1, transport.ErrPeerClosed)
	case <-time.After(prompt):
		t.Fatal("a pending Recv from a closed peer did not return")
	}
	for i := range 3 {
		m, err := ts[0].Recv(ctx, 1, 31)
		require.NoError(t, err, "queued message %d must be delivered", i)
		assert.Equal(t, []byte{byte(i)}, m.Payload)
	}
	_, err := ts[0].Recv(ctx, 1, 31)
	requirePeerErr(t, err, 1, transport.ErrPeerClosed)
	m, err := ts[0].Recv(ctx, 1, 32)
	require.NoError(t, err)
	assert.Equal(t, []byte("other tag"), m.Payload)
	_, err = ts[0].Recv(ctx, 1, 32)
	requirePeerErr(t, err, 1, transport.ErrPeerClosed)
	requirePeerErr(t, ts[0].Send(ctx, 1, 31, transport.Header{}, []byte("x")), 1, transport.ErrPeerClosed)

	// Ranks 0 and 2 carry on.
	require.NoError(t, ts[2].Send(ctx, 0, 1, transport.Header{}, []byte("still here")))
	m, err = ts[0].Recv(ctx, 2, 1)
	require.NoError(t, err)
	assert.Equal(t, []byte("still here"), m.Payload)
	require.NoError(t, ts[0].Send(ctx, 2, 1, transport.Header{}, []byte("me too")))
	m, err = ts[2].Recv(ctx, 0, 1)
	require.NoError(t, err)
	assert.Equal(t, []byte("me too"), m.Payload)
}

// kill: when a rank crashes (Killer), pending and later calls involving it
// on the other ranks fail with a *PeerError naming it and wrapping
// ErrPeerLost; calls between the survivors keep working, so the layer above
// can tell them why it stops.
func (s *suite) kill(t *testing.T) {
	if s.noKill {
		t.Skip("transporttest: crash tests disabled (WithoutKill)")
	}
	ts := s.start(t, 3)
	k, ok := ts[2].(Killer)
	if !ok {
		t.Skip("transporttest: transport does not implement Killer")
	}
	ctx := opCtx(t)
	pending := make(chan error, 2)
	go func() { _, err := ts[0].Recv(ctx, 2, 1); pending <- err }()
	go func() { _, _, err := ts[1].RecvInto(ctx, 2, 1, make([]byte, 8)); pending <- err }()
	survivor := make(chan error, 1)
	go func() {
		m, err := ts[0].Recv(ctx, 1, 1)
		if err == nil && string(m.Payload) != "alive" {
			err = fmt.Errorf("got %q", m.Payload)
		}
		survivor <- err
	}()
	time.Sleep(20 * time.Millisecond)
	k.Kill()
	for range 2 {
		select {
		case err := <-pending:
			requirePeerErr(t, err, 2, transport.ErrPeerLost)
		case <-time.After(prompt):
			t.Fatal("a pending Recv did not fail after a peer crashed")
		}
	}
	_, err := ts[0].Recv(ctx, 2, 2)
	requirePeerErr(t, err, 2, transport.ErrPeerLost)
	_, _, err = ts[0].RecvInto(ctx, 2, 2, nil)
	requirePeerErr(t, err, 2, transport.ErrPeerLost)
	// A send to the lost peer fails, promptly if not at once (a TCP write
	// may still land in the socket buffer before the break is seen).
	deadline := time.Now().Add(prompt)
	for {
		err := ts[1].Send(ctx, 2, 1, transport.Header{}, []byte("x"))
		if err != nil {
			requirePeerErr(t, err, 2, transport.ErrPeerLost)
			break
		}
		require.True(t, time.Now().Before(deadline), "sends to a crashed peer keep succeeding")
		time.Sleep(10 * time.Millisecond)
	}
	require.ErrorIs(t, ts[2].Send(ctx, 0, 1, transport.Header{}, []byte("x")), transport.ErrClosed)

	// The survivors carry on, both ways, on any tag.
	require.NoError(t, ts[1].Send(ctx, 0, 1, transport.Header{}, []byte("alive")))
	select {
	case err := <-survivor:
		require.NoError(t, err)
	case <-time.After(prompt):
		t.Fatal("a Recv between survivors did not complete")
	}
	require.NoError(t, ts[0].Send(ctx, 1, 0xFFFFFFFF, hdr(7, 9), []byte("too")))
	buf := make([]byte, 16)
	h, n, err := ts[1].RecvInto(ctx, 0, 0xFFFFFFFF, buf)
	require.NoError(t, err)
	assert.Equal(t, "too", string(buf[:n]))
	assert.Equal(t, hdr(7, 9), h)
}

// recvInto: RecvInto delivers in order with the Recvs on the same
// (source, tag), whether the message was queued before it or arrives while
// it waits, for sizes from empty to large; the header travels unchanged.
func (s *suite) recvInto(t *testing.T) {
	ts := s.start(t, 2)
	ctx := opCtx(t)
	sizes := []int{0, 1, 63, 4096, 4097, 8192, 65537, 1 << 20, 8<<20 + 3}
	for _, self := range []bool{false, true} {
		to, from := 1, 0
		if self {
			to = 0
		}
		for i, n := range sizes {
			tag := uint32(40 + i)
			// Queued first, then received into a buffer larger than needed.
			require.NoError(t, ts[from].Send(ctx, to, tag, hdr(uint64(i), uint64(n)), payload(from, to, tag, i, n)))
			dst := make([]byte, n+5)
			for j := range dst {
				dst[j] = 0xAA
			}
			h, got, err := ts[to].RecvInto(ctx, from, tag, dst)
			require.NoError(t, err, "%d bytes queued", n)
			require.Equal(t, n, got)
			require.NoError(t, checkPayload(dst[:got], from, to, tag, i, n))
			assert.Equal(t, bytes.Repeat([]byte{0xAA}, 5), dst[n:], "bytes past n untouched")
			assert.Equal(t, hdr(uint64(i), uint64(n)), h)

			// Posted first: the receive waits, the message arrives.
			res := make(chan error, 1)
			dst = make([]byte, n)
			go func() {
				h, got, err := ts[to].RecvInto(ctx, from, tag, dst)
				if err == nil && (got != n || h != hdr(uint64(i+1), 3)) {
					err = fmt.Errorf("got %d bytes, header %v", got, h)
				}
				if err == nil {
					err = checkPayload(dst[:got], from, to, tag, i+1, n)
				}
				res <- err
			}()
			time.Sleep(5 * time.Millisecond)
			require.NoError(t, ts[from].Send(ctx, to, tag, hdr(uint64(i+1), 3), payload(from, to, tag, i+1, n)))
			require.NoError(t, <-res, "%d bytes posted", n)
		}
	}

	// Mixed with Recv on one (source, tag): one order.
	const k = 200
	var g group
	g.Go(func() error {
		for i := range k {
			if err := ts[0].Send(ctx, 1, 9, hdr(uint64(i), 0), payload(0, 1, 9, i, 1+i*97)); err != nil {
				return err
			}
		}
		return nil
	})
	buf := make([]byte, 1+k*97)
	for i := range k {
		if i%3 == 0 {
			m, err := ts[1].Recv(ctx, 0, 9)
			require.NoError(t, err)
			require.Equal(t, uint64(i), seqOf(m.Header))
			require.NoError(t, checkPayload(m.Payload, 0, 1, 9, i, 1+i*97))
			ts[1].Release(m.Payload)
			continue
		}
		h, n, err := ts[1].RecvInto(ctx, 0, 9, buf)
		require.NoError(t, err)
		require.Equal(t, uint64(i), seqOf(h))
		require.NoError(t, checkPayload(buf[:n], 0, 1, 9, i, 1+i*97))
	}
	g.Wait(t)
}

// recvIntoTooLong: a message longer than dst is consumed and reported with
// ErrMessageTooLong and its length, dst unchanged; the next message on the
// same (source, tag) is delivered normally. Both when it was queued and
// when the receive was waiting for it.
func (s *suite) recvIntoTooLong(t *testing.T) {
	ts := s.start(t, 2)
	ctx := opCtx(t)
	for _, n := range []int{10, 100 << 10} {
		dst := bytes.Repeat([]byte{0x55}, 8)
		require.NoError(t, ts[0].Send(ctx, 1, 3, hdr(1, 0), payload(0, 1, 3, 1, n)))
		require.NoError(t, ts[0].Send(ctx, 1, 3, hdr(2, 0), []byte("ok")))
		h, got, err := ts[1].RecvInto(ctx, 0, 3, dst)
		require.ErrorIs(t, err, transport.ErrMessageTooLong)
		assert.Equal(t, n, got)
		assert.Equal(t, hdr(1, 0), h)
		assert.Equal(t, bytes.Repeat([]byte{0x55}, 8), dst, "dst unchanged")
		h, got, err = ts[1].RecvInto(ctx, 0, 3, dst)
		require.NoError(t, err)
		assert.Equal(t, "ok", string(dst[:got]))
		assert.Equal(t, hdr(2, 0), h)

		res := make(chan error, 1)
		dst2 := bytes.Repeat([]byte{0x55}, 8)
		go func() {
			_, got, err := ts[1].RecvInto(ctx, 0, 4, dst2)
			if !errors.Is(err, transport.ErrMessageTooLong) || got != n {
				err = fmt.Errorf("got %d, %v; want %d bytes and ErrMessageTooLong", got, err, n)
			} else {
				err = nil
			}
			res <- err
		}()
		time.Sleep(5 * time.Millisecond)
		require.NoError(t, ts[0].Send(ctx, 1, 4, transport.Header{}, payload(0, 1, 4, 1, n)))
		require.NoError(t, <-res)
		assert.Equal(t, bytes.Repeat([]byte{0x55}, 8), dst2, "dst unchanged")
		require.NoError(t, ts[0].Send(ctx, 1, 4, transport.Header{}, []byte("next")))
		_, got, err = ts[1].RecvInto(ctx, 0, 4, dst2)
		require.NoError(t, err)
		assert.Equal(t, "next", string(dst2[:got]))
	}
}

// recvIntoCancel: a waiting RecvInto returns promptly when its context
// ends or the transport closes, and a later message is not lost to it.
func (s *suite) recvIntoCancel(t *testing.T) {
	ts := s.start(t, 2)
	ctx := opCtx(t)
	cctx, cancel := context.WithCancel(ctx)
	res := make(chan error, 1)
	dst := make([]byte, 16)
	go func() { _, _, err := ts[1].RecvInto(cctx, 0, 5, dst); res <- err }()
	time.Sleep(20 * time.Millisecond)
	cancel()
	select {
	case err := <-res:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(prompt):
		t.Fatal("RecvInto did not return after its context was cancelled")
	}
	require.NoError(t, ts[0].Send(ctx, 1, 5, transport.Header{}, []byte("later")))
	m, err := ts[1].Recv(ctx, 0, 5)
	require.NoError(t, err)
	assert.Equal(t, "later", string(m.Payload), "the cancelled receive must not take the next message")
	past, cancel2 := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel2()
	_, _, err = ts[1].RecvInto(past, 0, 5, dst)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	go func() { _, _, err := ts[1].RecvInto(ctx, 0, 6, dst); res <- err }()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, ts[1].Close())
	select {
	case err := <-res:
		require.ErrorIs(t, err, transport.ErrClosed)
	case <-time.After(prompt):
		t.Fatal("RecvInto did not return after Close")
	}
	_, _, err = ts[1].RecvInto(ctx, 0, 6, dst)
	require.ErrorIs(t, err, transport.ErrClosed)
}

// recvIntoPeerClose: RecvInto from a peer that closed delivers what it sent,
// then fails with a *PeerError wrapping ErrPeerClosed.
func (s *suite) recvIntoPeerClose(t *testing.T) {
	ts := s.start(t, 2)
	ctx := opCtx(t)
	res := make(chan error, 1)
	go func() { _, _, err := ts[0].RecvInto(ctx, 1, 8, make([]byte, 4)); res <- err }()
	require.NoError(t, ts[1].Send(ctx, 0, 7, transport.Header{}, []byte("last")))
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, ts[1].Close())
	select {
	case err := <-res:
		requirePeerErr(t, err, 1, transport.ErrPeerClosed)
	case <-time.After(prompt):
		t.Fatal("a pending RecvInto from a closed peer did not return")
	}
	dst := make([]byte, 4)
	_, n, err := ts[0].RecvInto(ctx, 1, 7, dst)
	require.NoError(t, err)
	assert.Equal(t, "last", string(dst[:n]))
	_, _, err = ts[0].RecvInto(ctx, 1, 7, dst)
	requirePeerErr(t, err, 1, transport.ErrPeerClosed)
}

// manyTags: messages on many distinct tags, each used once, leave no
// per-tag state behind: the heap does not grow with the number of tags.
func (s *suite) manyTags(t *testing.T) {
	ts := s.start(t, 2)
	ctx := opCtx(t)
	const tags = 10_000 // 253 B per tag before queues went away: 2.5 MB
	buf := make([]byte, 8)
	run := func(lo, hi uint32) {
		for tag := lo; tag < hi; tag++ {
			if err := ts[0].Send(ctx, 1, tag, transport.Header{}, buf); err != nil {
				t.Fatal(err)
			}
			if tag%2 == 0 {
				m, err := ts[1].Recv(ctx, 0, tag)
				if err != nil {
					t.Fatal(err)
				}
				ts[1].Release(m.Payload)
			} else if _, _, err := ts[1].RecvInto(ctx, 0, tag, buf); err != nil {
				t.Fatal(err)
			}
		}
	}
	run(0, 1000) // warm up pools
	before := HeapInUse()
	run(1000, 1000+tags)
	growth := HeapInUse() - before
	t.Logf("%d distinct tags: heap growth %d bytes", tags, growth)
	assert.Less(t, growth, int64(1<<20), "heap grew with the number of distinct tags")
}

// HeapInUse returns the live heap after a garbage collection, in bytes.
func HeapInUse() int64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// hdr is a header holding two little-endian integers, as dist's is.
func hdr(seq, fp uint64) transport.Header {
	var h transport.Header
	binary.LittleEndian.PutUint64(h[:8], seq)
	binary.LittleEndian.PutUint64(h[8:], fp)
	return h
}

func seqOf(h transport.Header) uint64 { return binary.LittleEndian.Uint64(h[:8]) }

func requirePeerErr(t *testing.T, err error, rank int, cause error) {
	t.Helper()
	var pe *transport.PeerError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, rank, pe.Rank)
	require.ErrorIs(t, err, cause)
}
