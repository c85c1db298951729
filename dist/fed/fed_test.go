package fed_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/fed"
	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/hybrid"
	"github.com/gdist/gdist/dist/transport/transporttest"
	"github.com/gdist/gdist/internal/certs"
)

var testToken = []byte("fed-test-token-0123456789abcdef0")

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// logBuffer collects log lines from several goroutines.
type logBuffer struct{ transporttest.LogBuffer }

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// fast are the options of every side in these tests: the token, quick
// heartbeats, no shared memory unless a test asks.
func fast() []fed.Option {
	return []fed.Option{fed.WithToken(testToken), fed.WithLogger(quiet()),
		fed.WithHeartbeat(0, 600*time.Millisecond), fed.WithHybrid(hybrid.WithMode(hybrid.TCP))}
}

// federation is a leader and its clients in this process.
type federation struct {
	t       *testing.T
	leader  *fed.Leader
	clients []*fed.Client // by rank; [0] is nil
	addr    string
	world   int
}

// start leads a federation of world ranks around init and joins every
// client, each with fast() and its own options.
func start(t *testing.T, world int, init []float32, lopts []fed.Option, copts func(rank int) []fed.Option) *federation {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := &federation{t: t, clients: make([]*fed.Client, world), world: world}
	var err error
	f.leader, err = fed.Lead(ctx, "127.0.0.1:0", world, init, append(fast(), lopts...)...)
	require.NoError(t, err, "lead")
	t.Cleanup(f.close)
	addr := f.leader.Addr().String()
	f.addr = addr
	var wg sync.WaitGroup
	errs := make([]error, world)
	for r := 1; r < world; r++ {
		wg.Go(func() {
			o := fast()
			if copts != nil {
				o = append(o, copts(r)...)
			}
			f.clients[r], errs[r] = fed.Join(ctx, addr, r, world, o...)
		})
	}
	wg.Wait()
	for r := 1; r < world; r++ {
		require.NoError(t, errs[r], "join rank %d", r)
	}
	require.NoError(t, f.leader.Await(ctx))
	assert.Len(t, f.leader.Members(), world-1)
	return f
}

func (f *federation) close() {
	for _, c := range f.clients {
		if c != nil {
			c.Close()
		}
	}
	if f.leader != nil {
		f.leader.Close()
	}
}

// trainer is a client's loop in these tests: each task's weights come from
// weights(rank, round, model), reported with samples(rank) samples.
type trainer struct {
	weights func(rank, round int, model []float32) []float32
	samples func(rank int) int
	before  func(rank, round int) // called before reporting (to be late, ...)
	after   func(rank, round int) // called after reporting
}

// serve runs tr on client c until its Next fails; the error is returned on
// the channel (nil for ErrFinished).
func serve(c *fed.Client, tr trainer) <-chan error {
	out := make(chan error, 1)
	go func() {
		for {
			task, err := c.Next(context.Background())
			if errors.Is(err, fed.ErrFinished) {
				out <- nil
				return
			}
			if err != nil {
				out <- err
				return
			}
			if tr.before != nil {
				tr.before(c.Rank(), task.Round)
			}
			if err := c.Report(context.Background(), task, tr.weights(c.Rank(), task.Round, task.Model), tr.samples(c.Rank())); err != nil {
				out <- err
				return
			}
			if tr.after != nil {
				tr.after(c.Rank(), task.Round)
			}
		}
	}()
	return out
}

// fedavg is the expected FedAvg step: model + Σ n_k·(w_k - model)/Σ n_k,
// with the updates in float32 as the clients compute them.
func fedavg(model []float32, ws [][]float32, ns []int) []float32 {
	out := slices.Clone(model)
	var total float64
	for _, n := range ns {
		total += float64(n)
	}
	for i := range model {
		var s float64
		for k, w := range ws {
			s += float64(ns[k]) * float64(w[i]-model[i])
		}
		out[i] = float32(float64(model[i]) + s/total)
	}
	return out
}

func weightsOf(rank, round int, model []float32) []float32 {
	w := slices.Clone(model)
	for i := range w {
		w[i] += float32(rank*(i+1)) + 0.25*float32(round)
	}
	return w
}

