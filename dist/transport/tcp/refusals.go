package tcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gdist/gdist/dist/transport/tcp/internal/wire"
)

// Refusal is a kind of connection this rank refused: the same remote host,
// claimed rank and reason, counted.
type Refusal struct {
	Remote string            // the address of the last such connection
	Rank   int               // the rank it claimed to be, or -1 if it never said
	Code   wire.RejectReason // the reason sent back; 0 if the connection broke or timed out first
	Reason string            // the reason in words, e.g. "authentication failed: wrong GDIST_TOKEN?"
	Count  int               // how many such connections were refused
	First  time.Time         // when the first one was refused
	Last   time.Time         // when the last one was
}

func (r Refusal) String() string {
	who := "a connection"
	if r.Rank >= 0 {
		who = fmt.Sprintf("rank %d", r.Rank)
	}
	s := fmt.Sprintf("%s from %s: %s", who, r.Remote, r.Reason)
	if r.Count > 1 {
		s += fmt.Sprintf(" (%d times)", r.Count)
	}
	return s
}

// InitTimeoutError is returned by New and Rendezvous when the setup did not
// complete within the init timeout (WithInitTimeout). It matches
// ErrInitTimeout and context.DeadlineExceeded.
type InitTimeoutError struct {
	Rank    int           // this rank
	Timeout time.Duration // the init timeout
	// Missing lists the ranks this rank has no link with, in order. A rank
	// other than 0 that registered with rank 0 in a Rendezvous and waits
	// for the table cannot tell which ranks rank 0 still waits for: it
	// reports Missing empty and Waiting set.
	Missing []int
	// Waiting describes a rendezvous step in progress, if any, e.g.
	// "registered with rank 0, waiting for the table".
	Waiting string
	// Refused lists the kinds of connection this rank refused while it
	// waited (at most maxRefusals kinds, the most recent).
	Refused []Refusal
	// Last is the last error of a dial that kept failing, if any.
	Last error
}

func (e *InitTimeoutError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "tcp: rank %d: setup timed out after %v", e.Rank, e.Timeout)
	switch {
	case len(e.Missing) == 1:
		fmt.Fprintf(&b, ": rank %d never joined", e.Missing[0])
	case len(e.Missing) > 1:
		fmt.Fprintf(&b, ": ranks %s never joined", joinInts(e.Missing))
	}
	if e.Waiting != "" {
		fmt.Fprintf(&b, " (%s)", e.Waiting)
	}
	if len(e.Refused) > 0 {
		b.WriteString("; refused ")
		for i, r := range e.Refused {
			if i > 0 {
				b.WriteString("; ")
			}
			b.WriteString(r.String())
		}
	}
	if e.Last != nil {
		fmt.Fprintf(&b, "; last error: %v", e.Last)
	}
	return b.String()
}

// Unwrap makes the error match ErrInitTimeout and context.DeadlineExceeded
// (and the last dial error).
func (e *InitTimeoutError) Unwrap() []error {
	errs := []error{ErrInitTimeout, context.DeadlineExceeded}
	if e.Last != nil {
		errs = append(errs, e.Last)
	}
	return errs
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ", ")
}

// Rate limit of refusal log lines: a burst of refusalBurst lines, then one
// per refusalEvery; the lines left out are counted in the next one.
const (
	refusalBurst = 5
	refusalEvery = 10 * time.Second
	maxRefusals  = 16 // kinds of refusal kept for InitTimeoutError
)

// refusals records refused connections and logs them, rate-limited.
type refusals struct {
	log *slog.Logger

	mu         sync.Mutex
	kinds      []Refusal // most recent last
	tokens     float64   // log lines that may go out now
	refilled   time.Time
	suppressed int // refusals not logged since the last line
}

func newRefusals(log *slog.Logger) *refusals {
	return &refusals{log: log, tokens: refusalBurst}
}

// refusalReason puts a handshake failure in words.
func refusalReason(err error) (wire.RejectReason, string) {
	if errors.Is(err, errEvicted) {
		return 0, errEvicted.Error()
	}
	var he *hsError
	if errors.As(err, &he) {
		switch he.reason {
		case wire.RejectAuth:
			return he.reason, "authentication failed: wrong GDIST_TOKEN?"
		case wire.RejectProtocol:
			return he.reason, fmt.Sprintf("not a gdist %s peer (%v)", wireVersion(), he.err)
		}
		return he.reason, fmt.Sprintf("%v: %v", he.reason, he.err)
	}
	if timedOut(err) {
		return 0, "did not complete the handshake in time"
	}
	var te *tlsError
	if errors.As(err, &te) {
		return 0, fmt.Sprintf("TLS handshake failed: %v", te.err)
	}
	return 0, fmt.Sprintf("connection broke during the handshake (%v)", err)
}

func wireVersion() string { return fmt.Sprintf("v%d", wire.Version) }

// add records a connection from remote, claiming rank (-1: it never said),
// refused because of err, and logs it unless the rate limit says otherwise.
func (r *refusals) add(remote string, rank int, err error) {
	code, reason := refusalReason(err)
	r.addReason(remote, rank, code, reason)
}

// addReason is add with the reason in words.
func (r *refusals) addReason(remote string, rank int, code wire.RejectReason, reason string) {
	now := time.Now()
	host := remote
	if h, _, serr := net.SplitHostPort(remote); serr == nil {
		host = h
	}
	r.mu.Lock()
	i := slices.IndexFunc(r.kinds, func(k Refusal) bool {
		h, _, _ := net.SplitHostPort(k.Remote)
		return h == host && k.Rank == rank && k.Code == code && k.Reason == reason
	})
	if i >= 0 {
		k := r.kinds[i]
		k.Remote, k.Count, k.Last = remote, k.Count+1, now
		r.kinds = append(slices.Delete(r.kinds, i, i+1), k)
	} else {
		if len(r.kinds) == maxRefusals {
			r.kinds = slices.Delete(r.kinds, 0, 1)
		}
		r.kinds = append(r.kinds, Refusal{Remote: remote, Rank: rank, Code: code, Reason: reason, Count: 1, First: now, Last: now})
	}
	if !r.refilled.IsZero() {
		r.tokens = min(refusalBurst, r.tokens+float64(now.Sub(r.refilled))/float64(refusalEvery))
	}
	r.refilled = now
	logIt := r.tokens >= 1
	suppressed := 0
	if logIt {
		r.tokens--
		suppressed, r.suppressed = r.suppressed, 0
	} else {
		r.suppressed++
	}
	r.mu.Unlock()
	if !logIt {
		return
	}
	attrs := []any{"remote", remote, "reason", reason}
	if rank >= 0 {
		attrs = append(attrs, "claimed_rank", rank)
	}
	if suppressed > 0 {
		attrs = append(attrs, "not_logged_before", suppressed)
	}
	r.log.Warn("tcp: refused connection", attrs...)
}

// list returns the refusals recorded so far, most recent last.
func (r *refusals) list() []Refusal {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.kinds)
}
