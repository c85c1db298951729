//go:build unix

package main

import (
	"context"
	"errors"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/transport/tcp"
)

// classify names the typed error err holds (errors.As and errors.Is, never
// its text) and the rank it blames.
func classify(err error) (typ string, peer int, kind string) {
	var (
		ae *dist.AbortError
		de *dist.DesyncError
		pe *dist.PeerError
	)
	switch {
	case err == nil:
		return typeNone, -1, kindNone
	case errors.As(err, &ae):
		// The group's first failure, as every rank records it: its culprit
		// and its kind.
		return typeAbort, ae.Rank, abortKind(ae.Kind)
	case errors.As(err, &de):
		return typeDesync, de.Peer, kindDesync
	case errors.Is(err, context.Canceled):
		return typeCtx, -1, kindCancelled
	case errors.Is(err, context.DeadlineExceeded):
		return typeCtx, -1, kindTimeout
	case errors.As(err, &pe):
		return typePeer, pe.Rank, peerKind(pe.Err)
	case errors.Is(err, dist.ErrClosed):
		return typeClosed, -1, kindOther
	}
	return typeOther, -1, kindOther
}

// peerKind is the kind of a *dist.PeerError's cause.
func peerKind(err error) string {
	switch {
	case errors.Is(err, dist.ErrAborted):
		return kindAborted
	case errors.Is(err, dist.ErrPeerUnresponsive), errors.Is(err, tcp.ErrHeartbeatTimeout):
		return kindUnresponsive
	case errors.Is(err, dist.ErrPeerLost):
		return kindLost
	case errors.Is(err, dist.ErrPeerClosed):
		return kindClosed
	case errors.Is(err, dist.ErrProtocol):
		return kindProtocol
	}
	return kindOther
}

// abortKind is the kind of a *dist.AbortError.
func abortKind(k dist.FailureKind) string {
	switch k {
	case dist.KindLost:
		return kindLost
	case dist.KindFrozen:
		return kindUnresponsive
	case dist.KindDesync:
		return kindDesync
	case dist.KindCancelled:
		return kindCancelled
	case dist.KindTimeout:
		return kindTimeout
	case dist.KindClosed:
		return kindClosed
	case dist.KindUser:
		return kindUser
	case dist.KindProtocol:
		return kindProtocol
	}
	return kindOther
}
