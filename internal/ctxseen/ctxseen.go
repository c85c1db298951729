// Package ctxseen tells whether a call saw its context end: a Context
// records whether its Err was ever non-nil when asked. A call that saw its
// own context end must report that (errors.Is(err, ctx.Err())); a call
// that returned before its context ended need not, and checking ctx.Err()
// after the call returns cannot tell the two apart. Tests and benchmarks
// of cancellation use it.
//
// # Usage
//
//	ctx := ctxseen.New(parent)
//	err := pg.AllReduce(ctx, data, dist.Sum)
//	if ctx.Seen() && !errors.Is(err, context.Canceled) { ... }
package ctxseen

import (
	"context"
	"sync/atomic"
)

// Context is a context.Context that records whether its Err was seen
// non-nil.
type Context struct {
	context.Context
	seen atomic.Bool
}

// New returns a Context over parent.
func New(parent context.Context) *Context { return &Context{Context: parent} }

// Err returns the parent's Err, recording a non-nil one.
func (c *Context) Err() error {
	err := c.Context.Err()
	if err != nil {
		c.seen.Store(true)
	}
	return err
}

// Seen reports whether Err has returned non-nil.
func (c *Context) Seen() bool { return c.seen.Load() }
