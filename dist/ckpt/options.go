package ckpt

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/gdist/gdist/dist"
)

// DefaultTag is the point-to-point tag a Manager uses (WithRankRNG) unless
// WithTag says otherwise.
const DefaultTag uint32 = 0x7C4B0000

// Option configures New. Options are validated by New.
type Option func(*config) error

type config struct {
	every    int64
	interval time.Duration
	keep     int
	stage    int // -1: data-parallel (rank 0 writes)
	rankRNG  bool
	tag      uint32
	logger   *slog.Logger

	freshOverDamaged bool
	worldChange      bool
}

func defaultConfig() config {
	return config{stage: -1, tag: DefaultTag}
}

// WithEvery makes Step save every n steps (n >= 1; default: never on a
// count, only on WithInterval or an explicit Save).
func WithEvery(n int64) Option {
	return func(o *config) error {
		if n < 1 {
			return fmt.Errorf("ckpt: %w: save every %d steps (want >= 1)", ErrInvalidArgument, n)
		}
		o.every = n
		return nil
	}
}

// WithInterval makes Step also save when d has passed since the last save
// (d > 0). Rank 0's clock decides, and it tells the other ranks with a
// one-element broadcast at every Step, so with this option Step is a
// collective that every rank must call after every step.
func WithInterval(d time.Duration) Option {
	return func(o *config) error {
		if d <= 0 {
			return fmt.Errorf("ckpt: %w: save interval %v (want > 0)", ErrInvalidArgument, d)
		}
		o.interval = d
		return nil
	}
}

// WithKeep keeps the k newest checkpoints (k >= 1; default
// checkpoint.DefaultKeep).
func WithKeep(k int) Option {
	return func(o *config) error {
		if k < 1 {
			return fmt.Errorf("ckpt: %w: keep %d checkpoints (want >= 1)", ErrInvalidArgument, k)
		}
		o.keep = k
		return nil
	}
}

// WithStage makes this rank pipeline stage k (k >= 0): it writes and reads
// its own layers in DIR/stage<k> (StageDir), and every rank is a writer.
// One rank per stage. Verify then compares only the step and epoch, which
// are all the stages have in common.
func WithStage(k int) Option {
	return func(o *config) error {
		if k < 0 {
			return fmt.Errorf("ckpt: %w: stage %d (want >= 0)", ErrInvalidArgument, k)
		}
		o.stage = k
		return nil
	}
}

// WithRankRNG saves every rank's RNG state, not only rank 0's: each
// data-parallel rank that draws its own random numbers (its own batches,
// dropout) hands its State.RNG to Save, the ranks send theirs to rank 0,
// which stores them in the checkpoint's metadata, and Resume gives each
// rank its own back in State.RNG. It makes Save a collective. Not with
// WithStage, where every stage saves its own RNG anyway.
func WithRankRNG() Option {
	return func(o *config) error {
		o.rankRNG = true
		return nil
	}
}

// WithStartFreshOverDamaged makes Resume start afresh (a Fresh result)
// when checkpoint files exist but none of them verifies, instead of failing
// with a *DamagedError: the damaged files are set aside (renamed
// ckpt-<step>.gdc.corrupt) and listed in Resumed.Skipped. Without it a
// directory of damaged files never silently restarts a run from step 0.
func WithStartFreshOverDamaged() Option {
	return func(o *config) error {
		o.freshOverDamaged = true
		return nil
	}
}

// WithTag sets the point-to-point tag WithRankRNG's messages use (default
// DefaultTag); it must be below dist.TagReservedBase and not used by
// anything else in the group.
func WithTag(tag uint32) Option {
	return func(o *config) error {
		if tag >= dist.TagReservedBase {
			return fmt.Errorf("ckpt: %w: tag %#x is reserved for collectives", ErrInvalidArgument, tag)
		}
		o.tag = tag
		return nil
	}
}

// WithLogger logs the checkpoints passed over, the step agreed on and
// every save (default: no logging).
func WithLogger(l *slog.Logger) Option {
	return func(o *config) error {
		if l == nil {
			return fmt.Errorf("ckpt: %w: nil logger", ErrInvalidArgument)
		}
		o.logger = l
		return nil
	}
}

// WithWorldChange lets a data-parallel job resume from a checkpoint saved by
// a job of another world size: every rank holds the whole state, so the
// checkpoint fits any number of ranks, and Resume reports the saved world
// size (Resumed.SavedWorld) and logs the change. The caller carries what
// depends on the world size over, as DistributedSampler.Resume does the
// sampler's position; RNG states saved per rank (WithRankRNG) are then not
// handed out (Resumed.State.RNG is nil on every rank). Without it, and
// with WithStage, a checkpoint of another world size is a *LayoutError.
func WithWorldChange() Option {
	return func(o *config) error {
		o.worldChange = true
		return nil
	}
}
