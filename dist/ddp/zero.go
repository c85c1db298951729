package ddp

// ZeRO-1 and ZeRO-2 (WithZeRO): the buckets of plain DDP, reduce-scattered
// instead of all-reduced. Every bucket is padded to a multiple of the world
// size and cut into one piece per rank; a rank receives the summed gradient
// of its own piece, averages it as DDP averages, and the Solver steps only
// the parameter segments of its pieces (through shard.Views) before the
// parameters are all-gathered bucket by bucket. ZeRO-2 keeps no gradient
// buffer per bucket: the buckets take turns in two staging buffers, bucket
// i in buffer i%2, so that bucket i+2 waits for bucket i's reduce-scatter.

import (
	"context"
	"fmt"
	"time"
	"unsafe"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/internal/shard"
)

// staging is one of ZeRO-2's two bucket buffers: the full (padded) gradients
// of the bucket that uses it during a backward pass, or its parameters
// during the all-gather after a step.
type staging struct {
	f32  []float32
	f64  []float64
	user *bucket    // the bucket whose data it holds, or nil
	work *dist.Work // the collective reading or writing it; nil: none in flight
}

// segment is a solver view's place: its bucket and its part of the rank's
// piece of that bucket.
type segment struct {
	bucket int
	shard.Segment
}

// shardBucket sizes bucket b (number bi) for ZeRO: pads it, allocates this
// rank's gradient piece and, for ZeRO-1 (or world size 1), its own buffer;
// for ZeRO-2 it grows staging buffer bi%2 to fit it. It also adds the
// segments of the rank's piece to d.segs.
func (d *DDP) shardBucket(b *bucket, bi int) {
	n := d.pg.WorldSize()
	b.piece = shard.Piece(b.n, n)
	b.padded = b.piece * n
	if b.dt == tensor.Float32 {
		b.g32 = make([]float32, b.piece)
	} else {
		b.g64 = make([]float64, b.piece)
	}
	if d.cfg.zero == 1 || n == 1 {
		if b.dt == tensor.Float32 {
			b.f32 = make([]float32, b.padded)
		} else {
			b.f64 = make([]float64, b.padded)
		}
	} else {
		st := &d.stages[bi%2]
		if b.dt == tensor.Float32 && len(st.f32) < b.padded {
			st.f32 = make([]float32, b.padded)
		}
		if b.dt == tensor.Float64 && len(st.f64) < b.padded {
			st.f64 = make([]float64, b.padded)
		}
		b.stage = st
	}
	var spans []shard.Span
	for _, i := range b.params {
		s := d.slots[i]
		spans = append(spans, shard.Span{Param: i, Off: s.off, Len: s.n})
	}
	for _, s := range shard.Segments(spans, b.piece, d.pg.Rank()) {
		d.segs = append(d.segs, segment{bucket: bi, Segment: s})
	}
}

// acquireLocked gives bucket b a full buffer in b.f32 or b.f64: its own, or
// (ZeRO-2) its staging buffer once the collective of the bucket that holds
// it has finished. If that bucket has not even started its reduce-scatter
// (its gradients are still arriving, out of bucket order), waiting could
// deadlock, so b gets a buffer of its own from then on. clearAll zeroes the
// buffer; otherwise only the padding and the slots of parameters without
// gradient are zeroed, and the caller overwrites the rest.
func (d *DDP) acquireLocked(b *bucket, clearAll bool) error {
	st := b.stage
	if st != nil && st.user != nil && st.user != b {
		if st.work != nil {
			<-st.work.Done()
			if err := st.work.Err(); err != nil {
				return fmt.Errorf("ddp: collective of the bucket staged before: %w", err)
			}
		} else {
			b.stage, st = nil, nil
			if b.dt == tensor.Float32 {
				b.f32 = make([]float32, b.padded)
			} else {
				b.f64 = make([]float64, b.padded)
			}
		}
	}
	if st != nil {
		st.user, st.work = b, nil
		if b.dt == tensor.Float32 {
			b.f32 = st.f32[:b.padded]
		} else {
			b.f64 = st.f64[:b.padded]
		}
	}
	if clearAll || b.nGrad < len(b.params) {
		clear(b.f32)
		clear(b.f64)
	} else {
		clear(b.f32[min(b.n, len(b.f32)):])
		clear(b.f64[min(b.n, len(b.f64)):])
	}
	return nil
}

