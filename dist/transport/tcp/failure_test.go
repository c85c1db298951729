package tcp

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/tcp/internal/wire"
	"github.com/gdist/gdist/internal/launch"
)

// logRecorder is a slog.Handler that keeps the records it gets.
type logRecorder struct {
	mu   sync.Mutex
	recs []map[string]string
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logRecorder) WithGroup(string) slog.Handler            { return h }
func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	m := map[string]string{"msg": r.Message}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
	h.mu.Lock()
	h.recs = append(h.recs, m)
	h.mu.Unlock()
	return nil
}

// reasons returns the "reason" of every refused connection so far.
func (h *logRecorder) reasons() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range h.recs {
		if r["msg"] == "tcp: refused connection" {
			out = append(out, r["reason"])
		}
	}
	return out
}

// fakeClient is a hand-driven client: it runs the client side of the
// handshake as `rank` of a job of `world` ranks with the given token.
func fakeClient(t *testing.T, addr string, rank, world int, token []byte, server int, mode uint8) (*net.TCPConn, *frameReader, error) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	conn := c.(*net.TCPConn)
	t.Cleanup(func() { conn.Close() })
	cfg := defaultConfig()
	cfg.token = token
	fake := &Transport{rank: rank, world: world, cfg: cfg}
	br := newFrameReader(conn, readBuf)
	_, err = fake.clientHandshake(context.Background(), conn, br, server, mode)
	return conn, br, err
}

// rawReject sends b on a fresh connection and returns the reason of the
// Reject frame that comes back (0 if the server just hangs up).
func rawReject(t *testing.T, addr string, b []byte) wire.RejectReason {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.Write(b)
	h, _, err := readFrame(c, 0)
	if err != nil {
		t.Logf("no reject: %v", err)
		return 0
	}
	require.Equal(t, wire.Reject, h.Kind)
	return wire.RejectReason(h.Tag)
}

func header(h wire.Header) []byte {
	b := make([]byte, wire.HeaderSize)
	h.Put(b)
	return b
}

