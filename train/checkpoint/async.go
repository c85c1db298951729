package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"gorgonia.org/tensor"
)

// Async saves checkpoints to a Dir on a goroutine of its own, so that a
// training loop stalls only for a copy of its state: Save copies the state
// and returns, and the copy is written (SaveStep: atomic write, verify,
// prune) while training goes on. At most one write is in flight; a Save
// that comes while the previous write is still running waits for it first.
//
// A failed write is reported by the next Save, Wait or Close, as a
// *WriteError. Close waits for the write in flight and stops the goroutine.
// The methods may be called from several goroutines; they are serialised.
type Async struct {
	d    *Dir
	jobs chan *asyncJob
	exit chan struct{} // closed when the goroutine returns

	mu       sync.Mutex // serialises Save, Wait and Close
	closed   bool
	inflight *asyncJob
	spare    *State // the last written snapshot, whose buffers Save reuses

	statsMu sync.Mutex
	stats   AsyncStats
}

type asyncJob struct {
	step  int64
	state *State
	done  chan struct{} // closed after err is set
	err   error
}

// AsyncStats are an Async writer's running totals.
type AsyncStats struct {
	// Saves counts snapshots taken, Writes the writes that completed
	// (successfully or not) and Failed those that failed.
	Saves, Writes, Failed int
	// Copy is the total time Save spent copying state (what training
	// waits for); Write the total time spent writing.
	Copy, Write time.Duration
	// LastCopy and LastWrite are the durations of the latest ones.
	LastCopy, LastWrite time.Duration
	// LastPath is the path of the latest checkpoint written successfully.
	LastPath string
}

// WriteError reports a checkpoint write that failed on the writer's
// goroutine.
type WriteError struct {
	Step int64
	Err  error
}

func (e *WriteError) Error() string {
	return fmt.Sprintf("checkpoint: async write of step %d: %v", e.Step, e.Err)
}

func (e *WriteError) Unwrap() error { return e.Err }

// NewAsync returns a writer to d and starts its goroutine; Close stops it.
func NewAsync(d *Dir) *Async {
	a := &Async{d: d, jobs: make(chan *asyncJob, 1), exit: make(chan struct{})}
	go a.run()
	return a
}

func (a *Async) run() {
	defer close(a.exit)
	for j := range a.jobs {
		start := time.Now()
		path, err := a.d.SaveStep(j.step, j.state)
		took := time.Since(start)
		a.statsMu.Lock()
		a.stats.Writes++
		a.stats.Write += took
		a.stats.LastWrite = took
		if err != nil {
			a.stats.Failed++
		} else {
			a.stats.LastPath = path
		}
		a.statsMu.Unlock()
		if err != nil {
			j.err = &WriteError{Step: j.step, Err: err}
		}
		close(j.done)
	}
}

// Stats returns the writer's running totals.
func (a *Async) Stats() AsyncStats {
	a.statsMu.Lock()
	defer a.statsMu.Unlock()
	return a.stats
}

// settle waits for the write in flight, if any, and returns its error. It
// is called with a.mu held; ctx nil means wait without a deadline.
func (a *Async) settle(ctx context.Context) error {
	j := a.inflight
	if j == nil {
		return nil
	}
	if ctx == nil {
		<-j.done
	} else {
		select {
		case <-j.done:
		case <-ctx.Done():
			return fmt.Errorf("checkpoint: waiting for the write of step %d: %w", j.step, ctx.Err())
		}
	}
	a.inflight = nil
	a.spare = j.state
	return j.err
}

// Save copies s (deeply: tensors, optimizer slots, byte slices and maps;
// Config is encoded to JSON now) and queues the copy to be written as the
// checkpoint of step. It returns once the copy is made, so s may change as
// soon as it returns; it first waits (watching ctx) for the previous write
// if that is still running.
//
// An error from Save is one of: the failure of the previous write (a
// *WriteError; this call's snapshot was still taken and queued), ctx's
// error while waiting, ErrClosed after Close, or an error copying s (the
// last three mean nothing was queued).
func (a *Async) Save(ctx context.Context, step int64, s *State) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return ErrClosed
	}
	if step < 0 || s == nil {
		return fmt.Errorf("checkpoint: %w: step %d, state %p", ErrInvalidArgument, step, s)
	}
	prev := a.settle(ctx)
	if a.inflight != nil { // ctx ended while waiting
		return prev
	}
	start := time.Now()
	snap, err := snapshot(s, a.spare)
	took := time.Since(start)
	if err != nil {
		return errors.Join(prev, err)
	}
	a.spare = nil
	a.statsMu.Lock()
	a.stats.Saves++
	a.stats.Copy += took
	a.stats.LastCopy = took
	a.statsMu.Unlock()
	j := &asyncJob{step: step, state: snap, done: make(chan struct{})}
	a.inflight = j
	a.jobs <- j // never blocks: the goroutine has taken every earlier job
	return prev
}