// TestRounds: updates are averaged weighted by their sample counts, round
// after round; every client takes part; the clients get the model.
func TestRounds(t *testing.T) {
	init := []float32{1, -2, 3.5, 0}
	f := start(t, 4, init, nil, nil)
	tr := trainer{weights: weightsOf, samples: func(r int) int { return 10 * r }}
	var done []<-chan error
	for r := 1; r < 4; r++ {
		m, round := f.clients[r].Model()
		assert.Equal(t, init, m, "rank %d got the initial model at join", r)
		assert.Equal(t, 0, round)
		done = append(done, serve(f.clients[r], tr))
	}
	want := init
	ctx := context.Background()
	for k := 1; k <= 4; k++ {
		res, err := f.leader.Round(ctx)
		require.NoError(t, err)
		assert.Equal(t, k, res.Round)
		assert.Equal(t, []int{1, 2, 3}, res.Sampled)
		assert.Equal(t, []int{1, 2, 3}, res.Reported)
		assert.Empty(t, res.Missing)
		assert.Equal(t, int64(60), res.Samples)
		var ws [][]float32
		for r := 1; r < 4; r++ {
			ws = append(ws, weightsOf(r, k, want))
		}
		want = fedavg(want, ws, []int{10, 20, 30})
		assert.Equal(t, want, f.leader.Model(), "round %d", k)
	}
	require.NoError(t, f.leader.Close())
	for _, d := range done {
		require.NoError(t, <-d, "clients end with ErrFinished")
	}
}

// TestSampling: a round samples max(⌊f·n⌋, min) members, reproducibly for
// a seed; every sampled client's update is averaged and nobody else's.
func TestSampling(t *testing.T) {
	assert.Equal(t, 3, fed.SampleSize(10, 0.3, 1))
	assert.Equal(t, 2, fed.SampleSize(5, 0.3, 2))   // ⌊1.5⌋ = 1 < min
	assert.Equal(t, 5, fed.SampleSize(5, 0.3, 9))   // never more than the members
	assert.Equal(t, 7, fed.SampleSize(10, 0.75, 1)) // Flower's int(): floor
	members := []int{1, 2, 3, 4, 5, 6, 7, 8, 9}
	a := fed.Sample(members, 3, 42, 0.5, 1)
	rev := slices.Clone(members)
	slices.Reverse(rev)
	assert.Equal(t, a, fed.Sample(rev, 3, 42, 0.5, 1), "the order of the members does not matter")
	assert.Len(t, a, 4)
	assert.True(t, slices.IsSorted(a))
	differ := false
	for k := uint64(1); k < 20; k++ {
		if !slices.Equal(a, fed.Sample(members, k, 42, 0.5, 1)) {
			differ = true
		}
	}
	assert.True(t, differ, "rounds sample different clients")

	f := start(t, 6, []float32{0, 0}, []fed.Option{fed.WithFraction(0.4), fed.WithSeed(7)}, nil)
	for r := 1; r < 6; r++ {
		serve(f.clients[r], trainer{weights: weightsOf, samples: func(int) int { return 1 }})
	}
	for k := 1; k <= 4; k++ {
		model := f.leader.Model()
		res, err := f.leader.Round(context.Background())
		require.NoError(t, err)
		assert.Equal(t, fed.Sample([]int{1, 2, 3, 4, 5}, uint64(k), 7, 0.4, 1), res.Sampled)
		assert.Len(t, res.Sampled, 2)
		assert.Equal(t, res.Sampled, res.Reported)
		var ws [][]float32
		for _, r := range res.Sampled {
			ws = append(ws, weightsOf(r, k, model))
		}
		assert.Equal(t, fedavg(model, ws, []int{1, 1}), f.leader.Model())
	}
}

