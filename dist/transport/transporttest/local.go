package transporttest

import (
	"testing"

	"github.com/gdist/gdist/dist/transport"
)

// NewLocal is transport.NewLocal for tests: it fails tb on an error.
func NewLocal(tb testing.TB, n int, opts ...transport.LocalOption) []*transport.Local {
	tb.Helper()
	ls, err := transport.NewLocal(n, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	return ls
}

// Locals is NewLocal as a slice of the interface.
func Locals(tb testing.TB, n int, opts ...transport.LocalOption) []transport.Transport {
	tb.Helper()
	ls := NewLocal(tb, n, opts...)
	ts := make([]transport.Transport, n)
	for i, l := range ls {
		ts[i] = l
	}
	return ts
}
