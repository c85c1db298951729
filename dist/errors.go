package dist

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gdist/gdist/dist/internal/coll"
	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/internal/errs"
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
	// ErrInvalidArgument is matched by the errors of a bad argument: an
	// unknown ReduceOp, a byte buffer whose length is not a multiple of the
	// element size, a count above MaxCount, an invalid option. It is the
	// value every gdist package exports under this name
	// (errs.ErrInvalidArgument), so transport.ErrInvalidArgument,
	// tcp.ErrInvalidArgument and the others match it too.
	ErrInvalidArgument = errs.ErrInvalidArgument
	// ErrAborted is wrapped by the errors of calls that fail because the
	// group failed earlier (like an NCCL communicator, it cannot be
	// resumed) or because a peer's abort notice explained the failure. The
	// error also carries the first failure (an *AbortError). It is also
	// the sentinel of KindUser failures (ProcessGroup.Abort).
	ErrAborted = errors.New("dist: group aborted")
	// ErrProtocol means a peer sent a message that breaks the collective
	// protocol (wrong payload size, malformed abort message). It appears as
	// the Err of a *PeerError.
	ErrProtocol = coll.ErrProtocol
	// ErrEnv is wrapped by the errors about missing or malformed
	// environment variables, New's (GDIST_DEBUG, GDIST_STALL_THRESHOLD,
	// GDIST_HIERARCHICAL) and gdist.InitFromEnv's; the message names the
	// variable.
	ErrEnv = errors.New("dist: bad environment")
	// ErrBigEndian is returned by New on big-endian hosts: the collectives
	// reinterpret float slices as little-endian wire bytes.
	ErrBigEndian = errors.New("dist: big-endian hosts are not supported")
	// ErrDesync is matched (errors.Is) by every *DesyncError.
	ErrDesync = errors.New("dist: collective desync")
	// ErrTimeout is matched by the error of a collective that ran out of
	// time (its context's deadline, or the group's WithTimeout), on the rank
	// where it timed out (a *TimeoutError, which also matches
	// context.DeadlineExceeded) and, through a *PeerError naming that rank,
	// on its peers.
	ErrTimeout = errors.New("dist: collective timed out")
	// ErrCanceled is matched by the errors of a group aborted because a
	// rank's context was cancelled: on that rank the error also matches
	// context.Canceled; its peers get a *PeerError naming it.
	ErrCanceled = errors.New("dist: collective cancelled")
)

// FailureKind classifies a group's first failure.
type FailureKind uint8

// The kinds of failure. Each matches a sentinel with errors.Is (see
// FailureKind.Sentinel).
const (
	KindLost      FailureKind = iota + 1 // a peer died or its connection broke (ErrPeerLost)
	KindFrozen                           // a peer stopped responding: missed heartbeats (ErrPeerUnresponsive)
	KindDesync                           // ranks called different collectives (ErrDesync)
	KindCancelled                        // a rank's context was cancelled (ErrCanceled)
	KindTimeout                          // a rank's collective ran out of time (ErrTimeout)
	KindClosed                           // a peer closed in the middle of an operation (ErrPeerClosed)
	KindUser                             // a layer above failed the group (ProcessGroup.Abort; ErrAborted)
	KindProtocol                         // a peer broke the protocol (ErrProtocol)
)

var kindNames = [...]string{
	KindLost: "lost", KindFrozen: "frozen", KindDesync: "desync", KindCancelled: "cancelled",
	KindTimeout: "timeout", KindClosed: "closed", KindUser: "user error", KindProtocol: "protocol",
}

// String returns "lost", "frozen", "desync", "cancelled", "timeout",
// "closed", "user error" or "protocol".
func (k FailureKind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("failure_kind(%d)", uint8(k))
}

// Sentinel returns the error that errors of kind k match with errors.Is.
func (k FailureKind) Sentinel() error {
	switch k {
	case KindLost:
		return ErrPeerLost
	case KindFrozen:
		return ErrPeerUnresponsive
	case KindDesync:
		return ErrDesync
	case KindCancelled:
		return ErrCanceled
	case KindTimeout:
		return ErrTimeout
	case KindClosed:
		return ErrPeerClosed
	case KindProtocol:
		return ErrProtocol
	}
	return ErrAborted
}