// TestLateUpdate: a client that misses the round's deadline is skipped,
// and its late update is never averaged into the next round.
func TestLateUpdate(t *testing.T) {
	f := start(t, 4, []float32{1, 1, 1}, []fed.Option{fed.WithRoundTimeout(time.Second)}, nil)
	release := make(chan struct{})
	reported := make(chan int, 10)
	slow := trainer{
		weights: weightsOf,
		samples: func(r int) int { return r },
		before: func(rank, round int) {
			if rank == 3 && round == 1 {
				<-release // past round 1's deadline, into round 2
			}
			if rank == 3 {
				reported <- round
			}
		},
	}
	for r := 1; r < 4; r++ {
		serve(f.clients[r], slow)
	}
	ctx := context.Background()
	m0 := f.leader.Model()
	start := time.Now()
	res, err := f.leader.Round(ctx)
	require.NoError(t, err)
	assert.Less(t, time.Since(start), 3*time.Second, "round 1 ended at its deadline")
	assert.Equal(t, []int{1, 2}, res.Reported)
	assert.Equal(t, []int{3}, res.Missing)
	m1 := fedavg(m0, [][]float32{weightsOf(1, 1, m0), weightsOf(2, 1, m0)}, []int{1, 2})
	require.Equal(t, m1, f.leader.Model())

	// Round 2 starts while rank 3 still trains round 1; its round-1 update
	// arrives during round 2 and must be discarded, and its round-2 update
	// (it trains from the latest task) averaged.
	round2 := make(chan fed.Result, 1)
	go func() {
		res, err := f.leader.Round(ctx)
		assert.NoError(t, err)
		round2 <- res
	}()
	time.Sleep(100 * time.Millisecond) // round 2's tasks are out
	close(release)
	assert.Equal(t, 1, <-reported, "rank 3 reported round 1 late")
	res = <-round2
	assert.Equal(t, []int{1, 2, 3}, res.Reported)
	m2 := fedavg(m1, [][]float32{weightsOf(1, 2, m1), weightsOf(2, 2, m1), weightsOf(3, 2, m1)}, []int{1, 2, 3})
	assert.Equal(t, m2, f.leader.Model(), "round 2 averages exactly the round-2 updates")
}

// TestLinkBreaksAndRejoins: a client whose link breaks is dropped (the
// round goes on without it, logged once), reconnects by itself, is
// admitted at the next round boundary with the current model, and its next
// update is averaged.
func TestLinkBreaksAndRejoins(t *testing.T) {
	var logs logBuffer
	f := start(t, 4, []float32{0, 0, 0}, []fed.Option{fed.WithLogger(logs.logger())}, nil)
	var once sync.Once
	tr := trainer{weights: weightsOf, samples: func(int) int { return 1 },
		before: func(rank, round int) {
			if rank == 2 && round == 2 {
				once.Do(f.clients[2].KillLink)
			}
		}}
	for r := 1; r < 4; r++ {
		serve(f.clients[r], tr)
	}
	ctx := context.Background()
	res, err := f.leader.Round(ctx)
	require.NoError(t, err)
	require.Equal(t, []int{1, 2, 3}, res.Reported)

	res, err = f.leader.Round(ctx)
	require.NoError(t, err)
	assert.Equal(t, []int{1, 3}, res.Reported, "round 2 goes on without rank 2")
	assert.Equal(t, []int{2}, res.Missing)
	assert.Equal(t, []int{2}, res.Left)

	// Rank 2 reconnects on its own; it is admitted at a round boundary.
	require.Eventually(t, func() bool {
		res, err = f.leader.Round(ctx)
		require.NoError(t, err)
		return slices.Contains(res.Reported, 2)
	}, 20*time.Second, time.Millisecond, "rank 2 takes part again")
	m, _ := f.clients[2].Model()
	assert.Len(t, m, 3)
	out := logs.String()
	assert.Equal(t, 1, bytes.Count([]byte(out), []byte(`msg="fed: client left" rank=0 client=2`)), "logged once:\n%s", out)
	assert.Contains(t, out, `msg="fed: client rejoined (reconnected)" rank=0 client=2`)
}

