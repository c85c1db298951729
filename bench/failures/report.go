//go:build unix

package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// A rank reports how its job ended on stdout in one line:
//
//	gdist-failures: ready rank=1
//	gdist-failures: fault rank=2 at=1764572059123456789
//	gdist-failures: result rank=1 type=peer peer=2 kind=lost iter=57 at=1764572059123456789 own=false canceled=false msg="all_reduce: peer rank 2: ..."
//
// ready: the rank has finished its first iterations (the parent injects the
// fault after every rank is ready); fault: the rank made its own fault (the
// desynced call) at that time; result: the error the loop ended with,
// classified by classify, at the time the call returned (Unix nanoseconds),
// whether the call saw its own context end (own) and whether the error
// matches context.Canceled.
const linePrefix = "gdist-failures: "

// report is a rank's classified final error.
type report struct {
	Rank int
	Type string // errType*
	Peer int    // the rank the error names (-1: none)
	Kind string // kind*
	Iter int    // iterations completed before the failing one
	At   time.Time
	// Own: the failing call saw its own context end; Canceled: the error
	// matches context.Canceled (errors.Is).
	Own, Canceled bool
	Msg           string
}

// Error types: the typed error classify found.
const (
	typeNone   = "none"   // no error (the loop ended normally)
	typeAbort  = "abort"  // a *dist.AbortError: the group's first failure
	typePeer   = "peer"   // a *dist.PeerError
	typeDesync = "desync" // a *dist.DesyncError
	typeCtx    = "ctx"    // the caller's context ended
	typeClosed = "closed" // dist.ErrClosed: the group was closed
	typeOther  = "other"  // anything else
)

// Kinds: what the error says went wrong.
const (
	kindNone         = "none"
	kindLost         = "lost"     // ErrPeerLost (a broken connection)
	kindUnresponsive = "frozen"   // ErrPeerUnresponsive or a heartbeat timeout: a frozen peer
	kindClosed       = "closed"   // ErrPeerClosed (a peer that closed cleanly)
	kindAborted      = "aborted"  // a peer's abort notice (ErrAborted)
	kindProtocol     = "protocol" // ErrProtocol
	kindUser         = "user"     // a layer above failed the group (dist.KindUser)
	kindDesync       = "desync"
	kindCancelled    = "cancelled" // context.Canceled
	kindTimeout      = "timeout"   // context.DeadlineExceeded
	kindOther        = "other"
)

func (r report) String() string {
	return fmt.Sprintf("%sresult rank=%d type=%s peer=%d kind=%s iter=%d at=%d own=%t canceled=%t msg=%s",
		linePrefix, r.Rank, r.Type, r.Peer, r.Kind, r.Iter, r.At.UnixNano(), r.Own, r.Canceled, strconv.Quote(r.Msg))
}

// errBadLine is wrapped by parseLine's errors.
var errBadLine = errors.New("failures: malformed rank line")

// event is one parsed line of a rank.
type event struct {
	What   string // "ready", "fault" or "result"
	Rank   int
	At     time.Time // fault, result
	Report report    // result
}

// parseLine parses one of a rank's gdist-failures lines; ok is false for
// any other line.
func parseLine(s string) (ev event, ok bool, err error) {
	rest, found := strings.CutPrefix(s, linePrefix)
	if !found {
		return event{}, false, nil
	}
	what, rest, _ := strings.Cut(rest, " ")
	ev.What = what
	fields := map[string]string{}
	for rest != "" {
		key, val, found := strings.Cut(rest, "=")
		if !found {
			return ev, true, fmt.Errorf("%w: %q", errBadLine, s)
		}
		if key == "msg" { // last, quoted, may hold spaces
			msg, err := strconv.Unquote(val)
			if err != nil {
				return ev, true, fmt.Errorf("%w: msg: %w: %q", errBadLine, err, s)
			}
			fields[key] = msg
			break
		}
		val, rest, _ = strings.Cut(val, " ")
		fields[key] = val
	}
	num := func(key string) (int64, error) {
		v, err := strconv.ParseInt(fields[key], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%w: %s: %w: %q", errBadLine, key, err, s)
		}
		return v, nil
	}
	rank, err := num("rank")
	if err != nil {
		return ev, true, err
	}
	ev.Rank = int(rank)
	switch what {
	case "ready":
		return ev, true, nil
	case "fault", "result":
		at, err := num("at")
		if err != nil {
			return ev, true, err
		}
		ev.At = time.Unix(0, at)
		if what == "fault" {
			return ev, true, nil
		}
		peer, err := num("peer")
		if err != nil {
			return ev, true, err
		}
		iter, err := num("iter")
		if err != nil {
			return ev, true, err
		}
		ev.Report = report{Rank: ev.Rank, Type: fields["type"], Peer: int(peer), Kind: fields["kind"],
			Iter: int(iter), At: ev.At, Own: fields["own"] == "true", Canceled: fields["canceled"] == "true", Msg: fields["msg"]}
		return ev, true, nil
	}
	return ev, true, fmt.Errorf("%w: unknown line kind %q: %q", errBadLine, what, s)
}