// AbortError is a group's first failure, the cause of its abort, as every
// rank of the group records it: it travels from the rank that found it to
// the others encoded (see abort.go), not as text. Every error a failed
// group returns carries one: match it with errors.As to read the culprit
// and the kind, whatever the layer (collectives, point-to-point, ddp,
// pipeline). On the rank where it happened it is usually wrapped in the
// error the user matches first: a *PeerError naming the failed peer, a
// *DesyncError or a *TimeoutError.
type AbortError struct {
	Kind FailureKind
	// Rank is the culprit: the rank that died, froze, closed, was
	// cancelled or aborted; for a timeout the first rank waited for; for a
	// desync the other side, as the reporter saw it.
	Rank     int
	Reporter int    // the rank that found the failure
	Op       string // the operation it happened in ("all_reduce", "recv", "pipeline", ...)
	Seq      uint64 // the collective's sequence number (0 if none was running)
	Msg      string // what the reporter said about it (at most 512 bytes)
	// Err is the underlying error on the reporter (a transport error, the
	// context's error, what was passed to Abort) and, on the other ranks,
	// ErrAborted (or the *DesyncError, seen from that rank). Unwrap adds
	// the kind's sentinel.
	Err error
}

func (e *AbortError) Error() string {
	if e.Kind == KindTimeout && e.Msg != "" {
		// The message names the collective and the ranks waited for.
		return fmt.Sprintf("on rank %d: %s", e.Reporter, e.Msg)
	}
	s := fmt.Sprintf("dist: %s", e.Op)
	if e.Seq != 0 {
		s += fmt.Sprintf(" #%d", e.Seq)
	}
	s += fmt.Sprintf(": rank %d failed (%s)", e.Rank, e.Kind)
	if e.Reporter != e.Rank {
		s += fmt.Sprintf(", reported by rank %d", e.Reporter)
	}
	if e.Msg != "" {
		s += ": " + e.Msg
	}
	return s
}

// Unwrap returns Err and the kind's sentinel.
func (e *AbortError) Unwrap() []error { return []error{e.Err, e.Kind.Sentinel()} }

// TimeoutError is the error of a collective that ran out of time on this
// rank: it names the ranks it was still waiting for and where each of them
// was, as far as this rank knew, and the messages the transport held that
// nobody had received (a message nobody receives fills its sender's share
// of the receive queue, and what that sender sends next waits behind it).
// It matches ErrTimeout and context.DeadlineExceeded.
type TimeoutError struct {
	Op      string
	Seq     uint64
	After   time.Duration  // how long the collective ran
	Waiting []PeerProgress // the ranks that had not finished the collective
	// Queued lists the point-to-point and collective messages queued
	// unreceived when it timed out, if the transport can tell
	// (transport.Backlog).
	Queued []transport.Queued
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("dist: %s #%d timed out after %v waiting for %s%s",
		e.Op, e.Seq, e.After.Round(time.Millisecond), describeWaiting(e.Waiting, time.Now()), describeQueued(e.Queued))
}

func (e *TimeoutError) Unwrap() []error { return []error{ErrTimeout, context.DeadlineExceeded} }

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
//
// With the debug mode on (WithDebug(DebugDetail), GDIST_DEBUG=detail) the
// call sites of the two collectives are part of their fingerprints and are
// reported in LocalSite and RemoteSite ("file.go:123"); they are empty
// otherwise.
type DesyncError struct {
	Rank, Peer            int
	Seq, PeerSeq          uint64
	Local, Remote         CollectiveDesc
	LocalSite, RemoteSite string
}

func (e *DesyncError) Error() string {
	side := func(d CollectiveDesc, site string) string {
		if site != "" {
			return d.String() + " at " + site
		}
		return d.String()
	}
	return fmt.Sprintf("dist: collective desync: rank %d called %s as collective #%d but rank %d called %s as collective #%d",
		e.Rank, side(e.Local, e.LocalSite), e.Seq, e.Peer, side(e.Remote, e.RemoteSite), e.PeerSeq)
}

// Unwrap returns ErrDesync and, when the two sides differ only in their
// count, a *LengthMismatchError.
func (e *DesyncError) Unwrap() []error {
	l, r := e.Local, e.Remote
	if e.Seq == e.PeerSeq && l.Op == r.Op && l.DType == r.DType && l.Reduce == r.Reduce &&
		l.Root == r.Root && l.Count != r.Count {
		return []error{ErrDesync, &LengthMismatchError{Op: l.Op, Want: l.Count, Got: r.Count}}
	}
	return []error{ErrDesync}
}

// MemberError is the error of an operation on a subgroup that failed
// because of one of the subgroup's members: it names the culprit by its
// rank in the job (Rank, as every *PeerError and *AbortError does) and in
// the subgroup (Member). Err is the error the operation would report on
// the job's group (a *PeerError, a *DesyncError, ...), so errors.As finds
// those through it.
type MemberError struct {
	Group  string
	Member int
	Rank   int
	Err    error
}

func (e *MemberError) Error() string {
	return fmt.Sprintf("%v (rank %d is member %d of %s)", e.Err, e.Rank, e.Member, e.Group)
}

func (e *MemberError) Unwrap() error { return e.Err }