// TestNewProcessRejoins: a client that dies is replaced by a new process of
// the same rank, which joins at the next round boundary after receiving
// the current model, and whose next update is averaged.
func TestNewProcessRejoins(t *testing.T) {
	var logs, clog logBuffer
	f := start(t, 3, []float32{5, 6}, []fed.Option{fed.WithLogger(logs.logger())}, nil)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("leader:\n%s\nnew process:\n%s", logs.String(), clog.String())
		}
	})
	tr := trainer{weights: weightsOf, samples: func(int) int { return 3 }}
	serve(f.clients[1], tr)
	serve(f.clients[2], tr)
	ctx := context.Background()
	_, err := f.leader.Round(ctx)
	require.NoError(t, err)

	f.clients[2].KillLink() // dies: its link ends without a goodbye
	f.clients[2].Close()
	res, err := f.leader.Round(ctx)
	require.NoError(t, err)
	assert.NotContains(t, res.Reported, 2)

	cur := f.leader.Model()
	joined := make(chan *fed.Client, 1)
	go func() {
		c, err := fed.Join(ctx, f.addr, 2, 3, append(fast(), fed.WithLogger(slog.New(slog.NewTextHandler(&clog, &slog.HandlerOptions{Level: slog.LevelDebug}))))...)
		assert.NoError(t, err)
		joined <- c
	}()
	var c *fed.Client
	rounds := 0
	require.Eventually(t, func() bool {
		select {
		case c = <-joined:
			return true
		default:
		}
		// A boundary to be admitted at. A round that begins just after the
		// admission waits for the new process, which trains only once this
		// test serves it: such a round is abandoned, which leaves the model
		// as it was.
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		if _, err := f.leader.Round(rctx); err == nil {
			rounds++
		} else {
			assert.ErrorIs(t, err, context.DeadlineExceeded)
		}
		return false
	}, 30*time.Second, 10*time.Millisecond)
	f.clients[2] = c
	got, _ := c.Model()
	assert.Equal(t, f.leader.Model(), got, "the new process starts from the current model")
	if rounds > 0 {
		assert.NotEqual(t, cur, got, "%d rounds ran meanwhile", rounds)
	}
	serve(c, tr)
	res, err = f.leader.Round(ctx)
	require.NoError(t, err)
	assert.Equal(t, []int{1, 2}, res.Reported, "its next update is averaged")
	assert.Contains(t, logs.String(), `msg="fed: client rejoined (a new process)" rank=0 client=2`)
}

// TestRoundCancelled: a round whose context ends leaves the model as it
// was; the next round works.
func TestRoundCancelled(t *testing.T) {
	f := start(t, 3, []float32{1}, nil, nil)
	release := make(chan struct{})
	tr := trainer{weights: weightsOf, samples: func(int) int { return 1 },
		before: func(rank, round int) {
			if round == 1 {
				<-release
			}
		}}
	serve(f.clients[1], tr)
	serve(f.clients[2], tr)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := f.leader.Round(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, []float32{1}, f.leader.Model())
	close(release)
	res, err := f.leader.Round(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 2, res.Round, "round 1 was used up")
	assert.Equal(t, []int{1, 2}, res.Reported)
}