// reduceScatterLocked starts bucket b's reduce-scatter into its gradient
// piece (at world size 1, a copy).
func (d *DDP) reduceScatterLocked(b *bucket) (*dist.Work, int) {
	if d.pg.WorldSize() == 1 {
		copy(b.g32, b.f32)
		copy(b.g64, b.f64)
		return nil, 4*len(b.f32) + 8*len(b.f64)
	}
	var w *dist.Work
	if b.dt == tensor.Float32 {
		w = d.pg.ReduceScatterAsync(launchCtx, dist.F32(b.g32), dist.F32(b.f32[:b.padded]), dist.Sum)
	} else {
		w = d.pg.ReduceScatterAsync(launchCtx, dist.F64(b.g64), dist.F64(b.f64[:b.padded]), dist.Sum)
	}
	if b.stage != nil {
		b.stage.work = w
	}
	return w, 4*len(b.f32) + 8*len(b.f64)
}

// averageShardsLocked divides the summed gradient pieces as writeGradsLocked
// divides DDP's buckets, bitwise alike.
func (d *DDP) averageShardsLocked() {
	div := d.divisorLocked(false)
	for _, b := range d.bkts {
		shard.ScaleInto(b.g32, b.g32, float32(div))
		shard.ScaleInto(b.g64, b.g64, div)
	}
}

// clipLocked clips the averaged gradients to the global norm
// cfg.maxGradNorm and records the norm. Under ZeRO the squares of this
// rank's segments are summed and all-reduced (padding is left out);
// otherwise every rank holds every gradient and computes the norm alone.
func (d *DDP) clipLocked(ctx context.Context) error {
	var grads []shard.Grad
	var pg *dist.ProcessGroup
	if d.cfg.zero > 0 {
		pg = d.pg
		for _, s := range d.segs {
			b := d.bkts[s.bucket]
			if b.g32 != nil {
				grads = append(grads, shard.Grad{F32: b.g32[s.Off : s.Off+s.Len]})
			} else {
				grads = append(grads, shard.Grad{F64: b.g64[s.Off : s.Off+s.Len]})
			}
		}
	} else {
		for i, p := range d.params {
			if d.gradNodes[i] == nil {
				continue
			}
			gv, err := p.Grad()
			if err != nil {
				return fmt.Errorf("ddp: gradient of %s: %w", p.Name(), err)
			}
			f32, f64, err := shard.Floats(gv)
			if err != nil {
				return fmt.Errorf("ddp: gradient of %s: %w", p.Name(), err)
			}
			grads = append(grads, shard.Grad{F32: f32, F64: f64})
		}
	}
	norm, err := shard.ClipByGlobalNorm(ctx, pg, grads, d.cfg.maxGradNorm)
	if err != nil {
		return fmt.Errorf("ddp: %w", err)
	}
	d.gradNorm = norm
	return nil
}

// GradNorm returns the global L2 norm of the averaged gradients before
// clipping, as of the last Sync (WithMaxGradNorm; 0 without it).
func (d *DDP) GradNorm() float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.gradNorm
}

// viewsLocked returns the solver's views of this rank's segments, bucket by
// bucket, (re)made over the parameters' current values.
func (d *DDP) viewsLocked() ([]gorgonia.ValueGrad, error) {
	if len(d.views) != len(d.segs) {
		d.views = make([]gorgonia.ValueGrad, len(d.segs))
		d.viewBase = make([]uintptr, len(d.segs))
	}
	for k, s := range d.segs {
		p := d.params[s.Param]
		f32, f64, err := shard.Floats(p.Value())
		if err != nil {
			return nil, fmt.Errorf("ddp: parameter %s: %w", p.Name(), err)
		}
		base := dataPtr(f32, f64)
		if d.views[k] != nil && d.viewBase[k] == base {
			continue
		}
		b := d.bkts[s.bucket]
		var v *shard.View
		if f32 != nil {
			v, err = shard.SegmentView(p, s.Segment, f32[s.ParamOff:s.ParamOff+s.Len], b.g32[s.Off:s.Off+s.Len], nil, nil)
		} else {
			v, err = shard.SegmentView(p, s.Segment, nil, nil, f64[s.ParamOff:s.ParamOff+s.Len], b.g64[s.Off:s.Off+s.Len])
		}
		if err != nil {
			return nil, err
		}
		d.views[k], d.viewBase[k] = v, base
	}
	return d.views, nil
}

// dataPtr identifies a backing array by its first element's address.
func dataPtr(f32 []float32, f64 []float64) uintptr {
	switch {
	case len(f32) > 0:
		return uintptr(unsafe.Pointer(&f32[0]))
	case len(f64) > 0:
		return uintptr(unsafe.Pointer(&f64[0]))
	}
	return 0
}

