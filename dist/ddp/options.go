package ddp

import (
	"fmt"
	"math"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/internal/options"
)

// Defaults of the bucket options (the same as PyTorch's DistributedDataParallel).
const (
	// DefaultBucketCap is the default size cap of a gradient bucket, in bytes
	// of the parameters' dtype.
	DefaultBucketCap = 25 << 20
	// DefaultFirstBucketCap is the default cap of the first bucket (the last
	// parameters, whose gradients are ready first): small so that the first
	// all-reduce starts early in the backward pass.
	DefaultFirstBucketCap = 1 << 20
)

// Option configures Wrap. Each option checks its value when Wrap applies
// it, and Wrap fails with the first refusal: an error wrapping
// dist.ErrInvalidArgument that names the option. A nil Option is refused
// the same way. Options not given keep their documented defaults.
type Option func(*config) error

type config struct {
	bucketCap      int
	firstBucketCap int
	overlap        bool
	compress       bool
	wire           dist.DType
	accumulation   int
	zero           int     // ZeRO stage: 0 (plain DDP), 1 or 2
	maxGradNorm    float64 // clip to this global L2 norm; 0: no clipping
}

func defaultConfig() config {
	return config{
		bucketCap:      DefaultBucketCap,
		firstBucketCap: DefaultFirstBucketCap,
		overlap:        true,
		accumulation:   1,
	}
}

// newConfig applies opts, in order, to the defaults.
func newConfig(opts []Option) (config, error) {
	cfg := defaultConfig()
	if err := options.Apply(&cfg, opts, "ddp", dist.ErrInvalidArgument); err != nil {
		return config{}, err
	}
	switch {
	case cfg.zero > 0 && cfg.compress:
		return config{}, fmt.Errorf("ddp: WithZeRO(%d) with WithCompression: reduce-scatters travel in the parameters' dtype: %w", cfg.zero, dist.ErrInvalidArgument)
	case cfg.zero == 2 && cfg.accumulation > 1:
		return config{}, fmt.Errorf("ddp: WithZeRO(2) with WithAccumulation(%d): ZeRO-2 frees the gradients outside this rank's shard after every pass, so it cannot accumulate them (ZeRO-1 can): %w", cfg.accumulation, dist.ErrInvalidArgument)
	case cfg.zero == 2 && !cfg.overlap:
		return config{}, fmt.Errorf("ddp: WithZeRO(2) with WithOverlap(false): ZeRO-2 reuses two staging buffers, so each bucket's reduce-scatter must start as soon as its gradients are complete: %w", dist.ErrInvalidArgument)
	}
	return cfg, nil
}

// WithBucketCap sets the size cap of a gradient bucket in bytes (of the
// parameters' dtype); bytes must be positive. A parameter larger than the
// cap gets a bucket of its own. The default is DefaultBucketCap.
func WithBucketCap(bytes int) Option {
	return func(c *config) error {
		if bytes <= 0 {
			return fmt.Errorf("ddp: WithBucketCap(%d): must be positive: %w", bytes, dist.ErrInvalidArgument)
		}
		c.bucketCap = bytes
		return nil
	}
}

// WithFirstBucketCap sets the size cap of the first bucket in bytes; bytes
// must be positive. The default is DefaultFirstBucketCap.
func WithFirstBucketCap(bytes int) Option {
	return func(c *config) error {
		if bytes <= 0 {
			return fmt.Errorf("ddp: WithFirstBucketCap(%d): must be positive: %w", bytes, dist.ErrInvalidArgument)
		}
		c.firstBucketCap = bytes
		return nil
	}
}

// WithOverlap chooses when buckets are all-reduced. With true (the default)
// a bucket's all-reduce starts, asynchronously, as soon as the backward pass
// has produced all of its gradients, so communication overlaps the rest of
// backprop. With false every all-reduce starts in Sync, after the backward
// pass: the baseline against which overlap is measured.
func WithOverlap(on bool) Option {
	return func(c *config) error {
		c.overlap = on
		return nil
	}
}