// TestHandshakeRefusals: bad clients are refused and logged while the real
// job (3 ranks) sets up and runs.
func TestHandshakeRefusals(t *testing.T) {
	rec := &logRecorder{}
	lns, addrs := listeners(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ts := make([]*Transport, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	start := func(i int) {
		wg.Go(func() {
			ts[i], errs[i] = New(ctx, i, 3, lns[i], addrs, WithToken(testToken),
				WithLogger(slog.New(rec)), WithHandshakeTimeout(300*time.Millisecond))
		})
	}
	start(0)
	start(1)
	a0 := addrs[0]

	// Rank 0 is waiting for ranks 1 and 2; attackers knock first.
	silent, err := net.Dial("tcp", a0) // says nothing: handshake timeout
	require.NoError(t, err)
	defer silent.Close()
	_, _, err = fakeClient(t, a0, 2, 3, []byte("wrong-token-0123456789"), 0, wire.ModeMesh)
	require.ErrorIs(t, err, ErrAuth, "the server refuses the client's proof")
	requireRejected(t, err, wire.RejectAuth)
	_, _, err = fakeClient(t, a0, 2, 4, testToken, 0, wire.ModeMesh)
	requireRejected(t, err, wire.RejectWorld)
	var rj *RejectedError
	require.ErrorAs(t, err, &rj)
	assert.Equal(t, uint64(3), rj.Detail, "an authenticated client learns the server's world size")
	_, _, err = fakeClient(t, a0, 7, 3, testToken, 0, wire.ModeMesh)
	requireRejected(t, err, wire.RejectRank)
	_, _, err = fakeClient(t, a0, 0, 3, testToken, 0, wire.ModeMesh)
	requireRejected(t, err, wire.RejectRank)
	_, _, err = fakeClient(t, a0, 2, 3, testToken, 1, wire.ModeMesh)
	requireRejected(t, err, wire.RejectRank)
	_, _, err = fakeClient(t, a0, 2, 3, testToken, 0, wire.ModeRendezvous)
	requireRejected(t, err, wire.RejectMode)
	assert.Equal(t, wire.RejectProtocol, rawReject(t, a0, []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n0123456789abcdef")))
	bad := header(wire.Header{Kind: wire.Hello, Len: wire.HelloSize})
	bad[2] = wire.Version - 1 // the previous version
	assert.Equal(t, wire.RejectProtocol, rawReject(t, a0, bad))
	assert.Equal(t, wire.RejectProtocol, rawReject(t, a0, header(wire.Header{Kind: wire.Hello, Src: 2, Len: 1 << 40})))
	assert.Equal(t, wire.RejectProtocol, rawReject(t, a0, header(wire.Header{Kind: wire.Data, Src: 2, Len: 10})))
	// A client with the wrong token gets a nonce and a refusal, nothing that
	// depends on the token.
	wrongAuth(t, a0)

	start(2)
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "rank %d", i)
	}
	defer func() {
		for _, tr := range ts {
			tr.Close()
		}
	}()

	// The mesh is complete: an impostor with the right token is a duplicate.
	_, _, err = fakeClient(t, a0, 2, 3, testToken, 0, wire.ModeMesh)
	requireRejected(t, err, wire.RejectDuplicate)
	_, _, err = fakeClient(t, addrs[1], 2, 3, testToken, 1, wire.ModeMesh)
	requireRejected(t, err, wire.RejectDuplicate)

	// The job works.
	for i := range ts {
		for j := range ts {
			require.NoError(t, ts[i].Send(ctx, j, 1, transport.Header{}, []byte{byte(i)}))
		}
	}
	for i := range ts {
		for j := range ts {
			m, err := ts[j].Recv(ctx, i, 1)
			require.NoError(t, err)
			require.Equal(t, []byte{byte(i)}, m.Payload)
		}
	}

	require.Eventually(t, func() bool {
		var codes []wire.RejectReason
		for _, r := range ts[0].refused.list() {
			codes = append(codes, r.Code)
		}
		for _, want := range []wire.RejectReason{wire.RejectAuth, wire.RejectWorld, wire.RejectRank,
			wire.RejectMode, wire.RejectProtocol, wire.RejectDuplicate} {
			if !slices.Contains(codes, want) {
				return false
			}
		}
		return slices.Contains(codes, 0) // the silent one timed out
	}, 5*time.Second, 10*time.Millisecond, "refusals recorded: %v", ts[0].refused.list())
	reasons := rec.reasons()
	// Rank 0 refused 13 connections and rank 1 one; rank 0 logged a burst
	// and then held back (one more line may come if the test took over 10 s).
	assert.GreaterOrEqual(t, len(reasons), refusalBurst+1, "%v", reasons)
	assert.LessOrEqual(t, len(reasons), refusalBurst+2, "refusals are rate-limited: %v", reasons)
	assert.Contains(t, reasons, "authentication failed: wrong GDIST_TOKEN?")
	for _, r := range ts[0].refused.list() {
		switch r.Code {
		case wire.RejectWorld:
			assert.Equal(t, "world size mismatch: world size 4, this job has 3", r.Reason)
		case wire.RejectDuplicate:
			assert.Regexp(t, `^duplicate rank: rank 2 already joined from 127\.0\.0\.1:\d+$`, r.Reason)
		case 0:
			assert.Equal(t, "did not complete the handshake in time", r.Reason)
		}
	}
}

// wrongAuth runs a client with the wrong token by hand: the server gives it
// nothing but a nonce, then refuses its proof without proving anything
// itself.
func wrongAuth(t *testing.T, addr string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	info := wire.HelloInfo{World: 3, Peer: 0, QueueLimit: 1, MaxFrame: 1 << 20}
	hello := make([]byte, wire.HelloSize)
	info.Put(hello)
	require.NoError(t, writeFrame(c, wire.Header{Kind: wire.Hello, Src: 2}, hello))
	h, ch, err := readFrame(c, wire.ChallengeSize)
	require.NoError(t, err)
	require.Equal(t, wire.Challenge, h.Kind)
	require.Len(t, ch, wire.NonceSize, "the challenge is a nonce and nothing else")
	var nonce [wire.NonceSize]byte
	copy(nonce[:], ch)
	mac := wire.ClientMAC([]byte("wrong-token-0123456789"), hello, nonce, 2, 0)
	require.NoError(t, writeFrame(c, wire.Header{Kind: wire.Auth, Src: 2}, mac[:]))
	h, p, err := readFrame(c, 1<<20)
	require.NoError(t, err)
	require.Equal(t, wire.Reject, h.Kind)
	require.Equal(t, wire.RejectAuth, wire.RejectReason(h.Tag))
	require.Zero(t, h.Stamp, "no detail for an unauthenticated client")
	require.Empty(t, p)
}

func requireRejected(t *testing.T, err error, reason wire.RejectReason) {
	t.Helper()
	var rj *RejectedError
	require.ErrorAs(t, err, &rj)
	require.Equal(t, reason, rj.Reason, "%v", err)
}

// TestWrongTokenFailsSetup: a rank with the wrong token gets an error
// matching ErrAuth at once instead of retrying until its context ends.
func TestWrongTokenFailsSetup(t *testing.T) {
	lns, addrs := listeners(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r0 := make(chan error, 1)
	go func() {
		tr, err := New(ctx, 0, 2, lns[0], addrs, WithToken(testToken), WithLogger(quiet()))
		if err == nil {
			tr.Close()
		}
		r0 <- err
	}()
	start := time.Now()
	_, err := New(ctx, 1, 2, lns[1], addrs, WithToken([]byte("not the job token, but long enough")), WithLogger(quiet()))
	require.ErrorIs(t, err, ErrAuth)
	assert.Less(t, time.Since(start), 5*time.Second)
	cancel()
	require.ErrorIs(t, <-r0, context.Canceled)
}

// TestHugeFrameAfterHandshake: an authenticated peer announcing a 1 TiB
// frame is treated as lost without anything near that size being allocated.
func TestHugeFrameAfterHandshake(t *testing.T) {
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
		tr, err := New(ctx, 0, 2, lns[0], addrs, WithToken(testToken), WithLogger(quiet()))
		r0 <- res{tr, err}
	}()
	conn, _, err := fakeClient(t, addrs[0], 1, 2, testToken, 0, wire.ModeMesh)
	require.NoError(t, err)
	r := <-r0
	require.NoError(t, r.err)
	defer r.t.Close()

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err = conn.Write(header(wire.Header{Kind: wire.Data, Src: 1, Tag: 1, Len: 1 << 40}))
	require.NoError(t, err)
	_, err = r.t.Recv(ctx, 1, 1)
	runtime.ReadMemStats(&after)
	var pe *transport.PeerError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, 1, pe.Rank)
	assert.ErrorIs(t, err, transport.ErrPeerLost)
	assert.ErrorIs(t, err, transport.ErrFrameTooLarge)
	assert.ErrorIs(t, err, ErrProtocol)
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(4<<20), "bytes allocated while refusing the frame")
}