// gatherParams all-gathers the parameters after this rank stepped its
// pieces: bucket by bucket, the rank copies its piece of the parameters
// into the bucket's buffer, the buffers are all-gathered in place and
// copied back into the parameters. With ZeRO-1 every bucket's all-gather
// starts at once; ZeRO-2's two staging buffers keep two in flight.
func (d *DDP) gatherParams(ctx context.Context) error {
	if d.pg.WorldSize() == 1 {
		return nil // the segments cover every parameter
	}
	start := time.Now()
	ahead := len(d.bkts)
	if d.cfg.zero == 2 {
		ahead = 2
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.closedLocked("parameter all-gather"); err != nil {
		return err
	}
	for bi := range min(ahead, len(d.bkts)) {
		if err := d.launchGatherLocked(bi); err != nil {
			return d.failLocked(err)
		}
	}
	for bi, b := range d.bkts {
		select {
		case <-b.gather.Done():
		case <-ctx.Done():
			return d.failLocked(fmt.Errorf("ddp: parameter all-gather: %w", ctx.Err()))
		}
		if err := b.gather.Err(); err != nil {
			return d.failLocked(fmt.Errorf("ddp: parameter all-gather of bucket %d: %w", bi, err))
		}
		for _, i := range b.params {
			if err := d.copyParam(i, b, false); err != nil {
				return d.failLocked(err)
			}
		}
		b.gather = nil
		if b.stage != nil {
			b.stage.user, b.stage.work = nil, nil
		}
		if next := bi + ahead; next < len(d.bkts) {
			if err := d.launchGatherLocked(next); err != nil {
				return d.failLocked(err)
			}
		}
	}
	d.last.Gather = time.Since(start)
	return nil
}

// launchGatherLocked copies this rank's piece of bucket bi's parameters into
// the bucket's buffer and starts the buffer's all-gather.
func (d *DDP) launchGatherLocked(bi int) error {
	b := d.bkts[bi]
	if err := d.acquireLocked(b, false); err != nil {
		return err
	}
	lo := d.pg.Rank() * b.piece
	for _, s := range d.segs {
		if s.bucket != bi {
			continue
		}
		f32, f64, err := shard.Floats(d.params[s.Param].Value())
		if err != nil {
			return fmt.Errorf("ddp: parameter %s: %w", d.params[s.Param].Name(), err)
		}
		if f32 != nil {
			copy(b.f32[lo+s.Off:lo+s.Off+s.Len], f32[s.ParamOff:])
		} else {
			copy(b.f64[lo+s.Off:lo+s.Off+s.Len], f64[s.ParamOff:])
		}
	}
	if b.dt == tensor.Float32 {
		b.gather = d.pg.AllGatherAsync(launchCtx, dist.F32(b.f32[:b.padded]), dist.F32(b.f32[lo:lo+b.piece]))
	} else {
		b.gather = d.pg.AllGatherAsync(launchCtx, dist.F64(b.f64[:b.padded]), dist.F64(b.f64[lo:lo+b.piece]))
	}
	if b.stage != nil {
		b.stage.work = b.gather
	}
	return nil
}

// Memory is what a DDP holds on this rank besides the parameters (which it
// leaves in the model's tensors), in bytes counted from its buffers.
type Memory struct {
	// Buckets is the gradient bucket buffers: one per bucket, the size of
	// the model, in plain DDP and ZeRO-1; ZeRO-2's two staging buffers (plus
	// any bucket that had to get its own, see WithZeRO).
	Buckets int64
	// Shards is ZeRO's pieces of the averaged gradient: 1/WorldSize of the
	// model (0 in plain DDP, whose averaged gradients are written into the
	// parameters' gradients, param.Grad()).
	Shards int64
	// Compression is the staging of WithCompression.
	Compression int64
}

// Memory returns the bytes of the DDP's own buffers on this rank.
func (d *DDP) Memory() Memory {
	d.mu.Lock()
	defer d.mu.Unlock()
	var m Memory
	for _, b := range d.bkts {
		if b.stage == nil {
			m.Buckets += int64(4*cap(b.f32) + 8*cap(b.f64))
		}
		m.Shards += int64(4*cap(b.g32) + 8*cap(b.g64))
		m.Compression += int64(4*cap(b.scratch) + cap(b.wire))
	}
	for _, st := range d.stages {
		m.Buckets += int64(4*cap(st.f32) + 8*cap(st.f64))
	}
	return m
}