// TestRoundWaitsForMembers: a round waits for WithMinAvailable members.
func TestRoundWaitsForMembers(t *testing.T) {
	f := start(t, 3, []float32{1}, []fed.Option{fed.WithMinAvailable(2)}, nil)
	tr := trainer{weights: weightsOf, samples: func(int) int { return 1 }}
	serve(f.clients[1], tr)
	f.clients[2].Close()
	require.Eventually(t, func() bool { return len(f.leader.Members()) == 1 }, 10*time.Second, 10*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := f.leader.Round(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorContains(t, err, "waiting for 2 clients, 1 are members")

	c, err := fed.Join(context.Background(), f.addr, 2, 3, fast()...)
	require.NoError(t, err)
	f.clients[2] = c
	serve(c, tr)
	res, err := f.leader.Round(context.Background())
	require.NoError(t, err)
	assert.Equal(t, []int{1, 2}, res.Reported)
}

// TestLeadJoinTimeout: Lead starts without the clients that never came if
// enough did, and fails naming them otherwise.
func TestAwaitJoinTimeout(t *testing.T) {
	ctx := context.Background()
	lopts := append(fast(), fed.WithJoinTimeout(time.Second), fed.WithMinAvailable(2))
	l, err := fed.Lead(ctx, "127.0.0.1:0", 4, []float32{0}, lopts...)
	require.NoError(t, err)
	defer l.Close()
	for r := 1; r <= 2; r++ {
		c, err := fed.Join(ctx, l.Addr().String(), r, 4, fast()...)
		require.NoError(t, err)
		defer c.Close()
	}
	require.NoError(t, l.Await(ctx), "2 of 3 clients are enough")
	assert.Equal(t, []int{1, 2}, l.Members())

	l2, err := fed.Lead(ctx, "127.0.0.1:0", 4, []float32{0}, lopts...)
	require.NoError(t, err)
	defer l2.Close()
	c, err := fed.Join(ctx, l2.Addr().String(), 1, 4, fast()...)
	require.NoError(t, err)
	defer c.Close()
	err = l2.Await(ctx)
	var jt *fed.JoinTimeoutError
	require.ErrorAs(t, err, &jt)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, []int{2, 3}, jt.Missing)
	assert.ErrorContains(t, err, "ranks 2, 3 never did")
}

// TestRankInUse: a second process joining as a rank that is a member is
// refused until its join timeout, while the first goes on.
func TestRankInUse(t *testing.T) {
	f := start(t, 2, []float32{1}, nil, nil)
	_, err := fed.Join(context.Background(), f.addr, 1, 2, append(fast(), fed.WithJoinTimeout(time.Second))...)
	require.ErrorIs(t, err, fed.ErrRankInUse)
	serve(f.clients[1], trainer{weights: weightsOf, samples: func(int) int { return 1 }})
	res, err := f.leader.Round(context.Background())
	require.NoError(t, err)
	assert.Equal(t, []int{1}, res.Reported)
}

// TestLeaderGone: a client whose leader dies (its link breaks and nobody
// listens at its address any more) fails at once with an error naming rank
// 0; a client whose leader ends the federation gets ErrFinished.
func TestLeaderGone(t *testing.T) {
	ctx := context.Background()
	// A stand-in for a leader process: it admits rank 1, then dies.
	s, err := fed.NewStandIn(2, fast()...)
	require.NoError(t, err)
	c, err := fed.Join(ctx, s.Addr(), 1, 2, fast()...)
	require.NoError(t, err)
	defer c.Close()
	start := time.Now()
	s.Crash()
	_, err = c.Next(ctx)
	var pe *transport.PeerError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, 0, pe.Rank)
	assert.ErrorIs(t, err, fed.ErrLeaderLost)
	assert.Less(t, time.Since(start), 2*time.Second)
	t.Logf("%v", err)
}

// TestTLS: links over TLS; a client whose certificate the leader does not
// trust is refused with a log line, and the federation goes on.
func TestTLS(t *testing.T) {
	ca, err := certs.NewCA("fed test CA")
	require.NoError(t, err)
	leaf, err := ca.Issue("rank", "127.0.0.1")
	require.NoError(t, err)
	var logs logBuffer
	f := start(t, 3, []float32{2, 4}, []fed.Option{fed.WithTLS(leaf.Config()), fed.WithTCP(), fed.WithLogger(logs.logger())},
		func(int) []fed.Option { return []fed.Option{fed.WithTLS(leaf.Config())} })
	tr := trainer{weights: weightsOf, samples: func(int) int { return 1 }}
	serve(f.clients[1], tr)
	serve(f.clients[2], tr)

	impostor, err := certs.NewCA("fed test CA") // same name, another key
	require.NoError(t, err)
	fake, err := impostor.Issue("rank", "127.0.0.1")
	require.NoError(t, err)
	cfg := fake.Config()
	cfg.RootCAs = leaf.Config().RootCAs // it trusts the leader; the leader does not trust it
	_, err = fed.Join(context.Background(), f.addr, 2, 3, append(fast(), fed.WithTLS(cfg))...)
	require.ErrorIs(t, err, fed.ErrLeaderLost, "%v", err)
	require.Eventually(t, func() bool {
		return bytes.Contains([]byte(logs.String()), []byte("TLS handshake failed: tls: failed to verify certificate"))
	}, 5*time.Second, 10*time.Millisecond, "%s", logs.String())

	res, err := f.leader.Round(context.Background())
	require.NoError(t, err)
	assert.Equal(t, []int{1, 2}, res.Reported, "the federation goes on")
}

