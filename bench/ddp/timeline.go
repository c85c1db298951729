package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/gdist/gdist/dist/transport"
)

type tlEvent struct {
	what       string
	start, end time.Time
	n          int
}

type recorder struct {
	transport.Transport
	mu  sync.Mutex
	evs []tlEvent
	on  bool
}

func (r *recorder) Send(ctx context.Context, to int, tag uint32, meta transport.Meta, p []byte) error {
	s := time.Now()
	err := r.Transport.Send(ctx, to, tag, meta, p)
	r.add("send", s, len(p))
	return err
}

func (r *recorder) Recv(ctx context.Context, from int, tag uint32) (transport.Message, error) {
	s := time.Now()
	m, err := r.Transport.Recv(ctx, from, tag)
	r.add("recv", s, len(m.Payload))
	return m, err
}

func (r *recorder) add(what string, s time.Time, n int) {
	r.mu.Lock()
	if r.on {
		r.evs = append(r.evs, tlEvent{what, s, time.Now(), n})
	}
	r.mu.Unlock()
}

func (r *recorder) mark(what string) { r.add(what, time.Now(), 0) }

func (r *recorder) dump(t0 time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var first, last, runall, stepped float64 = -1, 0, 0, 0
	nsend := 0
	var sendT, recvT float64
	for _, e := range r.evs {
		switch e.what {
		case "send":
			if first < 0 { first = ms(e.start.Sub(t0)) }
			nsend++
			sendT += ms(e.end.Sub(e.start))
		case "recv":
			last = ms(e.end.Sub(t0))
			recvT += ms(e.end.Sub(e.start))
		case "runall":
			runall = ms(e.start.Sub(t0))
		case "stepped":
			stepped = ms(e.start.Sub(t0))
		}
	}
	fmt.Fprintf(os.Stderr, "runall %6.1f first send %6.1f last recv %6.1f stepped %6.1f sends %d send-time %6.1f recv-time %6.1f\n", runall, first, last, stepped, nsend, sendT, recvT)
	r.evs = r.evs[:0]
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }
