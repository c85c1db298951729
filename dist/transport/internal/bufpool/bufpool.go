// Package bufpool is a size-classed free list of byte slices, used by the
// transports so that steady-state messaging does not allocate.
//
// Unlike sync.Pool it stores slices without boxing them (so Put does not
// allocate) and it bounds what it keeps per size class, so a burst of large
// messages does not pin memory for the life of the process.
package bufpool

import (
	"math/bits"
	"sync"
)

// keepBytes is roughly how many bytes each size class may keep idle, and
// keepMax how many slices: a burst of small messages does not leave a
// million idle 64-byte slices behind.
const (
	keepBytes = 64 << 20
	keepMax   = 8192
)

// Pool is a free list of byte slices bucketed by power-of-two capacity.
// The zero value is ready to use and safe for concurrent use.
type Pool struct {
	mu      sync.Mutex
	classes [64][][]byte
}

// Default is the pool the transports share.
var Default = &Pool{}

func class(n int) int {
	if n <= 64 {
		return 6
	}
	return bits.Len(uint(n - 1))
}

// Get returns a slice of length n. Its contents are unspecified. The caller
// owns it until it passes it to Put.
func (p *Pool) Get(n int) []byte {
	if n == 0 {
		return []byte{}
	}
	c := class(n)
	p.mu.Lock()
	free := p.classes[c]
	if k := len(free); k > 0 {
		b := free[k-1]
		free[k-1] = nil
		p.classes[c] = free[:k-1]
		p.mu.Unlock()
		return b[:n]
	}
	p.mu.Unlock()
	return make([]byte, n, 1<<c)
}

// Put returns b to the pool. b must not be used afterwards. Slices whose
// capacity is not a power of two (not obtained from Get) are dropped.
func (p *Pool) Put(b []byte) {
	c := cap(b)
	if c < 64 || c&(c-1) != 0 {
		return
	}
	k := bits.Len(uint(c)) - 1
	keep := min(max(keepBytes/c, 4), keepMax)
	p.mu.Lock()
	if len(p.classes[k]) < keep {
		p.classes[k] = append(p.classes[k], b[:c])
	}
	p.mu.Unlock()
}