// TestHeartbeatTimeout: a peer that completed the handshake and then went
// silent (reads nothing, writes nothing) is detected as lost.
func TestHeartbeatTimeout(t *testing.T) {
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
			WithHeartbeat(20*time.Millisecond, 300*time.Millisecond))
		r0 <- res{tr, err}
	}()
	_, _, err := fakeClient(t, addrs[0], 1, 2, testToken, 0, wire.ModeMesh)
	require.NoError(t, err)
	r := <-r0
	require.NoError(t, r.err)
	defer r.t.Close()
	start := time.Now()
	_, err = r.t.Recv(ctx, 1, 1)
	el := time.Since(start)
	var pe *transport.PeerError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, 1, pe.Rank)
	assert.ErrorIs(t, err, transport.ErrPeerLost)
	assert.ErrorIs(t, err, transport.ErrPeerUnresponsive)
	assert.ErrorIs(t, err, ErrHeartbeatTimeout)
	assert.Less(t, el, 2*time.Second)
	assert.GreaterOrEqual(t, el, 250*time.Millisecond)
	require.ErrorIs(t, r.t.Send(ctx, 1, 1, transport.Header{}, nil), transport.ErrPeerLost)
}

// TestHeartbeatTimeoutSentinel: ErrHeartbeatTimeout itself matches
// transport.ErrPeerUnresponsive and ErrPeerLost, so dist classifies a
// frozen peer without importing this package.
func TestHeartbeatTimeoutSentinel(t *testing.T) {
	err := fmt.Errorf("recv: %w", ErrHeartbeatTimeout)
	assert.ErrorIs(t, err, transport.ErrPeerUnresponsive)
	assert.ErrorIs(t, err, transport.ErrPeerLost)
	assert.Equal(t, "tcp: heartbeat timeout", ErrHeartbeatTimeout.Error())
}

