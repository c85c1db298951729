package transport

import (
	"context"
	"fmt"
)

// Combine merges src into dst element by element (dst = dst op src); both
// have the same length, a whole number of elements. A ReduceReceiver may
// call it several times for one message, on consecutive pieces that
// together cover it, in order; an element-wise operation gives the same
// result either way.
type Combine func(dst, src []byte)

// ReduceReceiver is implemented by transports that can combine a message
// into a buffer as it arrives instead of copying it out first, from where
// the message already lies (shared memory, a kernel buffer): the reducing
// collectives of package dist use it when the transport has it, and
// RecvInto plus a combine when it does not.
type ReduceReceiver interface {
	// RecvReduce receives the next message from rank `from` under tag,
	// which must be exactly len(dst) bytes, and merges it into dst with
	// combine, calling it on pieces whose lengths (and offsets) are
	// multiples of unit, the element size; len(dst) must be a multiple of
	// unit. It returns the message's header and length n. A message of
	// another length is consumed without touching dst: RecvReduce returns
	// its length, with an error matching ErrMessageTooLong if it is
	// longer, nil if it is shorter (the caller checks n). combine runs on
	// a goroutine of the transport or the caller's, never concurrently with
	// itself for one call, and not after RecvReduce returns. On any other
	// error dst's contents are unspecified. Otherwise it behaves like
	// RecvInto.
	RecvReduce(ctx context.Context, from int, tag uint32, dst []byte, unit int, combine Combine) (h Header, n int, err error)
}

// CheckUnit returns an error wrapping ErrInvalidArgument unless unit is
// positive and divides n, as RecvReduce requires of its buffer.
func CheckUnit(n, unit int) error {
	if unit < 1 || n%unit != 0 {
		return fmt.Errorf("transport: %w: RecvReduce of %d bytes in elements of %d", ErrInvalidArgument, n, unit)
	}
	return nil
}

// RecvThenCombine is RecvReduce for a transport without one: it receives
// the message with t.Recv, combines it into dst when its length is
// len(dst), and hands the payload back with t.Release, with RecvReduce's
// results and errors.
func RecvThenCombine(ctx context.Context, t Transport, from int, tag uint32, dst []byte, unit int, combine Combine) (Header, int, error) {
	if err := CheckUnit(len(dst), unit); err != nil {
		return Header{}, 0, err
	}
	if combine == nil {
		return Header{}, 0, fmt.Errorf("transport: %w: RecvReduce with a nil combine", ErrInvalidArgument)
	}
	m, err := t.Recv(ctx, from, tag)
	if err != nil {
		return Header{}, 0, err
	}
	n, err := Deliver(m, from, dst, combine)
	t.Release(m.Payload)
	return m.Header, n, err
}

// Deliver puts a received message m from rank `from` into dst and returns
// its length, as RecvInto (combine nil) or RecvReduce (combine set) do once
// they have the message: it copies the payload into dst, or combines it
// into dst when it is exactly len(dst) bytes; a payload longer than dst is
// left out, with the error TooLong gives. It does not release m's payload.
// Transports use it on their queued-message paths.
func Deliver(m Message, from int, dst []byte, combine Combine) (int, error) {
	n := len(m.Payload)
	switch {
	case n > len(dst):
		return n, TooLong(from, n, len(dst))
	case combine == nil:
		copy(dst, m.Payload)
	case n == len(dst):
		combine(dst, m.Payload)
	}
	return n, nil
}
