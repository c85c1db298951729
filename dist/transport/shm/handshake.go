//go:build linux

package shm

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gdist/gdist/dist/transport/shm/internal/ring"
)

// Handshake messages (spec.md, "Handshake").
const (
	helloSize = 96
	macSize   = sha256.Size
	ackSize   = helloSize + macSize
	version   = 6

	msgWelcome = 'W' // server: the memory follows (SCM_RIGHTS)
	msgReject  = 'R' // server: refused; a reason byte follows
	msgMapped  = 'M' // client: mapped the memory, the link is up
	msgBye     = 'G' // either side, after setup: goodbye
)

var helloMagic = [8]byte{'g', 'd', 's', 't', 's', 'h', 'm', 0}

// Reject reasons.
const (
	rejectProtocol = 1 + iota
	rejectAuth
	rejectWorld
	rejectRank
	rejectDuplicate
	rejectUser
)

func reasonString(r byte) string {
	switch r {
	case rejectProtocol:
		return "protocol"
	case rejectAuth:
		return "auth"
	case rejectWorld:
		return "world"
	case rejectRank:
		return "rank"
	case rejectDuplicate:
		return "duplicate"
	case rejectUser:
		return "user"
	}
	return fmt.Sprintf("reason %d", r)
}

// hello is what each side states about itself.
type hello struct {
	World      uint32
	From, To   uint32
	QueueLimit uint64
	MaxFrame   uint64
	RingSize   uint64 // the server's: the size of each ring of the region
	Nonce      [32]byte
}

func (h *hello) put(b []byte) {
	_ = b[helloSize-1]
	clear(b[:helloSize])
	copy(b, helloMagic[:])
	b[8] = version
	binary.LittleEndian.PutUint32(b[12:], h.World)
	binary.LittleEndian.PutUint32(b[16:], h.From)
	binary.LittleEndian.PutUint32(b[20:], h.To)
	binary.LittleEndian.PutUint64(b[24:], h.QueueLimit)
	binary.LittleEndian.PutUint64(b[32:], h.MaxFrame)
	binary.LittleEndian.PutUint64(b[40:], h.RingSize)
	copy(b[64:96], h.Nonce[:])
}

func parseHello(b []byte) (hello, error) {
	if len(b) < helloSize {
		return hello{}, fmt.Errorf("%w: hello of %d bytes", ErrProtocol, len(b))
	}
	if [8]byte(b[:8]) != helloMagic || b[8] != version {
		return hello{}, fmt.Errorf("%w: not a gdist shm hello (or another version)", ErrProtocol)
	}
	for _, c := range b[9:12] {
		if c != 0 {
			return hello{}, fmt.Errorf("%w: reserved bytes set", ErrProtocol)
		}
	}
	for _, c := range b[48:64] {
		if c != 0 {
			return hello{}, fmt.Errorf("%w: reserved bytes set", ErrProtocol)
		}
	}
	h := hello{
		World:      binary.LittleEndian.Uint32(b[12:]),
		From:       binary.LittleEndian.Uint32(b[16:]),
		To:         binary.LittleEndian.Uint32(b[20:]),
		QueueLimit: binary.LittleEndian.Uint64(b[24:]),
		MaxFrame:   binary.LittleEndian.Uint64(b[32:]),
		RingSize:   binary.LittleEndian.Uint64(b[40:]),
	}
	copy(h.Nonce[:], b[64:96])
	return h, nil
}

const (
	labelServer = "gdist/shm/1 server"
	labelClient = "gdist/shm/1 client"
)

// mac is HMAC-SHA256 keyed by token over label, both hellos and both ranks.
func mac(label string, token, clientHello, serverHello []byte, client, server uint32) [macSize]byte {
	m := hmac.New(sha256.New, token)
	m.Write([]byte(label))
	m.Write(clientHello[:helloSize])
	m.Write(serverHello[:helloSize])
	var r [8]byte
	binary.LittleEndian.PutUint32(r[0:], client)
	binary.LittleEndian.PutUint32(r[4:], server)
	m.Write(r[:])
	var out [macSize]byte
	m.Sum(out[:0])
	return out
}

