//go:build linux

package hybrid_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/hybrid"
	"github.com/gdist/gdist/dist/transport/shm"
	"github.com/gdist/gdist/dist/transport/tcp"
	"github.com/gdist/gdist/dist/transport/transporttest"
	"github.com/gdist/gdist/internal/portpick"
)

var testToken = []byte("hybrid-test-token-0123456789abcdef")

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// start runs Rendezvous for len(hosts) ranks in this process, rank r with
// host id hosts[r] and the options common plus perRank(r) (if not nil). It
// returns every rank's transport and error; a port some other process took
// meanwhile is retried.
func start(t testing.TB, hosts []string, perRank func(r int) []hybrid.Option, common ...hybrid.Option) ([]*hybrid.Transport, []error) {
	t.Helper()
	n := len(hosts)
	for attempt := 0; ; attempt++ {
		port, err := portpick.Free("127.0.0.1")
		require.NoError(t, err)
		master := fmt.Sprintf("127.0.0.1:%d", port)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		ts := make([]*hybrid.Transport, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for r := range n {
			wg.Go(func() {
				o := []hybrid.Option{hybrid.WithToken(testToken), hybrid.WithLogger(quiet()), hybrid.WithHostID(hosts[r]),
					hybrid.WithTCP(tcp.WithInitTimeout(30 * time.Second))}
				o = append(o, common...)
				if perRank != nil {
					o = append(o, perRank(r)...)
				}
				ts[r], errs[r] = hybrid.Rendezvous(ctx, r, n, master, o...)
			})
		}
		wg.Wait()
		cancel()
		if errs[0] != nil && strings.Contains(errs[0].Error(), "address already in use") && attempt < 3 {
			closeAll(ts)
			continue
		}
		return ts, errs
	}
}

func closeAll(ts []*hybrid.Transport) {
	for _, tr := range ts {
		if tr != nil {
			tr.Close()
		}
	}
}

// mesh is start for ranks that must all succeed; they are closed when the
// test ends.
func mesh(t testing.TB, hosts []string, opts ...hybrid.Option) []*hybrid.Transport {
	t.Helper()
	ts, errs := start(t, hosts, nil, opts...)
	t.Cleanup(func() { closeAll(ts) })
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	return ts
}

func asTransports(ts []*hybrid.Transport) []transport.Transport {
	out := make([]transport.Transport, len(ts))
	for i, t := range ts {
		out[i] = t
	}
	return out
}

// Host layouts for the conformance suite, by rank count.
var layouts = map[string]func(n int) []string{
	// alternate: A, B, A, B: in the 3-rank crash test the victim, rank 2,
	// is rank 0's shm peer and rank 1's TCP peer.
	"alternate": func(n int) []string {
		h := make([]string, n)
		for r := range h {
			h[r] = string(rune('A' + r%2))
		}
		return h
	},
	// pairs: A, A, B, B (A, A, B for 3).
	"pairs": func(n int) []string {
		h := make([]string, n)
		for r := range h {
			h[r] = string(rune('A' + r/2))
		}
		return h
	},
	"onehost": func(n int) []string {
		h := make([]string, n)
		for r := range h {
			h[r] = "one"
		}
		return h
	},
}

func TestConformance(t *testing.T) {
	for name, layout := range layouts {
		t.Run(name, func(t *testing.T) {
			if testing.Short() && name != "alternate" {
				t.Skip("short")
			}
			transporttest.Run(t, func(t *testing.T, n int) []transport.Transport {
				return asTransports(mesh(t, layout(n)))
			}, transporttest.WithLimited(func(t *testing.T, n, limit int) []transport.Transport {
				return asTransports(mesh(t, layout(n), hybrid.WithTCP(tcp.WithQueueLimit(limit)), hybrid.WithSHM(shm.WithQueueLimit(limit))))
			}))
		})
	}
}

// TestRoutes: with hosts A, A, B, B the pairs of a host use shared memory,
// the others TCP, and every rank sees the same topology.
func TestRoutes(t *testing.T) {
	ts := mesh(t, []string{"A", "A", "B", "B"})
	want := [][]string{
		{hybrid.ViaSelf, hybrid.ViaSHM, hybrid.ViaTCP, hybrid.ViaTCP},
		{hybrid.ViaSHM, hybrid.ViaSelf, hybrid.ViaTCP, hybrid.ViaTCP},
		{hybrid.ViaTCP, hybrid.ViaTCP, hybrid.ViaSelf, hybrid.ViaSHM},
		{hybrid.ViaTCP, hybrid.ViaTCP, hybrid.ViaSHM, hybrid.ViaSelf},
	}
	for r, tr := range ts {
		assert.Equal(t, []int{0, 0, 1, 1}, tr.Hosts(), "rank %d", r)
		for p := range ts {
			assert.Equal(t, want[r][p], tr.Via(p), "rank %d to %d", r, p)
		}
		assert.Empty(t, tr.Via(-1))
		assert.Empty(t, tr.Via(4))
	}
	h := ts[0].Hosts()
	h[0] = 9
	assert.Equal(t, []int{0, 0, 1, 1}, ts[0].Hosts(), "Hosts returns a copy")

	// Every pair exchanges a message on its route, both ways, sent by Send
	// and by SendStream (streamed on shared memory, a plain send elsewhere).
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, stream := range []bool{false, true} {
		for from := range ts {
			for to := range ts {
				msg := fmt.Appendf(bytes.Repeat([]byte{'.'}, 5000), "%d->%d", from, to)
				send := ts[from].Send
				if stream {
					send = ts[from].SendStream
				}
				require.NoError(t, send(ctx, to, 3, transport.Header{byte(from)}, msg))
				m, err := ts[to].Recv(ctx, from, 3)
				require.NoError(t, err)
				assert.Equal(t, msg, m.Payload)
				assert.Equal(t, transport.Header{byte(from)}, m.Header)
				ts[to].Release(m.Payload)
			}
		}
	}
}

// TestHostOrder: hosts are numbered in the order of their lowest rank.
func TestHostOrder(t *testing.T) {
	ts := mesh(t, []string{"x", "y", "x", "z", "y"}, hybrid.WithMode(hybrid.TCP))
	for r, tr := range ts {
		assert.Equal(t, []int{0, 1, 0, 2, 1}, tr.Hosts(), "rank %d", r)
	}
}

// TestDefaultHostID: ranks of one process share the default identity, so
// they use shared memory.
func TestDefaultHostID(t *testing.T) {
	id := hybrid.DefaultHostID()
	assert.Contains(t, id, "host=")
	assert.Contains(t, id, "netns=")
	assert.Equal(t, id, hybrid.DefaultHostID())
	ports, errs := startDefault(t, 2)
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	assert.Equal(t, hybrid.ViaSHM, ports[0].Via(1))
	assert.Equal(t, []int{0, 0}, ports[1].Hosts())
}

// startDefault starts n ranks without WithHostID.
func startDefault(t *testing.T, n int) ([]*hybrid.Transport, []error) {
	port, err := portpick.Free("127.0.0.1")
	require.NoError(t, err)
	master := fmt.Sprintf("127.0.0.1:%d", port)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ts := make([]*hybrid.Transport, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			ts[r], errs[r] = hybrid.Rendezvous(ctx, r, n, master, hybrid.WithInsecure(), hybrid.WithLogger(quiet()))
		})
	}
	wg.Wait()
	t.Cleanup(func() { closeAll(ts) })
	return ts, errs
}

