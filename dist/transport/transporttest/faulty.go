package transporttest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gdist/gdist/dist/transport"
)

// Killer is implemented by transports that can simulate a crash: after Kill
// the other ranks see this one as lost (transport.ErrPeerLost), not closed.
// transport.Local and tcp.Transport implement it.
type Killer interface {
	Kill()
}

// FaultConfig says which faults a Faulty injects. The zero value injects
// none. Faulty never drops or reorders messages: the transports it wraps
// promise reliable, ordered delivery, and so does it.
type FaultConfig struct {
	Seed      uint64        // seeds the random source; the same seed gives the same decisions
	DelayProb float64       // probability that a Send or Recv is delayed before it starts
	MaxDelay  time.Duration // delays are uniform in [0, MaxDelay)
	CutAfter  int           // if > 0, the CutAfter-th Send or Recv cuts the transport instead of running
	CutProb   float64       // probability that a Send or Recv cuts the transport instead of running
}

// Faulty wraps a Transport and injects the faults of its FaultConfig. It is
// safe for concurrent use if the wrapped transport is.
//
// Cutting a Faulty kills the wrapped transport if it implements Killer
// (the other ranks see a lost peer, as after a crash) and closes it
// otherwise; the cutting call and every later one return an error matching
// transport.ErrClosed.
type Faulty struct {
	inner transport.Transport
	cfg   FaultConfig

	mu  sync.Mutex
	rng *rand.Rand
	ops int

	cut atomic.Bool
}

var _ transport.Transport = (*Faulty)(nil)

// NewFaulty wraps t.
func NewFaulty(t transport.Transport, cfg FaultConfig) *Faulty {
	return &Faulty{inner: t, cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))}
}

// WrapAll wraps each transport of a job, rank i with seed cfg.Seed+i.
// The returned slice is new; ts is not modified.
func WrapAll(ts []transport.Transport, cfg FaultConfig) []transport.Transport {
	out := make([]transport.Transport, len(ts))
	for i, t := range ts {
		c := cfg
		c.Seed += uint64(i)
		out[i] = NewFaulty(t, c)
	}
	return out
}

// Unwrap returns the wrapped transport.
func (f *Faulty) Unwrap() transport.Transport { return f.inner }

// Cut crashes the wrapped transport now (see Faulty).
func (f *Faulty) Cut() {
	if f.cut.Swap(true) {
		return
	}
	if k, ok := f.inner.(Killer); ok {
		k.Kill()
	} else {
		f.inner.Close()
	}
}

// IsCut reports whether the transport was cut.
func (f *Faulty) IsCut() bool { return f.cut.Load() }

// Kill implements Killer by cutting.
func (f *Faulty) Kill() { f.Cut() }

// Rank implements transport.Transport.
func (f *Faulty) Rank() int { return f.inner.Rank() }

// WorldSize implements transport.Transport.
func (f *Faulty) WorldSize() int { return f.inner.WorldSize() }

// Send implements transport.Transport, possibly after a delay or instead of
// a cut.
func (f *Faulty) Send(ctx context.Context, to int, tag uint32, h transport.Header, p []byte) error {
	if err := f.before(ctx, "send"); err != nil {
		return err
	}
	return f.inner.Send(ctx, to, tag, h, p)
}

// Recv implements transport.Transport, possibly after a delay or instead of
// a cut.
func (f *Faulty) Recv(ctx context.Context, from int, tag uint32) (transport.Message, error) {
	if err := f.before(ctx, "recv"); err != nil {
		return transport.Message{}, err
	}
	return f.inner.Recv(ctx, from, tag)
}

// RecvInto implements transport.Transport, possibly after a delay or
// instead of a cut.
func (f *Faulty) RecvInto(ctx context.Context, from int, tag uint32, dst []byte) (transport.Header, int, error) {
	if err := f.before(ctx, "recv"); err != nil {
		return transport.Header{}, 0, err
	}
	return f.inner.RecvInto(ctx, from, tag, dst)
}

// Release implements transport.Transport.
func (f *Faulty) Release(p []byte) { f.inner.Release(p) }

// Close implements transport.Transport.
func (f *Faulty) Close() error { return f.inner.Close() }

// before decides this operation's fate and sleeps its delay.
func (f *Faulty) before(ctx context.Context, op string) error {
	if f.cut.Load() {
		return fmt.Errorf("transporttest: %s: cut: %w", op, transport.ErrClosed)
	}
	f.mu.Lock()
	f.ops++
	cut := (f.cfg.CutAfter > 0 && f.ops >= f.cfg.CutAfter) || (f.cfg.CutProb > 0 && f.rng.Float64() < f.cfg.CutProb)
	var d time.Duration
	if !cut && f.cfg.DelayProb > 0 && f.cfg.MaxDelay > 0 && f.rng.Float64() < f.cfg.DelayProb {
		d = time.Duration(f.rng.Int64N(int64(f.cfg.MaxDelay)))
	}
	f.mu.Unlock()
	if cut {
		f.Cut()
		return fmt.Errorf("transporttest: %s: cut: %w", op, transport.ErrClosed)
	}
	if d > 0 {
		tm := time.NewTimer(d)
		defer tm.Stop()
		select {
		case <-tm.C:
		case <-ctx.Done():
			return fmt.Errorf("transporttest: %s: %w", op, ctx.Err())
		}
	}
	return nil
}
