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
		de *dist.DesyncError
		pe *dist.PeerError
	)
	switch {
	case err == nil:
		return typeNone, -1, kindNone
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
