package launch

import (
	"io"
	"sync"
)

// maxPending is how many bytes of an unterminated line a PrefixWriter holds
// before writing them out. Longer lines are written in pieces, the prefix
// only before the first; another rank's line may then land between pieces.
const maxPending = 1 << 20

// Synced returns a writer that serialises Write calls to w, so that lines
// from different ranks (each written whole by a PrefixWriter or LineFunc)
// never interleave within one Write.
func Synced(w io.Writer) io.Writer { return &syncWriter{w: w} }

// syncWriter serialises Write calls to w.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

// Write writes p to the underlying writer under the lock.
func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// PrefixWriter puts prefix in front of every line written through it and
// writes each line (prefix, text and terminator) to dst with one Write call.
//
// A line ends at '\n' or at '\r', so progress bars that redraw with '\r'
// keep working: each redraw is prefixed and written when the next '\r'
// arrives. "\r\n" is one line end, even when split across Writes. Bytes of
// an unterminated line are held until the line ends, until maxPending bytes
// are held, or until Flush. A PrefixWriter is not safe for concurrent use
// (each child stream has its own); dst must be if it is shared.
type PrefixWriter struct {
	dst    io.Writer
	prefix []byte

	buf    []byte // pending output; starts with the prefix unless midway
	midway bool   // part of the current line has already been written
	lastCR bool   // the last byte seen was '\r'
	err    error  // first error from dst; later writes are discarded
}

// NewPrefixWriter returns a PrefixWriter writing to dst.
func NewPrefixWriter(dst io.Writer, prefix string) *PrefixWriter {
	return &PrefixWriter{dst: dst, prefix: []byte(prefix)}
}

// Write prefixes and forwards every complete line in p and keeps the rest.
// It always reports len(p) written so that a broken destination never
// blocks the child: after dst fails, output is discarded.
func (w *PrefixWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if w.lastCR && p[0] == '\n' {
			// Second half of "\r\n": the line was already written with its '\r'.
			w.emit([]byte{'\n'})
			w.lastCR = false
			p = p[1:]
			continue
		}
		w.lastCR = false
		i := indexLineEnd(p)
		if i < 0 {
			w.hold(p)
			break
		}
		end := i + 1
		if p[i] == '\r' {
			if end < len(p) && p[end] == '\n' {
				end++
			} else if end == len(p) {
				w.lastCR = true
			}
		}
		w.line(p[:end])
		p = p[end:]
	}
	return n, nil
}

// Flush writes any unterminated line, followed by '\n' so that the next
// line of another rank starts on a line of its own.
func (w *PrefixWriter) Flush() error {
	if len(w.buf) > 0 || w.midway {
		w.line([]byte{'\n'})
	}
	return w.err
}

// line appends the end of the current line and writes it out.
func (w *PrefixWriter) line(p []byte) {
	w.start()
	w.buf = append(w.buf, p...)
	w.emit(w.buf)
	w.buf = w.buf[:0]
	w.midway = false
	if cap(w.buf) > 2*maxPending {
		w.buf = nil // do not keep a huge buffer after a huge line
	}
}

// hold keeps p as part of the current, unterminated line, writing out the
// pending bytes once there are maxPending of them.
func (w *PrefixWriter) hold(p []byte) {
	w.start()
	w.buf = append(w.buf, p...)
	if len(w.buf) >= maxPending {
		w.emit(w.buf)
		w.buf = w.buf[:0]
		w.midway = true
	}
}

// start puts the prefix in the buffer if a new line begins.
func (w *PrefixWriter) start() {
	if len(w.buf) == 0 && !w.midway {
		w.buf = append(w.buf, w.prefix...)
	}
}

func (w *PrefixWriter) emit(b []byte) {
	if w.err != nil {
		return
	}
	if _, err := w.dst.Write(b); err != nil {
		w.err = err
	}
}

// indexLineEnd returns the index of the first '\n' or '\r' in p, or -1.
func indexLineEnd(p []byte) int {
	for i, c := range p {
		if c == '\n' || c == '\r' {
			return i
		}
	}
	return -1
}
