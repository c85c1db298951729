package shm

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
)

// TestNextPatience: how long the idle reader polls before it parks, after
// each kind of wait.
func TestNextPatience(t *testing.T) {
	const spin = DefaultSpin
	ms := time.Millisecond
	for _, c := range []struct {
		name      string
		d, spin   time.Duration
		w         time.Duration
		parked    bool
		want      time.Duration
		rationale string
	}{
		{"parked, short", spin, spin, ms, true, 2 * ms, "twice the wait"},
		{"parked, shorter than patience", 3 * ms, spin, ms, true, 3 * ms, "kept"},
		{"parked, at the bound", spin, spin, maxPatience, true, maxPatience, "twice the wait, bounded"},
		{"parked, past the bound", 4 * ms, spin, 5 * ms, true, 2 * ms, "halved"},
		{"parked, long, at the floor", spin, spin, time.Second, true, spin, "never below the spin"},
		{"polled, short", 2 * ms, spin, 10 * time.Microsecond, false, 2*ms - 2*ms/16, "a sixteenth less"},
		{"polled, long", 2 * ms, spin, 1500 * time.Microsecond, false, 3 * ms, "twice the wait"},
		{"polled, tiny, at the floor", spin, spin, time.Microsecond, false, spin, "never below the spin"},
		{"spin 0", spin, 0, ms, true, 0, "WithSpin(0) parks at once"},
		{"spin above the bound", 10 * ms, 10 * ms, time.Second, true, 10 * ms, "never below the spin"},
		{"spin above the bound, polled", 10 * ms, 10 * ms, 6 * ms, false, 10 * ms, "bounded by the spin"},
	} {
		got := nextPatience(c.d, c.spin, c.w, c.parked)
		assert.Equal(t, c.want, got, "%s: %s", c.name, c.rationale)
	}
}

// TestPatienceFollowsWaits: a reader whose waits end about 1 ms after
// they begin comes to poll for longer than the spin (it no longer parks
// for each); a wait far longer than maxPatience then halves that; and an
// idle reader after such a rhythm still parks, using well under 5 % of a
// core.
func TestPatienceFollowsWaits(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	ts := mesh(t, 2)
	defer ts[1].Close()
	defer ts[0].Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	reader := ts[1].peers[0].Load()
	patience := func() time.Duration { return time.Duration(reader.patience.Load()) }
	require.Equal(t, DefaultSpin, patience(), "starts at the spin")

	// A rhythm of 40 waits of about 1 ms. The patience rises only where
	// the reader has a CPU to itself: on a machine whose CPUs other
	// processes keep busy (other tests' packages, in a CI run), its waits
	// stretch past maxPatience whenever the scheduler runs someone else,
	// and parking at once is then right. An attempt counts only if this
	// process got nearly a whole CPU when it asked (spinShare) and the
	// sends kept their rhythm; the test wants the patience to rise in one
	// of at most three counted attempts, and says so when none counted.
	got := make(chan error, 1)
	var rhythm time.Duration
	counted, rose := 0, false
	for attempt := 0; attempt < 12 && counted < 3 && !rose; attempt++ {
		share := spinShare(t, 20*time.Millisecond)
		go func() {
			for range 40 {
				if _, err := ts[1].Recv(ctx, 0, 1); err != nil {
					got <- err
					return
				}
			}
			got <- nil
		}()
		near := 0
		last := time.Now()
		for range 40 {
			time.Sleep(time.Millisecond)
			require.NoError(t, ts[0].Send(ctx, 1, 1, transport.Header{}, []byte("tick")))
			now := time.Now()
			if now.Sub(last) < 2500*time.Microsecond {
				near++
			}
			last = now
		}
		require.NoError(t, <-got)
		rhythm = patience()
		t.Logf("patience after 40 waits of about 1 ms: %v (%d of 40 intervals under 2.5 ms, CPU share %.2f)", rhythm, near, share)
		if near >= 36 && share >= 0.9 {
			counted++
			rose = rhythm > 4*DefaultSpin
		}
	}
	if counted > 0 {
		assert.True(t, rose, "waits of about 1 ms raise the patience above the spin")
	} else {
		t.Log("no attempt had a CPU to itself: the rise of the patience is not checked")
	}
	assert.LessOrEqual(t, rhythm, maxPatience)

	// One wait of 50 ms, then an idle second. Where other processes keep
	// the CPUs busy, the reader's pauses let them run and it keeps
	// polling rather than parking (busyYield), so the halving is checked
	// only where this process had a CPU to itself.
	share := spinShare(t, 20*time.Millisecond)
	go func() {
		_, err := ts[1].Recv(ctx, 0, 2)
		got <- err
	}()
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, ts[0].Send(ctx, 1, 2, transport.Header{}, []byte("late")))
	require.NoError(t, <-got)
	if share >= 0.9 {
		require.Eventually(t, func() bool { return patience() <= rhythm/2 || patience() == DefaultSpin },
			time.Second, time.Millisecond, "a wait past maxPatience halves the patience (%v before, %v now)", rhythm, patience())
	} else {
		t.Logf("CPU share %.2f: the halving is not checked", share)
	}

	go func() {
		_, err := ts[1].Recv(ctx, 0, 3)
		got <- err
	}()
	time.Sleep(10 * time.Millisecond) // past maxPatience: parked
	// A window in which other processes kept the CPUs busy can read high
	// (the reader's pauses let them run, see busyYield): the reader must
	// stay under 5 % in one of up to three windows of a second, which a
	// reader that kept polling would not.
	frac := 1.0
	for w := 0; w < 3 && frac >= 0.05; w++ {
		f := idleCPU(t, time.Second)
		t.Logf("idle, window %d: %.2f%% of a core", w+1, 100*f)
		frac = min(frac, f)
	}
	assert.Less(t, frac, 0.05)
	require.NoError(t, ts[0].Send(ctx, 1, 3, transport.Header{}, []byte("wake")))
	require.NoError(t, <-got)
}

// spinShare spins for d and returns the share of a CPU this process got
// meanwhile: near 1 when a CPU was free for it, lower when other
// processes kept the CPUs busy.
func spinShare(t testing.TB, d time.Duration) float64 {
	return cpuShare(t, func() {
		for w0 := time.Now(); time.Since(w0) < d; {
		}
	})
}
