package dist

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Abort messages travel on tagAbort. Layout: version byte (1), kind byte,
// then per kind:
//
//	desync: rank u32, peer u32, seq u64, peerSeq u64, localFP u64, remoteFP u64
//	peer:   failed rank u32, code u8 (1 lost, 2 closed, 3 protocol)
//	other:  sender rank u32, reason (UTF-8, at most maxReason bytes)
//
// All integers are little-endian.
const (
	abortVersion = 1

	abortDesync = 1
	abortPeer   = 2
	abortOther  = 3

	maxReason = 512
)

func (g *ProcessGroup) desyncAbort(e *DesyncError) []byte {
	b := make([]byte, 2, 2+40)
	b[0], b[1] = abortVersion, abortDesync
	b = binary.LittleEndian.AppendUint32(b, uint32(e.Rank))
	b = binary.LittleEndian.AppendUint32(b, uint32(e.Peer))
	b = binary.LittleEndian.AppendUint64(b, e.Seq)
	b = binary.LittleEndian.AppendUint64(b, e.PeerSeq)
	b = binary.LittleEndian.AppendUint64(b, descFingerprint(e.Local))
	b = binary.LittleEndian.AppendUint64(b, descFingerprint(e.Remote))
	return b
}

func descFingerprint(d CollectiveDesc) uint64 {
	return fingerprint(kindByName(d.Op), d.DType, d.Reduce, d.Root, d.Count)
}

func (g *ProcessGroup) peerAbort(e *PeerError) []byte {
	b := make([]byte, 2, 7)
	b[0], b[1] = abortVersion, abortPeer
	b = binary.LittleEndian.AppendUint32(b, uint32(e.Rank))
	code := byte(3)
	switch {
	case errors.Is(e.Err, ErrPeerLost):
		code = 1
	case errors.Is(e.Err, ErrPeerClosed):
		code = 2
	}
	return append(b, code)
}

func (g *ProcessGroup) otherAbort(cause error) []byte {
	reason := cause.Error()
	if len(reason) > maxReason {
		reason = reason[:maxReason]
	}
	b := make([]byte, 2, 6+len(reason))
	b[0], b[1] = abortVersion, abortOther
	b = binary.LittleEndian.AppendUint32(b, uint32(g.rank))
	return append(b, reason...)
}

// decodeAbort turns an abort message from peer `from` into the cause this
// rank records.
func (g *ProcessGroup) decodeAbort(from int, b []byte) error {
	bad := &PeerError{Rank: from, Err: fmt.Errorf("%w: malformed abort message", ErrProtocol)}
	if len(b) < 2 || b[0] != abortVersion {
		return bad
	}
	kind, b := b[1], b[2:]
	switch kind {
	case abortDesync:
		if len(b) != 40 {
			return bad
		}
		le := binary.LittleEndian
		e := &DesyncError{
			Rank:    int(le.Uint32(b)),
			Peer:    int(le.Uint32(b[4:])),
			Seq:     le.Uint64(b[8:]),
			PeerSeq: le.Uint64(b[16:]),
			Local:   describe(le.Uint64(b[24:])),
			Remote:  describe(le.Uint64(b[32:])),
		}
		if e.Peer == g.rank { // we are the other side: report it from here
			e.Rank, e.Peer = e.Peer, e.Rank
			e.Seq, e.PeerSeq = e.PeerSeq, e.Seq
			e.Local, e.Remote = e.Remote, e.Local
		}
		return e
	case abortPeer:
		if len(b) != 5 {
			return bad
		}
		pe := &PeerError{Rank: int(binary.LittleEndian.Uint32(b))}
		switch b[4] {
		case 1:
			pe.Err = ErrPeerLost
		case 2:
			pe.Err = ErrPeerClosed
		default:
			pe.Err = ErrProtocol
		}
		return pe
	case abortOther:
		if len(b) < 4 {
			return bad
		}
		sender := int(binary.LittleEndian.Uint32(b))
		return &PeerError{Rank: sender, Err: fmt.Errorf("%w by rank %d: %s", ErrAborted, sender, b[4:])}
	}
	return bad
}

// watch receives abort messages from peer p for the life of the group. A
// peer that is lost (not one that closed cleanly) aborts the group too: its
// collectives could never complete.
func (g *ProcessGroup) watch(p int, done chan<- struct{}) {
	defer g.wg.Done()
	defer close(done)
	m, err := g.t.Recv(g.gctx, p, tagAbort)
	if err != nil {
		var pe *PeerError
		if errors.As(err, &pe) && errors.Is(pe.Err, ErrPeerLost) {
			g.poison(&PeerError{Rank: pe.Rank, Err: pe.Err}, nil)
		}
		return
	}
	cause := g.decodeAbort(p, m.Payload)
	g.t.Release(m.Payload)
	g.poison(cause, nil)
}