// TestHeartbeatKeepsIdleAndSlowLinksAlive: idle links, and a receiver that
// leaves a full queue alone for many heartbeat timeouts, are not mistaken
// for lost peers.
func TestHeartbeatKeepsIdleAndSlowLinksAlive(t *testing.T) {
	ts := mesh(t, 2, WithHeartbeat(10*time.Millisecond, 250*time.Millisecond), WithQueueLimit(64<<10))
	defer ts[1].Close()
	defer ts[0].Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	time.Sleep(time.Second) // idle
	sent := make(chan error, 1)
	go func() {
		for i := range 20 {
			if err := ts[0].Send(ctx, 1, 1, seqHdr(uint64(i)), make([]byte, 16<<10)); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	time.Sleep(time.Second) // sender blocked on a full queue
	for i := range 20 {
		m, err := ts[1].Recv(ctx, 0, 1)
		require.NoError(t, err)
		require.Equal(t, uint64(i), seqOf(m.Header))
	}
	require.NoError(t, <-sent)
}

// TestSendTooLarge: Send refuses a message over the receiver's maximum
// frame; self-sends obey this rank's own maximum.
func TestSendTooLarge(t *testing.T) {
	lns, addrs := listeners(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ts := make([]*Transport, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			var err error
			ts[i], err = New(ctx, i, 2, lns[i], addrs, WithToken(testToken), WithLogger(quiet()), WithMaxFrame(1000*(i+1)))
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	require.NotNil(t, ts[0])
	require.NotNil(t, ts[1])
	defer ts[1].Close()
	defer ts[0].Close()
	require.NoError(t, ts[0].Send(ctx, 1, 1, transport.Header{}, make([]byte, 2000)))
	require.ErrorIs(t, ts[0].Send(ctx, 1, 1, transport.Header{}, make([]byte, 2001)), transport.ErrFrameTooLarge)
	require.ErrorIs(t, ts[0].Send(ctx, 0, 1, transport.Header{}, make([]byte, 1001)), transport.ErrFrameTooLarge)
	require.ErrorIs(t, ts[1].Send(ctx, 0, 1, transport.Header{}, make([]byte, 1001)), transport.ErrFrameTooLarge)
	m, err := ts[1].Recv(ctx, 0, 1)
	require.NoError(t, err)
	require.Len(t, m.Payload, 2000)
}

func TestConfigErrors(t *testing.T) {
	ctx := context.Background()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	addrs := []string{ln.Addr().String(), "x:1"}
	for _, c := range []struct {
		name        string
		rank, world int
		addrs       []string
		opts        []Option
	}{
		{"no token", 0, 2, addrs, nil},
		{"rank", 2, 2, addrs, []Option{WithInsecure()}},
		{"world", 0, 0, nil, []Option{WithInsecure()}},
		{"addrs", 0, 2, addrs[:1], []Option{WithInsecure()}},
		{"heartbeat", 0, 2, addrs, []Option{WithInsecure(), WithHeartbeat(time.Second, time.Second)}},
		{"max frame", 0, 2, addrs, []Option{WithInsecure(), WithMaxFrame(0)}},
		{"handshake", 0, 2, addrs, []Option{WithInsecure(), WithHandshakeTimeout(0)}},
		{"listen addr", 0, 2, addrs, []Option{WithInsecure(), WithListenAddr("127.0.0.1:0")}},
		{"empty token", 0, 2, addrs, []Option{WithToken(nil)}},
		{"short token", 0, 2, addrs, []Option{WithToken([]byte("fifteen-bytes!!"))}},
		{"short hex token", 0, 2, addrs, []Option{WithToken([]byte("0123456789abcdef0123456789abcde"))}},
		{"init timeout", 0, 2, addrs, []Option{WithInsecure(), WithInitTimeout(0)}},
		{"heartbeat ratio", 0, 2, addrs, []Option{WithInsecure(), WithHeartbeat(time.Second, 1999*time.Millisecond)}},
		{"queue limit", 0, 2, addrs, []Option{WithInsecure(), WithQueueLimit(-1)}},
		{"nil option", 0, 2, addrs, []Option{nil}},
	} {
		_, err := New(ctx, c.rank, c.world, ln, c.addrs, c.opts...)
		require.ErrorIs(t, err, ErrInvalidArgument, c.name)
	}
	_, err = Rendezvous(ctx, 0, 2, "127.0.0.1:0")
	require.ErrorIs(t, err, ErrInvalidArgument)
}

// TestSingleRank: a world of one needs no token and no listener.
// TestTokenStrength: tokens are refused below 128 bits, hex tokens counted
// two digits a byte; launch's generated tokens and the tests' tokens pass.
func TestTokenStrength(t *testing.T) {
	for tok, ok := range map[string]bool{
		"":                                 false,
		"fifteen-bytes!!":                  false,
		"sixteen-bytes!!!":                 true,
		"0123456789abcdef":                 false, // 16 hex digits: 8 bytes
		"0123456789abcdef0123456789abcde":  false, // 31 hex digits
		"0123456789abcdef0123456789ABCDEF": true,  // 32 hex digits: 16 bytes
		"0123456789abcdef0123456789abcdeg": true,  // not hex: 32 bytes
		string(testToken):                  true,
	} {
		_, err := apply([]Option{WithToken([]byte(tok))})
		if ok {
			assert.NoError(t, err, "%q", tok)
			continue
		}
		require.ErrorIs(t, err, ErrInvalidArgument, "%q", tok)
		assert.Contains(t, err.Error(), "too short", "%q", tok)
	}
	gen, err := launch.NewToken()
	require.NoError(t, err)
	_, err = apply([]Option{WithToken([]byte(gen))})
	require.NoError(t, err, "launch's generated token %q", gen)
	_, err = apply([]Option{WithToken([]byte(rand.Text()))})
	require.NoError(t, err, "rand.Text, as tests use")
}

func TestSingleRank(t *testing.T) {
	ctx := context.Background()
	tr, err := New(ctx, 0, 1, nil, []string{""})
	require.NoError(t, err)
	require.Nil(t, tr.Addr())
	require.NoError(t, tr.Send(ctx, 0, 1, seqHdr(9), []byte("me")))
	m, err := tr.Recv(ctx, 0, 1)
	require.NoError(t, err)
	require.Equal(t, []byte("me"), m.Payload)
	require.NoError(t, tr.Close())

	tr, err = Rendezvous(ctx, 0, 1, "127.0.0.1:0")
	require.NoError(t, err)
	require.NotNil(t, tr.Addr())
	require.NoError(t, tr.Close())
}

// TestRendezvous: four ranks started in a scrambled order meet through rank
// 0; one listens on 0.0.0.0 and advertises the address it reaches rank 0
// from.
func TestRendezvous(t *testing.T) {
	const n = 4
	master := freeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ts := make([]*Transport, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for _, i := range []int{2, 3, 0, 1} {
		wg.Go(func() {
			opts := []Option{WithToken(testToken), WithLogger(quiet())}
			if i == 3 {
				opts = append(opts, WithListenAddr("0.0.0.0:0"))
			}
			ts[i], errs[i] = Rendezvous(ctx, i, n, master, opts...)
		})
		time.Sleep(30 * time.Millisecond)
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "rank %d", i)
	}
	defer func() {
		for _, tr := range ts {
			tr.Close()
		}
	}()
	host, _, err := net.SplitHostPort(ts[1].addrs[3])
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1", host, "rank 3 listens on 0.0.0.0 and advertises its loopback address")
	_, port3, _ := net.SplitHostPort(ts[3].Addr().String())
	assert.Equal(t, net.JoinHostPort("127.0.0.1", port3), ts[2].addrs[3])
	assert.Equal(t, ts[1].Addr().String(), ts[3].addrs[1])

	for i := range ts {
		for j := range ts {
			require.NoError(t, ts[i].Send(ctx, j, 1, transport.Header{}, []byte{byte(i), byte(j)}))
		}
	}
	for i := range ts {
		for j := range ts {
			m, err := ts[j].Recv(ctx, i, 1)
			require.NoError(t, err)
			require.Equal(t, []byte{byte(i), byte(j)}, m.Payload)
		}
	}
}

// TestRendezvousWrongToken: a rank with the wrong token is refused by rank
// 0 and fails; the others, with the right token, are not disturbed.
func TestRendezvousWrongToken(t *testing.T) {
	master := freeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	ts := make([]*Transport, 3)
	errs := make([]error, 3)
	for i := range 3 {
		wg.Go(func() {
			ts[i], errs[i] = Rendezvous(ctx, i, 3, master, WithToken(testToken), WithLogger(quiet()))
		})
	}
	time.Sleep(50 * time.Millisecond)
	_, err := Rendezvous(ctx, 2, 3, master, WithToken([]byte("a wrong token, long enough")), WithLogger(quiet()))
	require.ErrorIs(t, err, ErrAuth)
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "rank %d", i)
		defer ts[i].Close()
	}
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	a := ln.Addr().String()
	ln.Close()
	return a
}

// TestKilledPeer: rank 1 runs in a child process; when it is killed with
// SIGKILL, rank 0's pending Recv from it returns a *PeerError within 5 s.
func TestKilledPeer(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("needs SIGKILL")
	}
	lns, addrs := listeners(t, 2)
	lns[1].Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type res struct {
		t   *Transport
		err error
	}
	r0 := make(chan res, 1)
	go func() {
		tr, err := New(ctx, 0, 2, lns[0], addrs, WithToken(testToken), WithLogger(quiet()))
		r0 <- res{tr, err}
	}()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"=killed", envChildMaster+"="+addrs[0])
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	require.NoError(t, cmd.Start())
	defer cmd.Process.Kill()
	r := <-r0
	require.NoError(t, r.err)
	defer r.t.Close()

	m, err := r.t.Recv(ctx, 1, 1)
	require.NoError(t, err)
	require.Equal(t, "ready", string(m.Payload))

	pending := make(chan error, 1)
	go func() { _, err := r.t.Recv(ctx, 1, 5); pending <- err }()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	killed := time.Now()
	select {
	case err := <-pending:
		var pe *transport.PeerError
		require.ErrorAs(t, err, &pe)
		assert.Equal(t, 1, pe.Rank)
		assert.ErrorIs(t, err, transport.ErrPeerLost)
		t.Logf("pending Recv failed %v after SIGKILL: %v", time.Since(killed), err)
	case <-time.After(5 * time.Second):
		t.Fatal("pending Recv did not fail within 5 s of the peer's SIGKILL")
	}
	var exit *exec.ExitError
	require.True(t, errors.As(cmd.Wait(), &exit))
}