func TestModeTCP(t *testing.T) {
	ts := mesh(t, []string{"A", "A", "B"}, hybrid.WithMode(hybrid.TCP))
	for r, tr := range ts {
		assert.Equal(t, []int{0, 0, 1}, tr.Hosts(), "rank %d", r)
		for p := range ts {
			if p != r {
				assert.Equal(t, hybrid.ViaTCP, tr.Via(p), "rank %d to %d", r, p)
			}
		}
	}
}

func TestModeSHM(t *testing.T) {
	ts := mesh(t, []string{"A", "A", "A"}, hybrid.WithMode(hybrid.SHM))
	for r, tr := range ts {
		for p := range ts {
			if p != r {
				assert.Equal(t, hybrid.ViaSHM, tr.Via(p), "rank %d to %d", r, p)
			}
		}
	}
}

// TestModeMismatch: ranks that disagree on the mode all fail, none hangs.
func TestModeMismatch(t *testing.T) {
	ts, errs := start(t, []string{"A", "A", "A"}, func(r int) []hybrid.Option {
		if r == 1 {
			return []hybrid.Option{hybrid.WithMode(hybrid.TCP)}
		}
		return nil
	})
	defer closeAll(ts)
	for r, err := range errs {
		require.ErrorIs(t, err, hybrid.ErrMismatch, "rank %d", r)
		assert.Nil(t, ts[r])
	}
}