// link is an authenticated connection with its mapped region, on its way
// to becoming a peer.
type link struct {
	rank     int
	conn     *net.UnixConn
	region   []byte
	ringSize int
	server   bool  // this side created the memory (the lower rank)
	info     hello // what the other side said
	pid      int32 // the other side's process id (SO_PEERCRED)
}

func (l *link) drop() {
	l.conn.Close()
	if l.region != nil {
		unix.Munmap(l.region)
	}
}

// rejectError is a refusal the server reports to the client.
type rejectError struct {
	reason byte
	err    error
}

func (e *rejectError) Error() string { return fmt.Sprintf("%s: %v", reasonString(e.reason), e.err) }
func (e *rejectError) Unwrap() error { return e.err }

func refuse(reason byte, err error) error { return &rejectError{reason: reason, err: err} }

// bindDeadline applies d (or ctx's earlier deadline) to conn and
// interrupts its I/O when ctx ends; the returned function undoes both.
func bindDeadline(ctx context.Context, conn net.Conn, d time.Time) func() {
	if cd, ok := ctx.Deadline(); ok && cd.Before(d) {
		d = cd
	}
	conn.SetDeadline(d)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	return func() {
		stop()
		conn.SetDeadline(time.Time{})
	}
}

// peerCred returns the uid and pid of the process at the other end.
func peerCred(c *net.UnixConn) (uint32, int32, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, 0, err
	}
	if cerr != nil {
		return 0, 0, cerr
	}
	return cred.Uid, cred.Pid, nil
}

func (t *Transport) myHello(peer int, ringSize int) (hello, []byte, error) {
	h := hello{
		World:      uint32(t.world),
		From:       uint32(t.rank),
		To:         uint32(peer),
		QueueLimit: uint64(t.cfg.queueLimit),
		MaxFrame:   uint64(t.cfg.maxFrame),
		RingSize:   uint64(ringSize),
	}
	if _, err := rand.Read(h.Nonce[:]); err != nil {
		return h, nil, err
	}
	b := make([]byte, helloSize, ackSize)
	h.put(b)
	return h, b, nil
}

// checkUser refuses a peer that runs as another user.
func checkUser(c *net.UnixConn) (int32, error) {
	uid, pid, err := peerCred(c)
	if err != nil {
		return 0, fmt.Errorf("shm: peer credentials: %w", err)
	}
	if uid != uint32(os.Getuid()) {
		return 0, refuse(rejectUser, fmt.Errorf("%w: peer process %d runs as uid %d, this job as %d", ErrAuth, pid, uid, os.Getuid()))
	}
	return pid, nil
}

// serverHandshake authenticates an incoming connection from a higher rank
// (expect, or any rank accept allows if expect < 0), creates the pair's
// memory and hands it over. On failure it has sent a Reject where it
// could; the caller closes conn.
func (t *Transport) serverHandshake(ctx context.Context, conn *net.UnixConn, expect int) (link, error) {
	defer bindDeadline(ctx, conn, time.Now().Add(t.cfg.hsTimeout))()
	l, err := t.serverExchange(conn, expect)
	if err != nil {
		var re *rejectError
		if errors.As(err, &re) {
			conn.Write([]byte{msgReject, re.reason})
		}
		return link{}, err
	}
	return l, nil
}