// WithCompression all-reduces gradients in dt on the wire (dist.Float16 or
// dist.BFloat16; dist.Float32 for float64 parameters) through AllReduceTyped, which
// accumulates in float64 at every hop. Gradients are divided by the world
// size (and by the number of accumulated passes, see WithAccumulation)
// before they are narrowed, as PyTorch's fp16 compression hook does, which
// keeps F16 sums in range. The result is rounded to dt once per hop, so it
// is only approximately the uncompressed average (F16: about 3 significant
// decimal digits, BF16: about 2); it is the same on every rank.
func WithCompression(dt dist.DType) Option {
	return func(c *config) error {
		switch dt {
		case dist.Float16, dist.BFloat16, dist.Float32:
		default:
			return fmt.Errorf("ddp: WithCompression(%v): want f16, bf16 or f32: %w", dt, dist.ErrInvalidArgument)
		}
		c.compress, c.wire = true, dt
		return nil
	}
}

// WithAccumulation makes the Solver returned by DDP.Solver accumulate
// gradients over k backward passes: its Step only counts the first k-1 calls
// of every k (no communication happens during their backward passes, and the
// inner solver is not called) and on the k-th call synchronises and steps.
// The gradient handed to the inner solver is then the mean over the k passes
// and over all ranks, so with a per-pass mean loss it equals the gradient of
// the mean loss over all k·WorldSize micro-batches. k must be at least 1; 1
// (the default) means no accumulation.
func WithAccumulation(k int) Option {
	return func(c *config) error {
		if k < 1 {
			return fmt.Errorf("ddp: WithAccumulation(%d): must be at least 1: %w", k, dist.ErrInvalidArgument)
		}
		c.accumulation = k
		return nil
	}
}

// WithZeRO shards the training state over the ranks as DeepSpeed's ZeRO
// stages do. Stage 0 (the default) is plain DDP. With stage 1 (ZeRO-1)
// each bucket's gradients are reduce-scattered instead of all-reduced, so
// each rank receives the averaged gradient of its own piece of the bucket
// (1/WorldSize of it); the Solver steps only those pieces, so the inner
// solver's state covers 1/WorldSize of the model, and then all-gathers the
// updated parameters. Stage 2 (ZeRO-2) also drops the gradients outside
// the rank's piece: the buckets are staged through two reusable buffers
// instead of one buffer per bucket, so a rank keeps 1/WorldSize of the
// gradients between steps. Stage 3 (the parameters too) is package
// dist/fsdp.
//
// ZeRO works with any gorgonia.Solver stepped through DDP.Solver (see the
// package documentation) and not with WithCompression; ZeRO-2 also not with
// WithAccumulation or WithOverlap(false).
func WithZeRO(stage int) Option {
	return func(c *config) error {
		switch stage {
		case 0, 1, 2:
		case 3:
			return fmt.Errorf("ddp: WithZeRO(3): parameters are sharded by package dist/fsdp: %w", dist.ErrInvalidArgument)
		default:
			return fmt.Errorf("ddp: WithZeRO(%d): want 0, 1 or 2: %w", stage, dist.ErrInvalidArgument)
		}
		c.zero = stage
		return nil
	}
}

// WithMaxGradNorm clips the averaged gradients before every optimiser step
// so that their global L2 norm, over all parameters, is at most max: when
// the norm exceeds it, every gradient is multiplied by max/(norm+1e-6), as
// torch.nn.utils.clip_grad_norm_ does. Under ZeRO each rank sums the squares
// of its own piece and one all-reduce of a number gives the global norm.
// max must be positive and finite; the default is no clipping. DDP.GradNorm
// reports the norm before clipping.
func WithMaxGradNorm(max float64) Option {
	return func(c *config) error {
		if !(max > 0) || math.IsInf(max, 0) {
			return fmt.Errorf("ddp: WithMaxGradNorm(%v): must be positive and finite: %w", max, dist.ErrInvalidArgument)
		}
		c.maxGradNorm = max
		return nil
	}
}
