package transport_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/gdist/gdist/dist/transport"
)

// TestDeliver: a copy takes a payload up to the buffer's length, a combine
// only one of exactly its length, and a longer one is left out with
// ErrMessageTooLong naming the sender.
func TestDeliver(t *testing.T) {
	add := func(d, s []byte) {
		for i := range d {
			d[i] += s[i]
		}
	}
	msg := func(b ...byte) transport.Message { return transport.Message{Payload: b} }
	for _, tc := range []struct {
		name    string
		m       transport.Message
		combine transport.Combine
		want    []byte
		n       int
		tooLong bool
	}{
		{"copy", msg(1, 2, 3), nil, []byte{1, 2, 3}, 3, false},
		{"copy shorter", msg(7), nil, []byte{7, 20, 30}, 1, false},
		{"copy longer", msg(1, 2, 3, 4), nil, []byte{10, 20, 30}, 4, true},
		{"combine", msg(1, 2, 3), add, []byte{11, 22, 33}, 3, false},
		{"combine shorter", msg(1), add, []byte{10, 20, 30}, 1, false},
		{"combine longer", msg(1, 2, 3, 4), add, []byte{10, 20, 30}, 4, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := []byte{10, 20, 30}
			n, err := transport.Deliver(tc.m, 5, dst, tc.combine)
			assert.Equal(t, tc.n, n)
			assert.Equal(t, tc.want, dst)
			if tc.tooLong {
				assert.ErrorIs(t, err, transport.ErrMessageTooLong)
				assert.Contains(t, err.Error(), "rank 5")
			} else {
				assert.NoError(t, err)
			}
		})
	}
}