// badSHM makes rank 1's shared-memory setup fail (an invalid ring size).
func badSHM(r int) []hybrid.Option {
	if r == 1 {
		return []hybrid.Option{hybrid.WithSHM(shm.WithRingSize(3))}
	}
	return nil
}

// TestAutoFallback: when shared memory fails on a host in mode Auto, that
// host's ranks agree to use TCP, log a warning, and the other host keeps
// shared memory.
func TestAutoFallback(t *testing.T) {
	var logs transporttest.LogBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ts, errs := start(t, []string{"A", "A", "B", "B"}, badSHM, hybrid.WithLogger(log))
	defer closeAll(ts)
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	assert.Equal(t, hybrid.ViaTCP, ts[0].Via(1))
	assert.Equal(t, hybrid.ViaTCP, ts[1].Via(0))
	assert.Equal(t, hybrid.ViaSHM, ts[2].Via(3))
	assert.Equal(t, hybrid.ViaSHM, ts[3].Via(2))
	out := logs.String()
	assert.Contains(t, out, "shared memory could not be set up")
	assert.Contains(t, out, "failed_rank=1")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, ts[1].Send(ctx, 0, 1, transport.Header{}, []byte("over tcp")))
	m, err := ts[0].Recv(ctx, 1, 1)
	require.NoError(t, err)
	assert.Equal(t, "over tcp", string(m.Payload))
}

// TestSHMFailure: in mode SHM the ranks of the host where shared memory
// fails all return an *SHMError naming the rank that failed; the other
// host's ranks are unaffected by it.
func TestSHMFailure(t *testing.T) {
	ts, errs := start(t, []string{"A", "A", "B", "B"}, badSHM, hybrid.WithMode(hybrid.SHM))
	defer closeAll(ts)
	for r := range 2 {
		var se *hybrid.SHMError
		require.ErrorAs(t, errs[r], &se, "rank %d", r)
		assert.Equal(t, 1, se.Rank, "rank %d", r)
		assert.Equal(t, 0, se.Host, "rank %d", r)
		assert.ErrorIs(t, errs[r], hybrid.ErrSHMSetup)
		assert.Contains(t, errs[r].Error(), "rank 1")
	}
	require.ErrorIs(t, errs[1], shm.ErrInvalidArgument, "the failing rank's own cause")
	for r := 2; r < 4; r++ {
		require.NoError(t, errs[r], "rank %d", r)
		assert.Equal(t, hybrid.ViaSHM, ts[r].Via(5-r))
	}
}

// TestAutoFallbackAuth: a rank whose shared-memory handshake fails
// authentication (another token) makes its host fall back to TCP.
func TestAutoFallbackAuth(t *testing.T) {
	ts, errs := start(t, []string{"A", "A"}, func(r int) []hybrid.Option {
		if r == 1 {
			return []hybrid.Option{hybrid.WithSHM(shm.WithToken([]byte("another token")))}
		}
		return nil
	})
	defer closeAll(ts)
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	assert.Equal(t, hybrid.ViaTCP, ts[0].Via(1))
	assert.Equal(t, hybrid.ViaTCP, ts[1].Via(0))
}

