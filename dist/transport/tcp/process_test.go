package tcp

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/transporttest"
)

// childJob starts a world-rank job: ranks 0..world-2 in this process, the
// last rank as a child process in role, with env added to the child's
// environment. It returns once every rank is linked and the child said it
// is ready.
func childJob(t *testing.T, world int, role string, opts []Option, env ...string) ([]*Transport, *exec.Cmd) {
	t.Helper()
	if runtime.GOOS == "windows" {
		t.Skip("needs POSIX signals")
	}
	lns, addrs := listeners(t, world-1)
	addrs = append(addrs, freeAddr(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{envChild + "=" + role, envChildAddrs + "=" + strings.Join(addrs, ",")}, env...)...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	ts := make([]*Transport, world-1)
	errs := make([]error, world-1)
	var wg sync.WaitGroup
	for i := range world - 1 {
		wg.Go(func() {
			ts[i], errs[i] = New(ctx, i, world, lns[i], addrs, append([]Option{WithToken(testToken), WithLogger(quiet())}, opts...)...)
		})
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "rank %d", i)
		t.Cleanup(func() { ts[i].Close() })
	}
	for i, tr := range ts {
		m, err := tr.Recv(ctx, world-1, 1)
		require.NoError(t, err, "rank %d", i)
		require.Equal(t, "ready", string(m.Payload))
	}
	return ts, cmd
}

// TestFrozenPeerNamedBySurvivors: a rank stopped with SIGSTOP (its
// connections stay up, it just stops answering) is named by every survivor,
// with the default heartbeat, within 11 s, as unresponsive.
func TestFrozenPeerNamedBySurvivors(t *testing.T) {
	if testing.Short() {
		t.Skip("takes the default heartbeat timeout (10 s)")
	}
	const world, victim = 3, 2
	ts, cmd := childJob(t, world, "freeze", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make(chan error, len(ts))
	for _, tr := range ts {
		go func() { _, err := tr.Recv(ctx, victim, 5); errs <- err }()
	}
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	stopped := time.Now()
	for range ts {
		select {
		case err := <-errs:
			el := time.Since(stopped)
			requirePeer(t, err, victim, transport.ErrPeerUnresponsive)
			assert.ErrorIs(t, err, ErrHeartbeatTimeout)
			assert.ErrorIs(t, err, transport.ErrPeerLost)
			t.Logf("named %v after SIGSTOP: %v", el.Round(time.Millisecond), err)
			assert.Less(t, el, DefaultHeartbeatTimeout+time.Second)
			assert.GreaterOrEqual(t, el, DefaultHeartbeatTimeout-DefaultHeartbeatInterval, "not before the timeout")
		case <-time.After(15 * time.Second):
			t.Fatal("a survivor did not name the stopped rank within 15 s")
		}
	}
	// The survivors still talk to each other.
	require.NoError(t, ts[0].Send(ctx, 1, 7, transport.Header{}, []byte("still here")))
	m, err := ts[1].Recv(ctx, 0, 7)
	require.NoError(t, err)
	assert.Equal(t, "still here", string(m.Payload))
}

// TestBusyComputeNotDeclaredDead: a rank running Gorgonia matrix products
// for 10 s with GOMAXPROCS=1 keeps answering heartbeats, even with a
// heartbeat timeout of 2 s (a fifth of the default). Its link goroutines
// do not run at every heartbeat: gonum's matrix product starts goroutines,
// and on one P a new goroutine runs next, ahead of those already waiting
// (golang/go#52934), so the compute can hold them off for hundreds of
// milliseconds. An echo answers the latest heartbeat, so the rank stays
// alive as long as echoes keep coming well within the timeout.
func TestBusyComputeNotDeclaredDead(t *testing.T) {
	if testing.Short() {
		t.Skip("computes for 10 s")
	}
	const hb, busy = 2 * time.Second, 10 * time.Second
	var mu sync.Mutex
	var rtts []time.Duration
	var at []time.Time
	observe := func(peer int, rtt time.Duration) {
		if peer == 1 {
			mu.Lock()
			rtts = append(rtts, rtt)
			at = append(at, time.Now())
			mu.Unlock()
		}
	}
	ts, _ := childJob(t, 2, "compute", []Option{WithHeartbeat(0, hb), WithHeartbeatObserver(observe)},
		"GOMAXPROCS=1", envChildHB+"="+hb.String(), envChildFor+"="+busy.String())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	m, err := ts[0].Recv(ctx, 1, 1)
	require.NoError(t, err, "the computing rank was declared dead after %v", time.Since(start))
	end := time.Now()
	n, err := strconv.Atoi(string(m.Payload))
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, rtts)
	// The longest wait for an echo while the rank computed.
	gap, last := time.Duration(0), start
	for _, a := range at {
		if a.After(end) {
			break
		}
		gap, last = max(gap, a.Sub(last)), a
	}
	gap = max(gap, end.Sub(last))
	t.Logf("%d graph runs (2 products of 256x256 each) in %v; %d heartbeat round trips, max %v, median %v; longest wait for an echo %v",
		n, busy, len(rtts), maxDur(rtts), median(rtts), gap)
	assert.Greater(t, n, 0)
	assert.GreaterOrEqual(t, len(rtts), int(2*busy/hb), "at least two echoes per timeout on average")
	assert.Less(t, gap, hb*3/4, "echoes well within the heartbeat timeout")
}