func (t *Transport) serverExchange(conn *net.UnixConn, expect int) (link, error) {
	pid, err := checkUser(conn)
	if err != nil {
		return link{}, err
	}
	cb := make([]byte, helloSize)
	if _, err := io.ReadFull(conn, cb); err != nil {
		return link{}, err
	}
	theirs, err := parseHello(cb)
	if err != nil {
		return link{}, refuse(rejectProtocol, err)
	}
	c := int64(theirs.From)
	switch {
	case theirs.World != uint32(t.world):
		return link{}, refuse(rejectWorld, fmt.Errorf("client rank %d says world %d, this job has %d", c, theirs.World, t.world))
	case theirs.To != uint32(t.rank):
		return link{}, refuse(rejectRank, fmt.Errorf("client rank %d wants rank %d, this is rank %d", c, theirs.To, t.rank))
	case c <= int64(t.rank) || c >= int64(t.world) || !t.linkedTo[c] || (expect >= 0 && c != int64(expect)):
		return link{}, refuse(rejectRank, fmt.Errorf("rank %d may not connect to rank %d here", c, t.rank))
	case theirs.MaxFrame == 0:
		return link{}, refuse(rejectProtocol, fmt.Errorf("client rank %d accepts no payload", c))
	}
	size := t.cfg.ringSize
	_, sb, err := t.myHello(int(c), size)
	if err != nil {
		return link{}, err
	}
	smac := mac(labelServer, t.cfg.token, cb, sb, uint32(c), uint32(t.rank))
	ack := append(sb, smac[:]...)
	if _, err := conn.Write(ack); err != nil {
		return link{}, err
	}
	auth := make([]byte, macSize)
	if _, err := io.ReadFull(conn, auth); err != nil {
		return link{}, err
	}
	cmac := mac(labelClient, t.cfg.token, cb, sb, uint32(c), uint32(t.rank))
	if !hmac.Equal(cmac[:], auth) {
		return link{}, refuse(rejectAuth, fmt.Errorf("%w: client claiming rank %d did not prove the job token", ErrAuth, c))
	}
	if !t.claim(int(c)) {
		return link{}, refuse(rejectDuplicate, fmt.Errorf("rank %d is already connected", c))
	}
	fd, region, err := createRegion(ring.RegionSize(size))
	if err != nil {
		t.unclaim(int(c))
		return link{}, err
	}
	_, _, err = conn.WriteMsgUnix([]byte{msgWelcome}, unix.UnixRights(fd), nil)
	unix.Close(fd) // the fd in flight keeps the memory alive; our mapping does too
	if err == nil {
		var b [1]byte
		if _, err = io.ReadFull(conn, b[:]); err == nil && b[0] != msgMapped {
			err = fmt.Errorf("%w: rank %d sent %#x instead of mapped", ErrProtocol, c, b[0])
		}
	}
	if err != nil {
		t.unclaim(int(c))
		unix.Munmap(region)
		return link{}, err
	}
	return link{rank: int(c), conn: conn, region: region, ringSize: size, server: true, info: theirs, pid: pid}, nil
}

// clientHandshake authenticates conn to the lower rank server, receives the
// pair's memory and maps it.
func (t *Transport) clientHandshake(ctx context.Context, conn *net.UnixConn, server int) (link, error) {
	defer bindDeadline(ctx, conn, time.Now().Add(t.cfg.hsTimeout))()
	pid, err := checkUser(conn)
	if err != nil {
		return link{}, err
	}
	_, cb, err := t.myHello(server, 0)
	if err != nil {
		return link{}, err
	}
	if _, err := conn.Write(cb); err != nil {
		return link{}, err
	}
	ack := make([]byte, ackSize)
	if _, err := io.ReadFull(conn, ack[:2]); err != nil {
		return link{}, err
	}
	if ack[0] == msgReject {
		return link{}, rejected(server, ack[1])
	}
	if _, err := io.ReadFull(conn, ack[2:]); err != nil {
		return link{}, err
	}
	theirs, err := parseHello(ack)
	if err != nil {
		return link{}, err
	}
	smac := mac(labelServer, t.cfg.token, cb, ack, uint32(t.rank), uint32(server))
	if !hmac.Equal(smac[:], ack[helloSize:]) {
		return link{}, fmt.Errorf("%w: rank %d did not prove the job token", ErrAuth, server)
	}
	switch {
	case theirs.World != uint32(t.world) || theirs.From != uint32(server) || theirs.To != uint32(t.rank):
		return link{}, fmt.Errorf("%w: rank %d answered as rank %d of %d for rank %d",
			ErrProtocol, server, theirs.From, theirs.World, theirs.To)
	case theirs.MaxFrame == 0:
		return link{}, fmt.Errorf("%w: rank %d accepts no payload", ErrProtocol, server)
	case theirs.RingSize > ring.MaxSize || ring.CheckSize(int(theirs.RingSize)) != nil:
		return link{}, fmt.Errorf("%w: rank %d offers rings of %d bytes", ErrProtocol, server, theirs.RingSize)
	}
	cmac := mac(labelClient, t.cfg.token, cb, ack, uint32(t.rank), uint32(server))
	if _, err := conn.Write(cmac[:]); err != nil {
		return link{}, err
	}
	size := int(theirs.RingSize)
	region, err := receiveRegion(conn, server, ring.RegionSize(size))
	if err != nil {
		return link{}, err
	}
	if _, err := conn.Write([]byte{msgMapped}); err != nil {
		unix.Munmap(region)
		return link{}, err
	}
	return link{rank: server, conn: conn, region: region, ringSize: size, info: theirs, pid: pid}, nil
}