// Wait waits for the write in flight, if any, and returns its error (each
// failure is reported once). It returns ctx's error if ctx ends first, and
// ErrClosed after Close.
func (a *Async) Wait(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return ErrClosed
	}
	return a.settle(ctx)
}

// Close waits for the write in flight, stops the goroutine and returns the
// write's error, if any not yet reported. Close is idempotent; later calls
// return nil, and Save and Wait after Close return ErrClosed.
func (a *Async) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	a.closed = true
	err := a.settle(nil)
	close(a.jobs)
	<-a.exit
	a.spare = nil
	return err
}

// snapshot deep-copies s, reusing the buffers of spare (a previous
// snapshot) where names, types and sizes match.
func snapshot(s *State, spare *State) (*State, error) {
	cfg, err := json.Marshal(s.Config)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: encoding config: %w", err)
	}
	out := &State{Config: json.RawMessage(cfg), Step: s.Step, Epoch: s.Epoch,
		Sampler: cloneBytes(s.Sampler), RNG: cloneBytes(s.RNG), Meta: maps.Clone(s.Meta)}
	var oldParams, oldSlots []Named
	if spare != nil {
		oldParams = spare.Params
		if spare.Optimizer != nil {
			oldSlots = spare.Optimizer.Slots
		}
	}
	if out.Params, err = copyTensors(s.Params, oldParams); err != nil {
		return nil, err
	}
	if o := s.Optimizer; o != nil {
		oc := &Optimizer{Kind: o.Kind, Iter: o.Iter, Scalars: maps.Clone(o.Scalars), Strings: maps.Clone(o.Strings)}
		if oc.Slots, err = copyTensors(o.Slots, oldSlots); err != nil {
			return nil, err
		}
		out.Optimizer = oc
	}
	return out, nil
}

func cloneBytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte(nil), b...)
}

// copyTensors copies ts into dense tensors, reusing old's backing arrays
// where the entry at the same index has the same name, dtype and size.
func copyTensors(ts, old []Named) ([]Named, error) {
	if ts == nil {
		return nil, nil
	}
	out := make([]Named, len(ts))
	for i, nt := range ts {
		src, code, shape, err := prepare(nt.Tensor)
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %w", nt.Name, err)
		}
		if src.n == 0 {
			out[i] = Named{Name: nt.Name, Tensor: tensor.New(tensor.Of(dtypeOf(code)), tensor.WithShape(shape...))}
			continue
		}
		var reuse any
		if i < len(old) && old[i].Name == nt.Name {
			if d, ok := old[i].Tensor.(*tensor.Dense); ok && d.Dtype() == dtypeOf(code) && d.Shape().TotalSize() == src.n {
				reuse = d.Data()
			}
		}
		back := copyData(src, reuse)
		out[i] = Named{Name: nt.Name, Tensor: tensor.New(tensor.WithShape(shape...), tensor.WithBacking(back))}
	}
	return out, nil
}

// copyData copies the first s.n elements of s.data into dst (a slice of
// the same type and at least that length) or a new slice.
func copyData(s source, dst any) any {
	switch v := s.data.(type) {
	case []float32:
		d, _ := dst.([]float32)
		if len(d) < s.n {
			d = make([]float32, s.n)
		}
		copy(d, v[:s.n])
		return d[:s.n]
	case []float64:
		d, _ := dst.([]float64)
		if len(d) < s.n {
			d = make([]float64, s.n)
		}
		copy(d, v[:s.n])
		return d[:s.n]
	case []int32:
		d, _ := dst.([]int32)
		if len(d) < s.n {
			d = make([]int32, s.n)
		}
		copy(d, v[:s.n])
		return d[:s.n]
	case []int64:
		d, _ := dst.([]int64)
		if len(d) < s.n {
			d = make([]int64, s.n)
		}
		copy(d, v[:s.n])
		return d[:s.n]
	}
	panic("checkpoint: unreachable dtype")
}
