package fed

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/internal/errs"
)

// Errors of package fed.
var (
	// ErrInvalidArgument is matched by the errors of invalid arguments and
	// options. It is the value every gdist package exports under this name.
	ErrInvalidArgument = errs.ErrInvalidArgument
	// ErrClosed is matched by every call on a Leader or Client after Close.
	ErrClosed = transport.ErrClosed
	// ErrFinished is returned by Client.Next once the leader has ended the
	// federation (Leader.Close): the normal way out of a client's loop.
	ErrFinished = errors.New("fed: the federation has ended")
	// ErrLeaderLost is matched by a client's error once the leader is gone:
	// its link broke and it could not be reached again (see Client). The
	// error is a *transport.PeerError (dist.PeerError) naming rank 0.
	ErrLeaderLost = errors.New("fed: leader lost")
	// ErrProtocol means the other side sent a message this version of the
	// protocol does not allow (spec.md).
	ErrProtocol = errors.New("fed: protocol error")
	// ErrRankInUse is matched by the error of a Join whose rank stayed a
	// member on another link for the whole join timeout: another process
	// runs as that rank. (A rank whose previous process died is free again
	// once the leader sees the loss; Join retries until then.)
	ErrRankInUse = errors.New("fed: the rank is a member on another link")
	// ErrRefused is matched by a client's error when the leader refused it
	// for good (another protocol version, or a federation that has ended).
	ErrRefused = errors.New("fed: refused by the leader")
)

// JoinTimeoutError is returned by Leader.Await when the job's clients did not all
// join within the join timeout and fewer than the minimum number did. It
// matches context.DeadlineExceeded.
type JoinTimeoutError struct {
	Timeout time.Duration // the join timeout
	Joined  []int         // the ranks that joined
	Missing []int         // the ranks that never did
	Need    int           // the clients a round needs (WithMinAvailable)
}

func (e *JoinTimeoutError) Error() string {
	return fmt.Sprintf("fed: %d of %d clients joined within %v (ranks %s never did); a round needs %d",
		len(e.Joined), len(e.Joined)+len(e.Missing), e.Timeout, ranks(e.Missing), e.Need)
}

func (e *JoinTimeoutError) Unwrap() error { return context.DeadlineExceeded }

// ranks formats a list of ranks: "1, 3, 4", or "none".
func ranks(rs []int) string {
	if len(rs) == 0 {
		return "none"
	}
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = fmt.Sprint(r)
	}
	return strings.Join(s, ", ")
}

// leaderLost is the error of a client that lost the leader: a PeerError
// naming rank 0, matching ErrLeaderLost and the cause.
func leaderLost(op string, cause error) error {
	return &transport.PeerError{Rank: 0, Op: op, Err: fmt.Errorf("%w: %w", ErrLeaderLost, cause)}
}
