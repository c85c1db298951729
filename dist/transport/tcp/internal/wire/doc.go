// Package wire encodes and decodes the frames gdist's TCP transport
// exchanges: a fixed 40-byte little-endian header (magic "gD", version,
// kind, source rank, tag, 16 opaque header bytes, payload length)
// followed by the payload, and the payloads of the authentication handshake.
// spec.md beside this file describes the format byte by byte.
//
// Parse checks a header — magic, version, kind, reserved flags and the
// payload length against the caller's limit — before the caller allocates
// anything for the payload, so a peer cannot make a receiver allocate more
// than its configured maximum frame.
//
// # Usage
//
//	var hdr [wire.HeaderSize]byte
//	h := wire.Header{Kind: wire.Data, Src: 1, Tag: 7, Len: uint64(len(p))}
//	h.Put(hdr[:])
//	// write hdr then p ...
//
//	// receiver: read exactly HeaderSize bytes into hdr
//	h, err := wire.Parse(hdr[:], maxFrame)
//	if errors.Is(err, wire.ErrFrameTooLarge) { /* refuse the peer */ }
//	payload := make([]byte, h.Len) // safe: h.Len <= maxFrame
package wire