// TestLostPeerNamedBySurvivors kills one rank of four while every survivor
// waits on it and on another survivor: each survivor's receive from the
// dead rank fails naming it (not a survivor that noticed first), and the
// receives between survivors still complete.
func TestLostPeerNamedBySurvivors(t *testing.T) {
	for round := 0; round < 5; round++ {
		ts := mesh(t, 4)
		errs := make(chan error, 3)
		live := make(chan error, 3)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		for r := 0; r < 3; r++ {
			go func(r int) {
				_, err := ts[r].Recv(ctx, 3, 1)
				errs <- err
			}(r)
			go func(r int) {
				_, err := ts[r].Recv(ctx, (r+1)%3, 1)
				live <- err
			}(r)
		}
		time.Sleep(20 * time.Millisecond)
		ts[3].Kill()
		for range 3 {
			err := <-errs
			var pe *transport.PeerError
			require.ErrorAs(t, err, &pe)
			require.Equal(t, 3, pe.Rank, "survivor named the wrong rank: %v", err)
			require.ErrorIs(t, err, transport.ErrPeerLost)
		}
		for r := 0; r < 3; r++ {
			require.NoError(t, ts[(r+1)%3].Send(ctx, r, 1, transport.Header{}, []byte("here")))
		}
		for range 3 {
			require.NoError(t, <-live)
		}
		cancel()
		for _, tr := range ts {
			start := time.Now()
			require.NoError(t, tr.Close())
			require.Less(t, time.Since(start), time.Second, "Close after a lost peer must not linger")
		}
	}
}