func TestOptions(t *testing.T) {
	ctx := context.Background()
	for name, opts := range map[string][]fed.Option{
		"fraction 0":        {fed.WithFraction(0)},
		"fraction > 1":      {fed.WithFraction(1.5)},
		"min clients 0":     {fed.WithMinClients(0)},
		"round timeout":     {fed.WithRoundTimeout(0)},
		"nil optimizer":     {fed.WithServerOptimizer(nil)},
		"client option":     {fed.WithReconnect(time.Second, time.Millisecond, time.Second)},
		"short token":       {fed.WithToken([]byte("short"))},
		"heartbeat":         {fed.WithHeartbeat(time.Second, time.Second)},
		"too many required": {fed.WithMinAvailable(5)},
		"nil logger":        {fed.WithLogger(nil)},
	} {
		_, err := fed.Lead(ctx, "127.0.0.1:0", 3, []float32{1}, append(fast(), opts...)...)
		assert.ErrorIs(t, err, fed.ErrInvalidArgument, name)
	}
	_, err := fed.Lead(ctx, "127.0.0.1:0", 1, []float32{1}, fast()...)
	assert.ErrorIs(t, err, fed.ErrInvalidArgument, "world of one")
	_, err = fed.Lead(ctx, "127.0.0.1:0", 3, []float32{1}, fed.WithLogger(quiet()))
	assert.ErrorIs(t, err, fed.ErrInvalidArgument, "no token")

	for name, opts := range map[string][]fed.Option{
		"leader option": {fed.WithFraction(0.5)},
		"reconnect":     {fed.WithReconnect(time.Second, 2*time.Second, time.Second)},
	} {
		_, err := fed.Join(ctx, "127.0.0.1:1", 1, 3, append(fast(), opts...)...)
		assert.ErrorIs(t, err, fed.ErrInvalidArgument, name)
	}
	for _, r := range []int{0, 3, -1} {
		_, err := fed.Join(ctx, "127.0.0.1:1", r, 3, fast()...)
		assert.ErrorIs(t, err, fed.ErrInvalidArgument, "rank %d", r)
	}
}

// TestReportArguments: Report refuses a wrong length or sample count.
func TestReportArguments(t *testing.T) {
	f := start(t, 2, []float32{1, 2}, nil, nil)
	done := make(chan error, 1)
	go func() {
		_, err := f.leader.Round(context.Background())
		done <- err
	}()
	task, err := f.clients[1].Next(context.Background())
	require.NoError(t, err)
	ctx := context.Background()
	assert.ErrorIs(t, f.clients[1].Report(ctx, task, []float32{1}, 1), fed.ErrInvalidArgument)
	assert.ErrorIs(t, f.clients[1].Report(ctx, task, []float32{1, 2}, 0), fed.ErrInvalidArgument)
	assert.ErrorIs(t, f.clients[1].Report(ctx, nil, []float32{1, 2}, 1), fed.ErrInvalidArgument)
	require.NoError(t, f.clients[1].Report(ctx, task, []float32{3, float32(math.Inf(1))}, 1))
	require.NoError(t, <-done)
	assert.Equal(t, []float32{1, 2}, f.leader.Model(), "an update with infinite values is not averaged")
}

// ExampleLead runs a federation of a leader and two clients in one process.
func ExampleLead() {
	ctx := context.Background()
	token := []byte("0123456789abcdef0123456789abcdef") // the job token (GDIST_TOKEN)
	l, err := fed.Lead(ctx, "127.0.0.1:0", 3, []float32{0, 10}, fed.WithToken(token))
	if err != nil {
		panic(err)
	}
	defer l.Close()
	addr := l.Addr().String()
	for rank := 1; rank <= 2; rank++ {
		go func() {
			c, err := fed.Join(ctx, addr, rank, 3, fed.WithToken(token))
			if err != nil {
				panic(err)
			}
			defer c.Close()
			for {
				task, err := c.Next(ctx)
				if err != nil {
					return // fed.ErrFinished once the leader closes
				}
				w := task.Model
				for i := range w {
					w[i] += float32(rank) // "training"
				}
				c.Report(ctx, task, w, 100*rank) // new weights, samples
			}
		}()
	}
	if err := l.Await(ctx); err != nil { // the job's two clients have joined
		panic(err)
	}
	for range 2 {
		res, err := l.Round(ctx)
		if err != nil {
			panic(err)
		}
		fmt.Printf("round %d: clients %v took part, %d samples; model %v\n", res.Round, res.Reported, res.Samples, l.Model())
	}
	// Output:
	// round 1: clients [1 2] took part, 300 samples; model [1.6666666 11.666667]
	// round 2: clients [1 2] took part, 300 samples; model [3.3333333 13.333334]
}