func TestOptions(t *testing.T) {
	ctx := context.Background()
	for i, o := range []hybrid.Option{
		nil,
		hybrid.WithHostID(""),
		hybrid.WithHostID(strings.Repeat("x", hybrid.MaxHostID+1)),
		hybrid.WithMode(hybrid.Mode(7)),
		hybrid.WithSetupTimeout(0),
		hybrid.WithToken([]byte("short")),
		hybrid.WithLogger(nil),
		hybrid.WithTCP(nil),
		hybrid.WithSHM(nil),
	} {
		_, err := hybrid.Rendezvous(ctx, 0, 1, "127.0.0.1:0", o)
		require.ErrorIs(t, err, hybrid.ErrInvalidArgument, "option %d", i)
	}
	_, err := hybrid.Rendezvous(ctx, 0, 1, "127.0.0.1:0", hybrid.WithInsecure(), hybrid.WithTCP(tcp.WithMaxFrame(-1)))
	require.ErrorIs(t, err, tcp.ErrInvalidArgument)
	_, err = hybrid.Rendezvous(ctx, 0, 2, "127.0.0.1:0")
	require.ErrorIs(t, err, tcp.ErrInvalidArgument, "no token")

	for s, m := range map[string]hybrid.Mode{"auto": hybrid.Auto, "tcp": hybrid.TCP, "shm": hybrid.SHM} {
		got, err := hybrid.ParseMode(s)
		require.NoError(t, err)
		assert.Equal(t, m, got)
		assert.Equal(t, s, m.String())
	}
	for _, s := range []string{"", "TCP", "mpi", "shm "} {
		_, err := hybrid.ParseMode(s)
		require.ErrorIs(t, err, hybrid.ErrInvalidArgument, "%q", s)
	}
}

// TestWorldOne: a world of one needs nothing but its TCP listener.
func TestWorldOne(t *testing.T) {
	tr, err := hybrid.Rendezvous(context.Background(), 0, 1, "127.0.0.1:0", hybrid.WithInsecure(), hybrid.WithMode(hybrid.SHM))
	require.NoError(t, err)
	assert.Equal(t, hybrid.ViaSelf, tr.Via(0))
	assert.Equal(t, []int{0}, tr.Hosts())
	require.NoError(t, tr.Close())
	require.NoError(t, tr.Close())
	err = tr.Send(context.Background(), 0, 1, transport.Header{}, nil)
	require.ErrorIs(t, err, transport.ErrClosed)
}

// TestPeerLostEachRoute: a crashed rank is named by a *transport.PeerError
// on its shared-memory peer and on its TCP peer alike.
func TestPeerLostEachRoute(t *testing.T) {
	ts := mesh(t, []string{"A", "B", "A"})
	require.Equal(t, hybrid.ViaSHM, ts[0].Via(2))
	require.Equal(t, hybrid.ViaTCP, ts[1].Via(2))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := make(chan error, 2)
	for r := range 2 {
		go func() { _, err := ts[r].Recv(ctx, 2, 9); errs <- err }()
	}
	time.Sleep(20 * time.Millisecond)
	ts[2].Kill()
	for range 2 {
		err := <-errs
		var pe *transport.PeerError
		require.ErrorAs(t, err, &pe)
		assert.Equal(t, 2, pe.Rank)
		assert.ErrorIs(t, err, transport.ErrPeerLost)
	}
}

// TestPeerWithoutHybrid: a peer that joined over plain TCP and never sends
// its host identity makes Rendezvous fail within the setup timeout, naming
// it, instead of hanging.
func TestPeerWithoutHybrid(t *testing.T) {
	port, err := portpick.Free("127.0.0.1")
	require.NoError(t, err)
	master := fmt.Sprintf("127.0.0.1:%d", port)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var plain *tcp.Transport
	var perr error
	var wg sync.WaitGroup
	wg.Go(func() {
		plain, perr = tcp.Rendezvous(ctx, 1, 2, master, tcp.WithToken(testToken), tcp.WithLogger(quiet()))
	})
	start := time.Now()
	_, err = hybrid.Rendezvous(ctx, 0, 2, master, hybrid.WithToken(testToken), hybrid.WithLogger(quiet()),
		hybrid.WithSetupTimeout(300*time.Millisecond))
	elapsed := time.Since(start)
	wg.Wait()
	require.NoError(t, perr)
	defer plain.Close()
	var pe *transport.PeerError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, 1, pe.Rank)
	assert.ErrorIs(t, err, hybrid.ErrProtocol)
	assert.Less(t, elapsed, 10*time.Second)
}