// TestSelfConnected: dialing a loopback port nobody listens on from that
// same port connects the socket to itself (TCP simultaneous open), which a
// dial to a rank that is not listening yet can hit by chance when the
// kernel picks the target port as the ephemeral one; dial must recognise
// it (and retry) instead of handshaking with itself.
func TestSelfConnected(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())

	addr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}
	d := net.Dialer{LocalAddr: addr, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr.String())
	if err != nil {
		t.Skipf("this kernel does not connect a socket to itself: %v", err)
	}
	assert.True(t, selfConnected(c), "%v -> %v", c.LocalAddr(), c.RemoteAddr())
	require.NoError(t, c.Close())

	ln, err = net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		if s, err := ln.Accept(); err == nil {
			s.Close()
		}
	}()
	c, err = net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	assert.False(t, selfConnected(c))
}

// TestFailedTransportStillSendsReserved (the rule it tested is gone; the
// test keeps its name so the history reads): once rank 1 has lost rank 2,
// only the calls involving rank 2 fail. Every tag to rank 0 still works —
// the transport gives no tag a meaning — so the process group's abort
// notice reaches rank 0 ahead of rank 1's goodbye.
func TestFailedTransportStillSendsReserved(t *testing.T) {
	ts := mesh(t, 3)
	defer func() {
		for _, tr := range ts {
			tr.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Rank 1 loses rank 2 (only rank 1 notices).
	ts[1].fail(2, fmt.Errorf("%w: test", transport.ErrPeerLost))
	_, err := ts[1].Recv(ctx, 2, 1)
	requirePeer(t, err, 2, transport.ErrPeerLost)
	_, _, err = ts[1].RecvInto(ctx, 2, 1, nil)
	requirePeer(t, err, 2, transport.ErrPeerLost)
	requirePeer(t, ts[1].Send(ctx, 2, 7, transport.Header{}, []byte("x")), 2, transport.ErrPeerLost)

	for _, tag := range []uint32{7, 0xFFF00001} {
		require.NoError(t, ts[1].Send(ctx, 0, tag, transport.Header{9}, []byte("why")))
	}
	require.NoError(t, ts[0].Send(ctx, 1, 7, transport.Header{}, []byte("ack")))
	m, err := ts[1].Recv(ctx, 0, 7)
	require.NoError(t, err, "rank 1 still receives from rank 0")
	assert.Equal(t, "ack", string(m.Payload))
	require.NoError(t, ts[1].Close())
	for _, tag := range []uint32{7, 0xFFF00001} {
		m, err := ts[0].Recv(ctx, 1, tag)
		require.NoError(t, err, "the message arrives before rank 1's goodbye")
		assert.Equal(t, "why", string(m.Payload))
		assert.Equal(t, transport.Header{9}, m.Header)
		_, err = ts[0].Recv(ctx, 1, tag)
		require.ErrorIs(t, err, transport.ErrPeerClosed, "then rank 1 is gone")
	}
}

func requirePeer(t *testing.T, err error, rank int, cause error) {
	t.Helper()
	var pe *transport.PeerError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, rank, pe.Rank)
	require.ErrorIs(t, err, cause)
}
