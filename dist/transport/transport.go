package transport

import (
	"context"
	"errors"
	"fmt"
)

// TagReservedBase is the first tag reserved for gdist's collectives. User
// point-to-point tags must be below it; the dist package enforces that.
const TagReservedBase uint32 = 0xFFF00000

// Errors shared by every transport. The dist package re-exports them.
var (
	// ErrClosed is returned by every call on a transport after Close.
	ErrClosed = errors.New("dist: closed")
	// ErrPeerClosed means the peer shut down cleanly and will send nothing more.
	ErrPeerClosed = errors.New("dist: peer closed")
	// ErrPeerLost means the connection to the peer broke (EOF without a
	// goodbye, reset, missed heartbeats, or a local test Kill).
	ErrPeerLost = errors.New("dist: peer lost")
	// ErrInvalidRank is returned for a rank outside [0, WorldSize).
	ErrInvalidRank = errors.New("dist: invalid rank")
	// ErrFrameTooLarge is returned when a message exceeds the transport's
	// maximum frame size.
	ErrFrameTooLarge = errors.New("dist: frame too large")
)

// PeerError reports that an operation failed because of a peer: it left,
// its connection broke, or it sent something that violated the protocol.
type PeerError struct {
	Rank int    // the peer's rank
	Op   string // the operation that observed the failure, e.g. "recv" or "all_reduce"
	Err  error  // the cause; errors.Is(e, ErrPeerLost) etc. work through Unwrap
}

func (e *PeerError) Error() string {
	return fmt.Sprintf("dist: %s: peer rank %d: %v", e.Op, e.Rank, e.Err)
}

func (e *PeerError) Unwrap() error { return e.Err }

// Meta is per-message metadata that a transport carries unchanged from the
// sender to the receiver. The dist package puts a per-group sequence number
// and a fingerprint of the collective in it so that desynchronised ranks are
// detected instead of hanging; point-to-point messages leave it zero.
type Meta struct {
	Seq         uint64
	Fingerprint uint64
}

// Message is one received message.
type Message struct {
	Meta    Meta
	Payload []byte // owned by the caller; may be handed back with Transport.Release
}

// Transport moves tagged byte messages between the ranks of one job.
//
// Messages with the same (source, tag) are delivered in the order they were
// sent; messages with different tags are independent (a receive on one tag
// never waits behind a message on another tag, up to the receive-queue bound).
// Sending to one's own rank is allowed and loops back.
//
// Every blocking call returns promptly with an error wrapping ctx.Err() when
// ctx ends. After Close every call returns an error matching ErrClosed. A
// failed peer makes calls involving it return a *PeerError.
type Transport interface {
	// Rank is this process's rank in [0, WorldSize).
	Rank() int
	// WorldSize is the number of ranks in the job.
	WorldSize() int
	// Send delivers p to rank `to` under tag. It returns once p may be reused
	// by the caller; p is never retained. Once the transport has failed (it
	// lost a peer), Send fails for tags below TagReservedBase; messages on
	// reserved tags still go to the peers that are alive, so that the layer
	// above can tell them why this rank stops.
	Send(ctx context.Context, to int, tag uint32, meta Meta, p []byte) error
	// Recv returns the next message from rank `from` under tag. The payload
	// belongs to the caller.
	Recv(ctx context.Context, from int, tag uint32) (Message, error)
	// Release hands a payload returned by Recv back to the transport for
	// reuse. Calling it is optional; p must not be used afterwards.
	Release(p []byte)
	// Close releases the transport's resources and tells peers this rank has
	// left. It is idempotent and waits for the goroutines the transport owns.
	Close() error
}

// CheckRank returns an error wrapping ErrInvalidRank unless 0 <= r < world.
func CheckRank(r, world int) error {
	if r < 0 || r >= world {
		return fmt.Errorf("%w: %d not in [0, %d)", ErrInvalidRank, r, world)
	}
	return nil
}
