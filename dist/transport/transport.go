package transport

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gdist/gdist/internal/errs"
)

// Errors shared by every transport. The dist package re-exports them.
var (
	// ErrClosed is returned by every call on a transport after Close.
	ErrClosed = errors.New("transport: closed")
	// ErrPeerClosed means the peer shut down cleanly and will send nothing more.
	ErrPeerClosed = errors.New("transport: peer closed")
	// ErrPeerLost means the connection to the peer broke (EOF without a
	// goodbye, reset, missed heartbeats, or a local test Kill).
	ErrPeerLost = errors.New("transport: peer lost")
	// ErrPeerUnresponsive means the peer's connection is up but the peer
	// stopped responding (missed heartbeats: a stopped process, a machine
	// gone, a cut link). It wraps ErrPeerLost, so errors.Is(err,
	// ErrPeerLost) holds for it too.
	ErrPeerUnresponsive = fmt.Errorf("%w: unresponsive", ErrPeerLost)
	// ErrInvalidRank is returned for a rank outside [0, WorldSize).
	ErrInvalidRank = errors.New("transport: invalid rank")
	// ErrFrameTooLarge is returned when a message exceeds the transport's
	// maximum frame size.
	ErrFrameTooLarge = errors.New("transport: frame too large")
	// ErrMessageTooLong is returned by RecvInto when the message is longer
	// than the destination buffer. The message is consumed.
	ErrMessageTooLong = errors.New("transport: message longer than the buffer")
	// ErrInvalidArgument is matched by the errors of constructors given
	// invalid arguments or options. It is the value every gdist package
	// exports under this name (errs.ErrInvalidArgument).
	ErrInvalidArgument = errs.ErrInvalidArgument
)

// PeerError reports that an operation failed because of a peer: it left,
// its connection broke, or it sent something that violated the protocol.
type PeerError struct {
	Rank int    // the peer's rank
	Op   string // the operation that observed the failure, e.g. "recv" or "all_reduce"
	Err  error  // the cause; errors.Is(e, ErrPeerLost) etc. work through Unwrap
}

func (e *PeerError) Error() string {
	return fmt.Sprintf("%s: peer rank %d: %v", e.Op, e.Rank, e.Err)
}

func (e *PeerError) Unwrap() error { return e.Err }

// HeaderSize is the size of a message header.
const HeaderSize = 16

// Header is per-message data that a transport carries unchanged, and
// without looking at it, from the sender to the receiver. The layer above
// decides what it means (dist puts its collective sequence number and call
// fingerprint there); a zero Header is fine.
type Header [HeaderSize]byte

// Message is one received message.
type Message struct {
	Header  Header
	Payload []byte // owned by the caller; may be handed back with Transport.Release
}

// Transport moves tagged byte messages between the ranks of one job. It
// knows nothing about what tags or headers mean.
//
// Messages with the same (source, tag) are delivered in the order they were
// sent; messages with different tags are independent (a receive on one tag
// never waits behind a message on another tag, up to the receive-queue bound).
// Sending to one's own rank is allowed and loops back.
//
// Every blocking call returns promptly with an error wrapping ctx.Err() when
// ctx ends. After Close every call returns an error matching ErrClosed. A
// lost or closed peer makes the calls involving that peer (sends to it,
// receives from it) return a *PeerError naming it; calls involving the other
// peers keep working.
type Transport interface {
	// Rank is this process's rank in [0, WorldSize).
	Rank() int
	// WorldSize is the number of ranks in the job.
	WorldSize() int
	// Send delivers h and p to rank `to` under tag. It returns once p may
	// be reused by the caller; p is never retained.
	Send(ctx context.Context, to int, tag uint32, h Header, p []byte) error
	// Recv returns the next message from rank `from` under tag. The payload
	// belongs to the caller, who may hand it back with Release.
	Recv(ctx context.Context, from int, tag uint32) (Message, error)
	// RecvInto receives the next message from rank `from` under tag into
	// dst: its payload is dst[:n]. dst stays the caller's; the transport
	// does not retain it once RecvInto has returned. A message longer than
	// dst is consumed and reported with an error matching
	// ErrMessageTooLong, with n its length and dst unchanged. On any other
	// error dst's contents are unspecified.
	RecvInto(ctx context.Context, from int, tag uint32, dst []byte) (h Header, n int, err error)
	// Release hands a payload returned by Recv back to the transport for
	// reuse. Calling it is optional; p must not be used afterwards.
	Release(p []byte)
	// Close releases the transport's resources and tells peers this rank has
	// left. It is idempotent and waits for the goroutines the transport owns.
	Close() error
}

