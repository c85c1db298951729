package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/gdist/gdist/dist/transport"
)

// limited is a transport.Transport whose outgoing link has a fixed
// bandwidth: a slower network simulated on loopback. Every Send to another
// rank first reserves the link for len(p)/rate seconds, after the
// reservations already made (a token bucket with no burst, shared by all
// peers like one network interface), and sleeps until its reservation ends:
// a message leaves when it would have finished serialising on the slow
// link. Receives and sends to self are not limited. The sleep watches ctx.
type limited struct {
	transport.Transport
	rate float64 // bytes per second

	mu   sync.Mutex
	free time.Time // when the link is idle again (guarded by mu)
}

// limit wraps t so that it sends at most rate bytes per second.
func limit(t transport.Transport, rate float64) (*limited, error) {
	if !(rate > 0) {
		return nil, fmt.Errorf("bench: link rate %v bytes/s must be positive", rate)
	}
	return &limited{Transport: t, rate: rate}, nil
}

// Send implements transport.Transport.
func (l *limited) Send(ctx context.Context, to int, tag uint32, h transport.Header, p []byte) error {
	if to != l.Rank() && len(p) > 0 {
		l.mu.Lock()
		now := time.Now()
		start := l.free
		if start.Before(now) {
			start = now
		}
		end := start.Add(time.Duration(float64(len(p)) / l.rate * float64(time.Second)))
		l.free = end
		l.mu.Unlock()
		if d := time.Until(end); d > 0 {
			tm := time.NewTimer(d)
			select {
			case <-tm.C:
			case <-ctx.Done():
				tm.Stop()
				return fmt.Errorf("bench: limited send to rank %d: %w", to, ctx.Err())
			}
		}
	}
	return l.Transport.Send(ctx, to, tag, h, p)
}
