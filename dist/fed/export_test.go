package fed

import (
	"context"
	"log/slog"
	"sync"

	"github.com/gdist/gdist/dist/fed/secagg"

	"github.com/gdist/gdist/dist/transport/tcp"
)

// KillLink drops the client's link without a goodbye, as a network that
// fails would: both sides see it lost.
func (c *Client) KillLink() {
	c.mu.Lock()
	lk := c.link
	c.mu.Unlock()
	if lk != nil {
		lk.tr.Kill()
	}
}

// Sample exposes the sampling of clients.
var Sample = sample

// SampleSize exposes the size of a round's sample.
var SampleSize = sampleSize

// StandIn is a leader that admits the clients that dial it, each with the
// model [1], and can die (Crash): its links break without a goodbye and
// nobody listens at its address any more, as when its process is killed.
type StandIn struct {
	ln    *tcp.Listener
	mu    sync.Mutex
	links []*link
	wg    sync.WaitGroup
}

// NewStandIn listens on a loopback port for a federation of world ranks.
func NewStandIn(world int, opts ...Option) (*StandIn, error) {
	cfg, err := apply(opts, roleLeader)
	if err != nil {
		return nil, err
	}
	ln, err := tcp.Listen(context.Background(), "127.0.0.1:0", world, cfg.tcpOptions()...)
	if err != nil {
		return nil, err
	}
	s := &StandIn{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			tt, _, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			lk, err := upgrade(context.Background(), tt, &cfg)
			if err != nil {
				continue
			}
			if _, p, err := lk.recv(context.Background()); err == nil {
				lk.release(p)
				lk.send(context.Background(), header{kind: kWelcome}, vecBytes([]float32{1}))
			}
			s.mu.Lock()
			s.links = append(s.links, lk)
			s.mu.Unlock()
		}
	}()
	return s, nil
}

// Addr is where the stand-in listens.
func (s *StandIn) Addr() string { return s.ln.Addr().String() }

// Crash kills the stand-in's links and stops listening.
func (s *StandIn) Crash() {
	s.ln.Close()
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, lk := range s.links {
		lk.tr.Kill()
	}
}

func quietLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

// DropAt makes the client drop its link, as a crash would, when the
// leader's message of the given secure aggregation stage arrives in round
// k, instead of answering it. Call it before the round.
func (c *Client) DropAt(k int, stage secagg.Stage) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropAt = func(s secagg.Stage) bool { return s == stage && c.sec != nil && c.sec.round == uint64(k) }
}