// TestNoFalseAlarmUnderLoad: with a CPU hog per core in other processes, a
// rank computing with GOMAXPROCS=1 for 15 s, and heartbeats timing out at
// 2 s (a quarter of the default), nobody is declared dead. (The 10-minute
// soak with the default timeout is a separate, longer run.)
func TestNoFalseAlarmUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("runs CPU hogs for 15 s")
	}
	for range runtime.NumCPU() {
		hog := exec.Command(os.Args[0], "-test.run=^$")
		hog.Env = append(os.Environ(), envChild+"=hog")
		require.NoError(t, hog.Start())
		t.Cleanup(func() {
			hog.Process.Kill()
			hog.Wait()
		})
	}
	const hb, busy = 2 * time.Second, 15 * time.Second
	var mu sync.Mutex
	var rtts []time.Duration
	observe := func(peer int, rtt time.Duration) {
		mu.Lock()
		rtts = append(rtts, rtt)
		mu.Unlock()
	}
	ts, _ := childJob(t, 3, "compute", []Option{WithHeartbeat(0, hb), WithHeartbeatObserver(observe)},
		"GOMAXPROCS=1", envChildHB+"="+hb.String(), envChildFor+"="+busy.String())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Meanwhile ranks 0 and 1 exchange messages.
	stop := make(chan struct{})
	pp := make(chan error, 1)
	go func() {
		p := make([]byte, 64<<10)
		for {
			select {
			case <-stop:
				pp <- nil
				return
			default:
			}
			if err := ts[0].Send(ctx, 1, 9, transport.Header{}, p); err != nil {
				pp <- err
				return
			}
			m, err := ts[1].Recv(ctx, 0, 9)
			if err != nil {
				pp <- err
				return
			}
			ts[1].Release(m.Payload)
		}
	}()
	for i, tr := range ts {
		_, err := tr.Recv(ctx, 2, 1)
		require.NoError(t, err, "rank %d: the computing rank was declared dead", i)
	}
	close(stop)
	require.NoError(t, <-pp, "ranks 0 and 1")
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d CPU hogs; %d heartbeat round trips, max %v, median %v", runtime.NumCPU(), len(rtts), maxDur(rtts), median(rtts))
}

func maxDur(ds []time.Duration) time.Duration {
	m := time.Duration(0)
	for _, d := range ds {
		m = max(m, d)
	}
	return m
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	for i := range s { // insertion sort: small n
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	return s[len(s)/2]
}

// TestCloseSkipsSilentPeer: Close does not wait for the goodbye of a peer
// that has stopped answering (SIGSTOP) but that its heartbeat timeout has
// not named yet — as on a rank that learned of the failure from another
// rank first. It returns at once instead of after the linger (here 4 s),
// and the live peer still sees a clean goodbye.
func TestCloseSkipsSilentPeer(t *testing.T) {
	const world = 3
	const interval, timeout = 100 * time.Millisecond, 4 * time.Second
	ts, cmd := childJob(t, world, "freeze", []Option{WithHeartbeat(interval, timeout)}, envChildHB+"="+timeout.String())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	stopped := time.Now()
	// Long enough to miss lingerSilence heartbeats, far from the timeout.
	time.Sleep(lingerSilence*interval + 300*time.Millisecond)
	start := time.Now()
	require.NoError(t, ts[0].Close())
	took := time.Since(start)
	t.Logf("Close %v after SIGSTOP took %v (linger %v)", start.Sub(stopped).Round(time.Millisecond), took.Round(time.Millisecond), min(closeLinger, timeout))
	assert.Less(t, took, time.Second, "Close must not linger for a silent peer")
	assert.Less(t, time.Since(stopped), timeout, "the victim was not named by its heartbeat timeout first")
	_, err := ts[1].Recv(ctx, 0, 9)
	requirePeer(t, err, 0, transport.ErrPeerClosed)
}

// TestPauseSurvivedFreezeNamed: with the default heartbeat on both sides, a
// rank stopped (SIGSTOP) for the heartbeat timeout less
// transport.PauseMargin and then resumed (SIGCONT) is not taken for dead,
// by its peer or, once resumed, by itself; stopped for good, it is named
// unresponsive after the timeout.
func TestPauseSurvivedFreezeNamed(t *testing.T) {
	if testing.Short() {
		t.Skip("takes 8 s of pause and a 10 s freeze (the default heartbeat timeout)")
	}
	ts, cmd := childJob(t, 2, "freeze", nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pending := make(chan error, 1)
	go func() { _, err := ts[0].Recv(ctx, 1, 5); pending <- err }()

	signal := func(sig os.Signal) func() error { return func() error { return cmd.Process.Signal(sig) } }
	err := transporttest.PauseThenFreeze(t, 1, signal(syscall.SIGSTOP), signal(syscall.SIGCONT), pending,
		DefaultHeartbeatTimeout, DefaultHeartbeatInterval)
	assert.ErrorIs(t, err, ErrHeartbeatTimeout)
}
