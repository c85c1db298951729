package dist

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf8"
)

// Abort notices travel on tagAbort, one per link: a rank whose group fails
// sends its cause (an *AbortError) to every peer before it sends anything
// else about the failure, and before Close says goodbye on that link, so
// the peer reads the notice first (per-link order). Layout, little-endian:
//
//	version  u8  (abortVersion)
//	kind     u8  (FailureKind)
//	rank     u32 (the culprit)
//	reporter u32 (the rank that found it)
//	seq      u64 (the collective's sequence number, 0 if none)
//	op       u8 length, then that many bytes (UTF-8)
//	msg      u16 length, then that many bytes (UTF-8, at most maxReason)
//	desync   only for KindDesync: peer u32, peerSeq u64, localFP u64,
//	         remoteFP u64, localSite and remoteSite (each u16 length + bytes)
//
// A notice that is shorter than its fields say, longer than maxNotice, of
// another version or with an unknown kind is malformed: the receiver
// records a protocol error naming the sender.
const (
	abortVersion = 2

	maxReason = 512
	maxOpName = 64
	maxSite   = 256
	// maxNotice bounds an encoded notice (the receiver's buffer).
	maxNotice = 2 + 4 + 4 + 8 + 1 + maxOpName + 2 + maxReason + 4 + 8 + 8 + 8 + 2*(2+maxSite)
)

// truncate cuts s to at most n bytes without splitting a UTF-8 sequence.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// encodeNotice encodes a for the peers.
func encodeNotice(a *AbortError) []byte {
	op, msg := truncate(a.Op, maxOpName), truncate(a.Msg, maxReason)
	le := binary.LittleEndian
	b := make([]byte, 0, maxNotice)
	b = append(b, abortVersion, byte(a.Kind))
	b = le.AppendUint32(b, uint32(a.Rank))
	b = le.AppendUint32(b, uint32(a.Reporter))
	b = le.AppendUint64(b, a.Seq)
	b = append(b, byte(len(op)))
	b = append(b, op...)
	b = le.AppendUint16(b, uint16(len(msg)))
	b = append(b, msg...)
	if a.Kind == KindDesync {
		var de *DesyncError
		if !errors.As(a.Err, &de) {
			de = &DesyncError{Rank: a.Reporter, Peer: a.Rank}
		}
		if de.Rank != a.Reporter && de.Peer == a.Reporter {
			// A relayed notice holds the desync as its other side decoded
			// it (from there); the wire carries it from the reporter's.
			de = de.swapped()
		}
		b = le.AppendUint32(b, uint32(de.Peer))
		b = le.AppendUint64(b, de.PeerSeq)
		b = le.AppendUint64(b, descFingerprint(de.Local))
		b = le.AppendUint64(b, descFingerprint(de.Remote))
		for _, s := range []string{de.LocalSite, de.RemoteSite} {
			s = truncate(s, maxSite)
			b = le.AppendUint16(b, uint16(len(s)))
			b = append(b, s...)
		}
	}
	return b
}

func descFingerprint(d CollectiveDesc) uint64 {
	return fingerprint(kindByName(d.Op), d.DType, d.Reduce, d.Root, d.Count)
}

// noticeReader decodes little-endian fields, remembering a short read.
type noticeReader struct {
	b   []byte
	bad bool
}

func (r *noticeReader) take(n int) []byte {
	if r.bad || len(r.b) < n {
		r.bad = true
		return make([]byte, n)
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}
func (r *noticeReader) u8() byte    { return r.take(1)[0] }
func (r *noticeReader) u16() uint16 { return binary.LittleEndian.Uint16(r.take(2)) }
func (r *noticeReader) u32() uint32 { return binary.LittleEndian.Uint32(r.take(4)) }
func (r *noticeReader) u64() uint64 { return binary.LittleEndian.Uint64(r.take(8)) }
func (r *noticeReader) str(n int) string {
	s := r.take(n)
	if !utf8.Valid(s) {
		r.bad = true
	}
	return string(s)
}

// decodeNotice decodes a notice from rank from. The decoded cause's Err is
// ErrAborted (it happened elsewhere); for a desync it is the *DesyncError,
// seen from this rank if this rank was its other side.
func decodeNotice(self, world, from int, b []byte) (*AbortError, error) {
	bad := func(why string) (*AbortError, error) {
		return nil, &PeerError{Rank: from, Op: "abort notice", Err: fmt.Errorf("%w: malformed abort notice: %s", ErrProtocol, why)}
	}
	if len(b) > maxNotice {
		return bad("too long")
	}
	r := noticeReader{b: b}
	if v := r.u8(); v != abortVersion {
		return bad(fmt.Sprintf("version %d", v))
	}
	a := &AbortError{Kind: FailureKind(r.u8()), Rank: int(r.u32()), Reporter: int(r.u32()), Seq: r.u64()}
	a.Op = r.str(int(r.u8()))
	a.Msg = r.str(int(r.u16()))
	if r.bad {
		return bad("short")
	}
	if a.Kind < KindLost || a.Kind > KindProtocol {
		return bad(fmt.Sprintf("kind %d", a.Kind))
	}
	if a.Rank < 0 || a.Rank >= world || a.Reporter < 0 || a.Reporter >= world {
		return bad("rank out of range")
	}
	a.Err = ErrAborted
	if a.Kind == KindDesync {
		de := &DesyncError{Rank: a.Reporter, Peer: int(r.u32()), Seq: a.Seq, PeerSeq: r.u64(),
			Local: describe(r.u64()), Remote: describe(r.u64())}
		de.LocalSite = r.str(int(r.u16()))
		de.RemoteSite = r.str(int(r.u16()))
		if r.bad || de.Peer < 0 || de.Peer >= world || de.Peer == de.Rank {
			return bad("desync fields")
		}
		if de.Peer == self { // we are the other side: report it from here
			de = de.swapped()
		}
		a.Err = de
	}
	if len(r.b) != 0 {
		return bad("trailing bytes")
	}
	return a, nil
}

// swapped returns e as its other side sees it.
func (e *DesyncError) swapped() *DesyncError {
	return &DesyncError{Rank: e.Peer, Peer: e.Rank, Seq: e.PeerSeq, PeerSeq: e.Seq,
		Local: e.Remote, Remote: e.Local, LocalSite: e.RemoteSite, RemoteSite: e.LocalSite}
}
