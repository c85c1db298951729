//go:build linux

package shm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/shm/internal/ring"
	"github.com/gdist/gdist/dist/transport/transporttest"
)

// devShm lists /dev/shm.
func devShm(t *testing.T) []string {
	t.Helper()
	es, err := os.ReadDir("/dev/shm")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

// requireShmClean fails unless /dev/shm holds nothing that was not in before.
func requireShmClean(t *testing.T, before []string) {
	t.Helper()
	var added []string
	for _, n := range devShm(t) {
		if !slices.Contains(before, n) {
			added = append(added, n)
		}
	}
	require.Empty(t, added, "left behind in /dev/shm")
}

// child starts this test binary as rank 1 in mode; rank 0 is the returned
// transport, set up in this process. stdout of the child is returned.
func child(t *testing.T, mode string, opts ...Option) (*Transport, *exec.Cmd, *bufio.Reader) {
	t.Helper()
	name := jobName(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"="+mode, envName+"="+name)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o := append([]Option{WithToken(testToken), WithLogger(quiet())}, opts...)
	tr, err := Rendezvous(ctx, 0, 2, name, o...)
	require.NoError(t, err)
	t.Cleanup(func() { tr.Close() })
	return tr, cmd, bufio.NewReader(out)
}

func requirePeerErr(t *testing.T, err error, rank int, cause error) {
	t.Helper()
	var pe *transport.PeerError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, rank, pe.Rank)
	require.ErrorIs(t, err, cause)
}

// TestKilledMidMessage: a peer process SIGKILLed in the middle of writing
// a message (a posted receive already filling) fails the pending receives
// from it with a *PeerError naming it (ErrPeerLost) at once, through its
// socket; nothing is left in /dev/shm.
func TestKilledMidMessage(t *testing.T) {
	before := devShm(t)
	tr, cmd, out := child(t, childMidMessage)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dst := make([]byte, midMessageLen)
	posted := make(chan error, 1)
	go func() { _, _, err := tr.RecvInto(ctx, 1, 5, dst); posted <- err }()
	queued := make(chan error, 1)
	go func() { _, err := tr.Recv(ctx, 1, 6); queued <- err }()

	line, err := out.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "ready\n", line)
	time.Sleep(50 * time.Millisecond)
	select {
	case err := <-posted:
		t.Fatalf("the receive of a half-written message returned: %v", err)
	default:
	}
	killed := time.Now()
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	for _, c := range []chan error{posted, queued} {
		select {
		case err := <-c:
			requirePeerErr(t, err, 1, transport.ErrPeerLost)
		case <-time.After(5 * time.Second):
			t.Fatal("a receive from a killed peer did not fail")
		}
	}
	t.Logf("killed peer detected after %v", time.Since(killed))
	requirePeerErr(t, tr.Send(ctx, 1, 1, transport.Header{}, []byte("x")), 1, transport.ErrPeerLost)
	cmd.Wait()
	require.NoError(t, tr.Close())
	requireShmClean(t, before)
}

// TestFrozenPeer: a peer process that is stopped (SIGSTOP) is reported as
// unresponsive after the heartbeat timeout.
func TestFrozenPeer(t *testing.T) {
	before := devShm(t)
	const timeout = time.Second
	tr, cmd, _ := child(t, childReady, WithHeartbeat(100*time.Millisecond, timeout))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := tr.Recv(ctx, 1, 1)
	require.NoError(t, err)
	require.Equal(t, "ready", string(m.Payload))
	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	stopped := time.Now()
	_, err = tr.Recv(ctx, 1, 1)
	took := time.Since(stopped)
	requirePeerErr(t, err, 1, transport.ErrPeerUnresponsive)
	require.ErrorIs(t, err, ErrHeartbeatTimeout)
	t.Logf("frozen peer detected after %v (timeout %v)", took, timeout)
	assert.GreaterOrEqual(t, took, timeout-100*time.Millisecond)
	assert.Less(t, took, timeout+2*time.Second)
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	cmd.Wait()
	require.NoError(t, tr.Close())
	requireShmClean(t, before)
}