// DefaultHeartbeatTimeout is every transport's default heartbeat timeout:
// how long a peer may stay silent (nothing received from it over TCP, its
// heartbeat counter still in shared memory) before it is reported
// unresponsive and its job fails.
//
// Silence is not always death. A long garbage-collection pause, a debugger
// stopped at a breakpoint, a swap storm or a host short of memory stops a
// process for seconds, and then it goes on. The timeout is long enough that
// a pause shorter than it by PauseMargin — 8 s by default — is never taken
// for a death on any transport, on either side of the pause, and short
// enough that a rank frozen for good is named at most half a heartbeat
// interval after the timeout (10.25 s from its last heartbeat over TCP and
// from its freeze over shared memory). A job that prefers quicker detection
// to that tolerance sets GDIST_HEARTBEAT_TIMEOUT (gdistrun
// -heartbeat-timeout).
const DefaultHeartbeatTimeout = 10 * time.Second

// PauseMargin is how much shorter than the heartbeat timeout a pause must
// be to be survived, with the transports' default heartbeat intervals (1 s
// over TCP, 500 ms over shared memory) or one derived from the timeout
// (at most 1 s): one interval, since the last heartbeat before the pause
// may have gone out that long before it, plus a second for scheduling and
// the time a resumed process takes to read what queued up meanwhile.
const PauseMargin = 2 * time.Second

// CheckRank returns an error wrapping ErrInvalidRank unless 0 <= r < world.
// It is small enough to be inlined on the path of every message.
func CheckRank(r, world int) error {
	if uint(r) < uint(world) {
		return nil
	}
	return rankErr(r, world)
}

func rankErr(r, world int) error {
	return fmt.Errorf("%w: %d not in [0, %d)", ErrInvalidRank, r, world)
}

// TooLong returns the error RecvInto reports for an n-byte message from
// rank from that does not fit a dst-byte buffer.
func TooLong(from, n, dst int) error {
	return fmt.Errorf("transport: recv from rank %d: %w: %d bytes into %d", from, ErrMessageTooLong, n, dst)
}

// Topology is implemented by transports that know which ranks share a
// host. The layer above uses it to keep traffic within a host where it can
// (dist's hierarchical collectives).
type Topology interface {
	// Hosts returns the host index of every rank (len WorldSize): hosts are
	// numbered 0, 1, ... in the order of their lowest rank, so rank 0 is
	// on host 0 and every rank of the job sees the same slice. The slice
	// is a fresh copy.
	Hosts() []int
}

// SharedMemory is implemented by transports that know which peers they
// reach through memory both processes map (or share, in one process). The
// layer above uses it to choose algorithms whose extra messages cost
// little there and too much over a network (dist's all-reduce between 2
// members on one host).
type SharedMemory interface {
	// SharedMemory reports whether messages to and from rank r go through
	// shared memory: true for this rank itself and for a peer on a
	// shared-memory link, false for other peers and ranks out of range.
	SharedMemory(r int) bool
}

// StreamSender is implemented by transports that can write a message past
// the sender's caches (non-temporal stores into shared memory). Where the
// receiver runs on a core that shares no cache with the sender's, that
// saves fetching each line of the destination from the receiver's cache
// before writing it; where they share one, a plain Send is faster. dist's
// all-reduce between 2 members chooses between them by measuring both.
type StreamSender interface {
	// SendStream is Send with the payload written past the caches where
	// the message goes through shared memory, and Send otherwise.
	SendStream(ctx context.Context, to int, tag uint32, h Header, p []byte) error
}

// CheckHosts checks a host map against Topology's contract: hosts numbered
// 0, 1, ... in the order of their lowest rank. Its error names the first
// rank out of order; callers add their own context and sentinel.
func CheckHosts(hosts []int) error {
	next := 0
	for r, h := range hosts {
		switch {
		case h == next:
			next++
		case h < 0 || h > next:
			return fmt.Errorf("rank %d on host %d: hosts must be numbered 0, 1, ... in the order of their lowest rank", r, h)
		}
	}
	return nil
}

// Queued describes messages that arrived at rank To from rank From under
// Tag and that nobody has received yet.
type Queued struct {
	From, To int
	Tag      uint32
	Messages int
	Bytes    int // their payloads'
}

// Backlog is implemented by transports that can list the messages they
// hold unreceived. The layer above uses it to explain a stall: a message
// nobody receives fills its sender's share of the receive queue, and what
// that sender sends next waits behind it (dist names them when a
// collective times out).
type Backlog interface {
	// Queued returns the messages queued at this rank and not received
	// yet, one entry per (source, tag), ordered by source and tag. A
	// transport that sees its peers' queues too (the in-process one) adds
	// the messages this rank sent that wait unreceived at a peer. The
	// caller owns the slice.
	Queued() []Queued
}