func rejected(server int, reason byte) error {
	cause := ErrProtocol
	if reason == rejectAuth || reason == rejectUser {
		cause = ErrAuth
	}
	return fmt.Errorf("%w: rank %d refused the connection: %s", cause, server, reasonString(reason))
}

// receiveRegion reads the Welcome with its file descriptor, checks that
// the memory is what a peer of this job would create (a sealed memfd of
// the agreed size, owned by this user, mode 0600) and maps it.
func receiveRegion(conn *net.UnixConn, server, size int) ([]byte, error) {
	var b [2]byte
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, flags, _, err := conn.ReadMsgUnix(b[:1], oob)
	if err != nil {
		return nil, err
	}
	fds, perr := parseRights(oob[:oobn])
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	if n == 1 && b[0] == msgReject {
		io.ReadFull(conn, b[1:])
		return nil, rejected(server, b[1])
	}
	switch {
	case n != 1 || b[0] != msgWelcome:
		return nil, fmt.Errorf("%w: rank %d: expected welcome", ErrProtocol, server)
	case perr != nil || flags&unix.MSG_CTRUNC != 0 || len(fds) != 1:
		return nil, fmt.Errorf("%w: rank %d: welcome without exactly one file descriptor", ErrProtocol, server)
	}
	return mapRegion(fds[0], size)
}

func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for i := range msgs {
		f, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			continue
		}
		fds = append(fds, f...)
	}
	return fds, nil
}

// seals every region carries: its size can never change, so a peer cannot
// shrink it under the other's mapping (which would make its loads fault).
const seals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// How both sides map a region. Its pages come when a link first carries a
// large record (warm, link.go), not at setup.
const (
	mapProt  = unix.PROT_READ | unix.PROT_WRITE
	mapFlags = unix.MAP_SHARED
)

// createRegion makes an anonymous, sealed, 0600 memfd of n bytes and maps it.
func createRegion(n int) (int, []byte, error) {
	fd, err := unix.MemfdCreate("gdist-shm", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, nil, fmt.Errorf("shm: memfd_create: %w", err)
	}
	fail := func(what string, err error) (int, []byte, error) {
		unix.Close(fd)
		return -1, nil, fmt.Errorf("shm: %s: %w", what, err)
	}
	if err := unix.Fchmod(fd, 0o600); err != nil {
		return fail("fchmod", err)
	}
	if err := unix.Ftruncate(fd, int64(n)); err != nil {
		return fail("ftruncate", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		return fail("seal", err)
	}
	mem, err := unix.Mmap(fd, 0, n, mapProt, mapFlags)
	if err != nil {
		return fail("mmap", err)
	}
	return fd, mem, nil
}

// mapRegion checks and maps a region received from a peer.
func mapRegion(fd, n int) ([]byte, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("shm: fstat: %w", err)
	}
	got, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: the memory is not sealable: %w", ErrProtocol, err)
	case got&seals != seals:
		return nil, fmt.Errorf("%w: the memory is not sealed (seals %#x)", ErrProtocol, got)
	case st.Size != int64(n):
		return nil, fmt.Errorf("%w: the memory has %d bytes, want %d", ErrProtocol, st.Size, n)
	case st.Uid != uint32(os.Getuid()) || st.Mode&0o077 != 0:
		return nil, fmt.Errorf("%w: the memory is owned by uid %d with mode %#o", ErrAuth, st.Uid, st.Mode&0o777)
	}
	mem, err := unix.Mmap(fd, 0, n, mapProt, mapFlags)
	if err != nil {
		return nil, fmt.Errorf("shm: mmap: %w", err)
	}
	return mem, nil
}