// TestPauseSurvivedFreezeNamed: with the default heartbeat on both sides, a
// peer stopped (SIGSTOP) for the heartbeat timeout less
// transport.PauseMargin and then resumed (SIGCONT) is not taken for dead,
// by rank 0 or, once resumed, by itself; stopped for good, it is named
// unresponsive after the timeout.
func TestPauseSurvivedFreezeNamed(t *testing.T) {
	if testing.Short() {
		t.Skip("takes 8 s of pause and a 10 s freeze (the default heartbeat timeout)")
	}
	require.Equal(t, transport.DefaultHeartbeatTimeout, DefaultHeartbeatTimeout, "one default across transports")
	tr, cmd, _ := child(t, childPause)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := tr.Recv(ctx, 1, 1)
	require.NoError(t, err)
	require.Equal(t, "ready", string(m.Payload))
	pending := make(chan error, 1)
	go func() { _, err := tr.Recv(ctx, 1, 5); pending <- err }()

	signal := func(sig os.Signal) func() error { return func() error { return cmd.Process.Signal(sig) } }
	err = transporttest.PauseThenFreeze(t, 1, signal(syscall.SIGSTOP), signal(syscall.SIGCONT), pending,
		DefaultHeartbeatTimeout, DefaultHeartbeatInterval)
	assert.ErrorIs(t, err, ErrHeartbeatTimeout)
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	cmd.Wait()
}

// TestPeerExits: a peer that closes and exits normally is seen as closed
// after what it sent is delivered; nothing is left in /dev/shm.
func TestPeerExits(t *testing.T) {
	before := devShm(t)
	tr, cmd, _ := child(t, childExit)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, cmd.Wait())
	m, err := tr.Recv(ctx, 1, 1)
	require.NoError(t, err, "a message sent before Close is delivered after the peer exited")
	require.Equal(t, "bye", string(m.Payload))
	_, err = tr.Recv(ctx, 1, 1)
	requirePeerErr(t, err, 1, transport.ErrPeerClosed)
	require.NoError(t, tr.Close())
	requireShmClean(t, before)
}

