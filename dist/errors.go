package dist

import (
	"errors"
	"fmt"

	"github.com/gdist/gdist/dist/transport"
)

// TagReservedBase is the first tag reserved for the group's own messages
// (collectives, abort notices); point-to-point tags must be below it. The
// transport gives tags no meaning: the reservation is dist's.
const TagReservedBase uint32 = 0xFFF00000

// Errors re-exported from package transport, so that callers of dist need not
// import it to match them.
var (
	ErrClosed     = transport.ErrClosed
	ErrPeerClosed = transport.ErrPeerClosed
	ErrPeerLost   = transport.ErrPeerLost
	// ErrPeerUnresponsive: the peer stopped responding (it wraps ErrPeerLost).
	ErrPeerUnresponsive = transport.ErrPeerUnresponsive
	ErrInvalidRank      = transport.ErrInvalidRank
	ErrMessageTooLong   = transport.ErrMessageTooLong
)

// PeerError reports an operation that failed because of a peer. It is an alias
// of transport.PeerError, so errors.As matches errors from either package.
// Collectives set Op to their name ("all_reduce", "broadcast", ...).
type PeerError = transport.PeerError

// Sentinel errors of package dist.
var (
	// ErrReservedTag is returned for a point-to-point tag >= TagReservedBase.
	ErrReservedTag = errors.New("dist: tag in reserved range")
	// ErrUnsupportedDType is returned for a DType that is not F16, BF16, F32 or F64.
	ErrUnsupportedDType = errors.New("dist: unsupported dtype")
	// ErrInvalidArgument is returned for a bad argument: an unknown ReduceOp,
	// a byte buffer whose length is not a multiple of the element size, a
	// count above MaxCount, an invalid option.
	ErrInvalidArgument = errors.New("dist: invalid argument")
	// ErrAborted is wrapped by the errors of collectives that fail because an
	// earlier collective failed (the group is aborted, like an NCCL
	// communicator) or because a peer aborted the group. The error also wraps
	// the first failure.
	ErrAborted = errors.New("dist: group aborted")
	// ErrProtocol means a peer sent a message that breaks the collective
	// protocol (wrong payload size, malformed abort message). It appears as
	// the Err of a *PeerError.
	ErrProtocol = errors.New("dist: protocol violation")
	// ErrEnv is wrapped by InitFromEnv's errors about missing or malformed
	// environment variables; the message names the variable.
	ErrEnv = errors.New("dist: bad environment")
	// ErrBigEndian is returned by New on big-endian hosts: the collectives
	// reinterpret float slices as little-endian wire bytes.
	ErrBigEndian = errors.New("dist: big-endian hosts are not supported")
)

// LengthMismatchError reports a length that does not match the one expected:
// a caller's buffer of the wrong size (for example AllGather's dst), a
// received point-to-point message of the wrong size, or — unwrapped from a
// *DesyncError — ranks that called the same collective with different counts.
// Want and Got are element counts.
type LengthMismatchError struct {
	Op   string
	Want int
	Got  int
}

func (e *LengthMismatchError) Error() string {
	return fmt.Sprintf("dist: %s: length mismatch: want %d elements, got %d", e.Op, e.Want, e.Got)
}

// DesyncError reports that two ranks disagreed about a collective: they
// called different collectives at the same position in their sequences, or
// the same one with a different dtype, reduce op, count or root, or they are
// at different positions. Rank and Seq describe one side (Local) and Peer and
// PeerSeq the other (Remote). On the rank that took part in the disagreement
// Rank is that rank; on a rank that learned about it from the detecting
// rank's abort message, Rank is the detecting rank.
type DesyncError struct {
	Rank, Peer    int
	Seq, PeerSeq  uint64
	Local, Remote CollectiveDesc
}

func (e *DesyncError) Error() string {
	return fmt.Sprintf("dist: collective desync: rank %d called %s as collective #%d but rank %d called %s as collective #%d",
		e.Rank, e.Local, e.Seq, e.Peer, e.Remote, e.PeerSeq)
}

// Unwrap returns a *LengthMismatchError when the two sides differ only in
// their count, and nil otherwise.
func (e *DesyncError) Unwrap() error {
	l, r := e.Local, e.Remote
	if e.Seq == e.PeerSeq && l.Op == r.Op && l.DType == r.DType && l.Reduce == r.Reduce &&
		l.Root == r.Root && l.Count != r.Count {
		return &LengthMismatchError{Op: l.Op, Want: l.Count, Got: r.Count}
	}
	return nil
}
