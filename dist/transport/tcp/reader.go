package tcp

import (
	"errors"
	"io"
	"net"
	"sync/atomic"
)

// directMin: a payload remainder at least this long is read straight into
// its destination instead of through the buffer.
const directMin = 8 << 10

// frameReader is the buffered reader of one connection, tuned for frames:
// small frames are read many to a syscall through the buffer; a large
// payload is read straight into its destination, and the header after it is
// read exactly, so the buffer does not swallow the start of the next large
// payload only to copy it again.
type frameReader struct {
	c     net.Conn
	buf   []byte
	r, w  int            // buf[r:w] is buffered
	exact bool           // the last payload was large: read the next header exactly
	rx    *atomic.Uint64 // if set, counts payload reads (liveness)
}

func newFrameReader(c net.Conn, size int) *frameReader {
	return &frameReader{c: c, buf: make([]byte, size)}
}

// Read implements io.Reader (used during the handshake).
func (f *frameReader) Read(p []byte) (int, error) {
	if f.r == f.w {
		if len(p) >= len(f.buf) {
			return f.c.Read(p)
		}
		f.r, f.w = 0, 0
		n, err := f.c.Read(f.buf)
		f.w = n
		if n == 0 {
			return 0, err
		}
	}
	n := copy(p, f.buf[f.r:f.w])
	f.r += n
	return n, nil
}

// readHeader fills hb (a frame header) from the connection.
func (f *frameReader) readHeader(hb []byte) error {
	for f.w-f.r < len(hb) {
		if f.r > 0 {
			f.w = copy(f.buf, f.buf[f.r:f.w])
			f.r = 0
		}
		end := len(f.buf)
		if f.exact {
			end = len(hb)
		}
		n, err := f.c.Read(f.buf[f.w:end])
		f.w += n
		if err != nil && f.w-f.r < len(hb) {
			if errors.Is(err, io.EOF) && f.w > f.r {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	copy(hb, f.buf[f.r:])
	f.r += len(hb)
	return nil
}

// readPayload fills dst, the payload of the frame whose header was read
// last.
func (f *frameReader) readPayload(dst []byte) error {
	n := copy(dst, f.buf[f.r:f.w])
	f.r += n
	dst = dst[n:]
	f.exact = len(dst) >= directMin
	for f.exact && len(dst) > 0 {
		m, err := f.c.Read(dst[:min(len(dst), readChunk)])
		f.progress(m)
		dst = dst[m:]
		if err != nil && len(dst) > 0 {
			return unexpected(err)
		}
	}
	for len(dst) > 0 {
		f.r, f.w = 0, 0
		m, err := f.c.Read(f.buf)
		f.progress(m)
		f.w = m
		k := copy(dst, f.buf[:m])
		f.r = k
		dst = dst[k:]
		if err != nil && len(dst) > 0 {
			return unexpected(err)
		}
	}
	return nil
}

// progress counts a read of n bytes within a payload for the liveness
// monitor: a peer whose long frame trickles in is not silent.
func (f *frameReader) progress(n int) {
	if n > 0 && f.rx != nil {
		f.rx.Add(1)
	}
}

// discard skips n payload bytes.
func (f *frameReader) discard(n uint64) error {
	for n > 0 {
		if f.r == f.w {
			f.r, f.w = 0, 0
			m, err := f.c.Read(f.buf)
			f.progress(m)
			f.w = m
			if m == 0 && err != nil {
				return unexpected(err)
			}
		}
		k := min(uint64(f.w-f.r), n)
		f.r += int(k)
		n -= k
	}
	return nil
}

func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