// TestPathSocketLeavesNothing: with a path name, the socket files are gone
// once Rendezvous returns, and the directory stays empty after Close.
func TestPathSocketLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "job")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ts := make([]*Transport, 3)
	var wg sync.WaitGroup
	for i := range ts {
		wg.Go(func() {
			var err error
			ts[i], err = Rendezvous(ctx, i, 3, name, WithToken(testToken), WithLogger(quiet()))
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	for _, tr := range ts {
		require.NotNil(t, tr)
	}
	es, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, es)
	require.NoError(t, ts[2].Send(ctx, 0, 1, transport.Header{}, []byte("hi")))
	m, err := ts[0].Recv(ctx, 2, 1)
	require.NoError(t, err)
	require.Equal(t, "hi", string(m.Payload))
	for _, tr := range ts {
		tr.Close()
	}
}

// TestWrongToken: a rank with another token cannot join; setup fails with
// ErrAuth on its side.
func TestWrongToken(t *testing.T) {
	name := jobName(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, tok := range [][]byte{testToken, []byte("another token")} {
		wg.Go(func() {
			tr, err := Rendezvous(ctx, i, 2, name, WithToken(tok), WithLogger(quiet()), WithHandshakeTimeout(time.Second))
			if err == nil {
				tr.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	require.ErrorIs(t, errs[1], ErrAuth)
	require.Error(t, errs[0]) // rank 0 never gets a valid rank 1: its context ends
}

// TestHandshakeRefusals: garbage, a wrong world size and a rank that may
// not connect are refused while the real job sets up.
func TestHandshakeRefusals(t *testing.T) {
	name := jobName(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res := make(chan *Transport, 1)
	go func() {
		tr, err := Rendezvous(ctx, 0, 2, name, WithToken(testToken), WithLogger(quiet()), WithHandshakeTimeout(time.Second))
		assert.NoError(t, err)
		res <- tr
	}()
	addr := SocketName(name, 0)
	dial := func() net.Conn {
		for {
			c, err := net.Dial("unix", addr)
			if err == nil {
				return c
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	reason := func(hello []byte) byte {
		c := dial()
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write(hello)
		b := make([]byte, 2)
		if _, err := c.Read(b); err != nil || b[0] != msgReject {
			return 0
		}
		if b[1] == 0 {
			c.Read(b[1:])
		}
		return b[1]
	}
	good := hello{World: 2, From: 1, To: 0, MaxFrame: 1 << 20}
	enc := func(h hello) []byte {
		b := make([]byte, helloSize)
		h.put(b)
		return b
	}
	assert.Equal(t, byte(rejectProtocol), reason([]byte(strings.Repeat("GET / HTTP/1.1\r\n", 6))))
	bad := good
	bad.World = 3
	assert.Equal(t, byte(rejectWorld), reason(enc(bad)))
	bad = good
	bad.From = 0
	assert.Equal(t, byte(rejectRank), reason(enc(bad)))
	bad = good
	bad.To = 1
	assert.Equal(t, byte(rejectRank), reason(enc(bad)))

	// The real rank 1 still joins.
	tr1, err := Rendezvous(ctx, 1, 2, name, WithToken(testToken), WithLogger(quiet()))
	require.NoError(t, err)
	defer tr1.Close()
	tr0 := <-res
	require.NotNil(t, tr0)
	defer tr0.Close()
	require.NoError(t, tr1.Send(ctx, 0, 1, transport.Header{}, []byte("ok")))
	m, err := tr0.Recv(ctx, 1, 1)
	require.NoError(t, err)
	require.Equal(t, "ok", string(m.Payload))
}

// scribble writes b at off into the ring from `from` to `to` of a mesh
// (ctrl block first, then data), as a hostile or buggy peer could.
func scribble(ts []*Transport, from, to, off int, b []byte) {
	r := ts[from].peers[to].Load().outR
	if off < ring.CtrlSize {
		copy(r.CtrlBytes()[off:], b)
	} else {
		copy(r.DataBytes()[off-ring.CtrlSize:], b)
	}
}

func u64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }

// TestCorruptRing: a peer that writes nonsense into the shared memory
// (indices out of range, a broken record header, an oversized length,
// credit it never got) makes the other side fail that link with a
// *PeerError naming it and wrapping ErrProtocol, without crashing; the
// other links keep working.
func TestCorruptRing(t *testing.T) {
	type corruption struct {
		name string
		do   func(ts []*Transport) // corrupts what rank 1 sees from rank 2, or rank 2's view of rank 1
		send bool                  // rank 1 detects it when sending to rank 2 (else when receiving)
	}
	cases := []corruption{
		{"head beyond the ring", func(ts []*Transport) { scribble(ts, 2, 1, 0, u64(1<<40)) }, false},
		{"bad magic", func(ts []*Transport) {
			p := ts[2].peers[1].Load()
			p.wmu.Lock()
			p.out.Write([]byte(fmt.Sprintf("%-*s", ring.HeaderSize, "this is not a record header")))
			p.out.Publish()
			p.peerBell.Ring()
			p.wmu.Unlock()
		}, false},
		{"seal of another position", func(ts []*Transport) {
			p := ts[2].peers[1].Load()
			p.wmu.Lock()
			var b [ring.HeaderSize]byte
			(&ring.Header{Tag: 1, Len: 8}).Put(b[:])
			binary.LittleEndian.PutUint64(b[:], ring.Seal(p.out.Pos()+ring.Align, 8, false, false))
			p.out.Write(b[:])
			p.out.Write(make([]byte, 8))
			p.out.Publish()
			p.peerBell.Ring()
			p.wmu.Unlock()
		}, false},
		{"whole record longer than the ring", func(ts []*Transport) {
			p := ts[2].peers[1].Load()
			p.wmu.Lock()
			var b [ring.HeaderSize]byte
			(&ring.Header{Tag: 1, Len: 1 << 39}).Put(b[:])
			binary.LittleEndian.PutUint64(b[:], ring.Seal(p.out.Pos(), 1<<39, false, true))
			p.out.Write(b[:])
			p.peerBell.Ring() // sealed but never published: the seal alone announces it
			p.wmu.Unlock()
		}, false},
		{"huge length", func(ts []*Transport) {
			p := ts[2].peers[1].Load()
			p.wmu.Lock()
			h := ring.Header{Tag: 1, Len: 1 << 39}
			p.out.WriteHeader(&h)
			p.out.Publish()
			p.peerBell.Ring()
			p.wmu.Unlock()
		}, false},
		{"tail beyond head", func(ts []*Transport) { scribble(ts, 1, 2, 128, u64(1<<20)) }, true},
		{"credit never granted", func(ts []*Transport) { scribble(ts, 1, 2, 136, u64(1<<40)) }, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ts := mesh(t, 3)
			defer func() {
				for _, tr := range ts {
					tr.Close()
				}
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			// Some traffic first, so that indices are not all zero.
			require.NoError(t, ts[2].Send(ctx, 1, 1, transport.Header{}, []byte("before")))
			_, err := ts[1].Recv(ctx, 2, 1)
			require.NoError(t, err)
			c.do(ts)
			if c.send {
				// The sender reads the peer's indices when those it saw
				// last leave no room, and every recheckEvery sends: make
				// the next send one of those (rank 2 has consumed
				// everything, so nothing overwrites the scribbles).
				p := ts[1].peers[2].Load()
				p.wmu.Lock()
				p.writes = recheckEvery - 1
				p.sends = recheckEvery - 1
				p.wmu.Unlock()
				err = ts[1].Send(ctx, 2, 1, transport.Header{}, make([]byte, 100))
			} else {
				_, err = ts[1].Recv(ctx, 2, 1)
			}
			requirePeerErr(t, err, 2, transport.ErrPeerLost)
			require.ErrorIs(t, err, ErrProtocol)
			// Rank 1 still talks to rank 0.
			require.NoError(t, ts[0].Send(ctx, 1, 1, transport.Header{}, []byte("fine")))
			m, err := ts[1].Recv(ctx, 0, 1)
			require.NoError(t, err)
			require.Equal(t, "fine", string(m.Payload))
		})
	}
}

// TestConfigErrors: invalid options and arguments are refused with ErrInvalidArgument.
func TestConfigErrors(t *testing.T) {
	ctx := context.Background()
	for name, opts := range map[string][]Option{
		"no token":    nil,
		"empty token": {WithToken(nil)},
		"ring size":   {WithToken(testToken), WithRingSize(5000)},
		"tiny ring":   {WithToken(testToken), WithRingSize(1024)},
		"max frame":   {WithToken(testToken), WithMaxFrame(0)},
		"queue limit": {WithToken(testToken), WithQueueLimit(-1)},
		"heartbeat":   {WithToken(testToken), WithHeartbeat(time.Second, time.Second)},
		"handshake":   {WithToken(testToken), WithHandshakeTimeout(0)},
		"spin":        {WithToken(testToken), WithSpin(-1)},
		"nil option":  {nil},
	} {
		_, err := Rendezvous(ctx, 0, 2, jobName(t), opts...)
		require.ErrorIs(t, err, ErrInvalidArgument, name)
	}
	_, err := Rendezvous(ctx, 2, 2, jobName(t), WithToken(testToken))
	require.ErrorIs(t, err, ErrInvalidArgument)
	_, err = Rendezvous(ctx, 0, 2, "", WithToken(testToken))
	require.ErrorIs(t, err, ErrInvalidArgument)
	_, err = New(ctx, 0, 2, make([]*net.UnixConn, 3), WithToken(testToken))
	require.ErrorIs(t, err, ErrInvalidArgument)
}

// socketPair returns two connected Unix stream sockets.
func socketPair(t testing.TB) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		require.NoError(t, err)
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// TestNewSubset: New links only the ranks it is given connections for;
// calls involving the others fail with ErrNoLink.
func TestNewSubset(t *testing.T) {
	a, b := socketPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ts := make([]*Transport, 2)
	var wg sync.WaitGroup
	for i, c := range []*net.UnixConn{a, b} {
		wg.Go(func() {
			conns := make([]*net.UnixConn, 3)
			conns[1-i] = c
			var err error
			ts[i], err = New(ctx, i, 3, conns, WithToken(testToken), WithLogger(quiet()))
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	require.NotNil(t, ts[0])
	require.NotNil(t, ts[1])
	defer ts[0].Close()
	defer ts[1].Close()
	assert.True(t, ts[0].HasLink(1))
	assert.True(t, ts[0].HasLink(0))
	assert.False(t, ts[0].HasLink(2))
	var sm transport.SharedMemory = ts[0]
	assert.True(t, sm.SharedMemory(1))
	assert.False(t, sm.SharedMemory(2))
	require.ErrorIs(t, ts[0].Send(ctx, 2, 1, transport.Header{}, nil), ErrNoLink)
	_, err := ts[0].Recv(ctx, 2, 1)
	require.ErrorIs(t, err, ErrNoLink)
	require.NoError(t, ts[1].Send(ctx, 0, 1, transport.Header{}, []byte("sub")))
	m, err := ts[0].Recv(ctx, 1, 1)
	require.NoError(t, err)
	require.Equal(t, "sub", string(m.Payload))
}

// TestLargeMessagesAcrossProcesses: large messages between two processes
// arrive intact, through remote reads (single copy) or, with it off,
// through the ring.
func TestLargeMessagesAcrossProcesses(t *testing.T) {
	for _, single := range []bool{true, false} {
		t.Run(fmt.Sprint("single-copy=", single), func(t *testing.T) {
			opts := []Option{WithSingleCopy(256 << 10)} // as the child
			if !single {
				opts = append(opts, WithSingleCopy(0)) // this side neither sends nor accepts remote records
			}
			tr, cmd, _ := child(t, childEcho, opts...)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			big := make([]byte, echoSize)
			got := make([]byte, echoSize)
			for i := range echoMsgs {
				for k := range big {
					big[k] = byte(k*13 + i)
				}
				require.NoError(t, tr.Send(ctx, 1, 3, transport.Header{byte(i)}, big))
				h, n, err := tr.RecvInto(ctx, 1, 3, got)
				require.NoError(t, err)
				require.Equal(t, transport.Header{byte(i)}, h)
				require.Equal(t, echoSize, n)
				require.True(t, bytes.Equal(big, got), "message %d", i)
			}
			require.NoError(t, cmd.Wait())
			p := tr.peers[1].Load()
			p.wmu.Lock()
			sent := p.remoteSent
			p.wmu.Unlock()
			t.Logf("remote records sent: %d of %d", sent, echoMsgs)
			if !single {
				require.Zero(t, sent)
			}
		})
	}
}
