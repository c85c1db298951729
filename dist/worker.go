package dist

// The worker runs async collectives in issue order.

import (
	"context"
	"fmt"
)

// worker runs async collectives in the order they were issued.
func (g *ProcessGroup) worker() {
	defer g.wg.Done()
	for {
		g.mu.Lock()
		for len(g.queue) == 0 {
			if g.closed {
				g.mu.Unlock()
				return
			}
			g.mu.Unlock()
			select {
			case <-g.wake:
			case <-g.done:
			}
			g.mu.Lock()
		}
		w := g.queue[0]
		g.queue[0] = nil
		g.queue = g.queue[1:]
		g.mu.Unlock()
		g.exec(context.Background(), w.seq, &w.c, w) // finishes w
	}
}

// enqueue hands c to the worker and returns its Work.
func (g *ProcessGroup) enqueue(c call) *Work {
	w := &Work{c: c, done: make(chan struct{})}
	if err := c.check(g); err != nil {
		w.finish(err)
		return w
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		w.finish(fmt.Errorf("dist: %s: %w", c.kind, ErrClosed))
		return w
	}
	w.seq = g.next
	g.next++
	g.queue = append(g.queue, w)
	g.mu.Unlock()
	select {
	case g.wake <- struct{}{}:
	default:
	}
	return w
}
