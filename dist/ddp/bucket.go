package ddp

// Bucket layout: which parameters share a bucket, where each gradient lives
// in it, and the copies in and out of it.

import (
	"fmt"
	"time"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/internal/shard"
	"github.com/gdist/gdist/internal/vec"
)

// slot locates a parameter's gradient inside its bucket.
type slot struct {
	bucket, off, n int
}

// bucket is a group of consecutive parameters (in reverse order) whose
// gradients are all-reduced together.
type bucket struct {
	params  []int // parameter indices
	dt      tensor.Dtype
	n       int // elements of its parameters
	f32     []float32
	f64     []float64
	scratch []float32 // F64 parameters with compression: float32 staging
	wire    []byte    // compressed payload
	nGrad   int       // parameters of the bucket with a gradient node
	pending int       // of those, gradients not yet arrived in this pass

	work     *dist.Work // this step's all-reduce; nil before launch and at world size 1
	launched bool       // work started (or skipped at world size 1) this step
	launchAt time.Time
	firstAt  time.Time // this pass's first gradient of the bucket (timeline)
	readyAt  time.Time // its last one

	// ZeRO (see zero.go).
	padded int       // n rounded up to a multiple of the world size
	piece  int       // padded / world size: this rank's piece
	g32    []float32 // this rank's piece of the summed, then averaged, gradient
	g64    []float64
	stage  *staging   // ZeRO-2: the staging buffer the bucket uses; nil if it has its own
	filled bool       // ZeRO-2: its buffer holds this pass's gradients
	gather *dist.Work // the parameter all-gather after a step
}

// closedChan is the done channel of a bucket with nothing to wait for.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// done is closed when the bucket's all-reduce has finished; at once for a
// bucket with none (world size 1, or a launch that failed).
func (b *bucket) done() <-chan struct{} {
	if b.work == nil {
		return closedChan
	}
	return b.work.Done()
}

// doneAt is when the bucket's all-reduce finished, as the Work recorded it
// (its launch when there was none to run).
func (b *bucket) doneAt() time.Time {
	if b.work == nil {
		return b.launchAt
	}
	return b.work.Finished()
}

// release drops the bucket's buffers (Close). work stays: a Sync that was
// waiting when Close began reads it without the lock.
func (b *bucket) release() {
	b.f32, b.f64, b.scratch, b.wire = nil, nil, nil, nil
	b.g32, b.g64 = nil, nil
}

// buildBuckets assigns parameters, in reverse order, to buckets of at most
// firstBucketCap (the first) or bucketCap bytes and of one dtype.
func (d *DDP) buildBuckets() {
	var cur *bucket
	var curDT tensor.Dtype
	var curBytes, curN int
	flush := func() {
		if cur == nil {
			return
		}
		cur.dt, cur.n = curDT, curN
		if d.cfg.zero > 0 {
			d.shardBucket(cur, len(d.bkts))
		} else if curDT == tensor.Float32 {
			cur.f32 = make([]float32, curN)
		} else {
			cur.f64 = make([]float64, curN)
			if d.cfg.compress {
				cur.scratch = make([]float32, curN)
			}
		}
		if d.cfg.compress {
			cur.wire = make([]byte, curN*d.cfg.wire.Size())
		}
		d.bkts = append(d.bkts, cur)
		cur = nil
	}
	for i := len(d.params) - 1; i >= 0; i-- {
		p := d.params[i]
		n := shard.Numel(p)
		size := n * int(p.Dtype().Size())
		limit := d.cfg.bucketCap
		if len(d.bkts) == 0 {
			limit = d.cfg.firstBucketCap
		}
		if cur != nil && (p.Dtype() != curDT || curBytes+size > limit) {
			flush()
			limit = d.cfg.bucketCap
		}
		if cur == nil {
			cur, curDT, curBytes, curN = &bucket{}, p.Dtype(), 0, 0
		}
		d.slots[i] = slot{bucket: len(d.bkts), off: curN, n: n}
		cur.params = append(cur.params, i)
		curBytes += size
		curN += n
	}
	flush()
}

// copyParam copies parameter i's value into its bucket slot (toBucket) or
// back.
func (d *DDP) copyParam(i int, b *bucket, toBucket bool) error {
	s := d.slots[i]
	f32, f64, err := shard.Floats(d.params[i].Value())
	if err != nil {
		return fmt.Errorf("ddp: parameter %s: %w", d.params[i].Name(), err)
	}
	switch {
	case b.dt == tensor.Float32 && toBucket:
		copy(b.f32[s.off:s.off+s.n], f32)
	case b.dt == tensor.Float32:
		copy(f32, b.f32[s.off:s.off+s.n])
	case toBucket:
		copy(b.f64[s.off:s.off+s.n], f64)
	default:
		copy(f64, b.f64[s.off:s.off+s.n])
	}
	return nil
}

// addInto adds gradient g into slot s of bucket b, or copies it there if
// overwrite is set.
func addInto(b *bucket, s slot, g gorgonia.Value, overwrite bool) error {
	f32, f64, err := shard.Floats(g)
	if err != nil {
		return err
	}
	if len(f32)+len(f64) != s.n {
		return fmt.Errorf("%d gradient elements, want %d: %w", len(f32)+len(f64), s.n, dist.ErrInvalidArgument)
	}
	switch {
	case b.f32 != nil && f32 != nil && overwrite:
		copy(b.f32[s.off:s.off+s.n], f32)
	case b.f64 != nil && f64 != nil && overwrite:
		copy(b.f64[s.off:s.off+s.n], f64)
	case b.f32 != nil && f32 != nil:
		vec.AddF32(b.f32[s.off:s.off+s.n], f32)
	case b.f64 != nil && f64 != nil:
		vec.AddF64(b.f64[s.off:s.off+s.n], f64)
	default:
		return fmt.Errorf("gradient dtype %v differs from the parameter's: %w", g.Dtype(), dist.ErrUnsupportedDType)
	}
	return nil
}
