package pipeline

import (
	"fmt"
	"slices"
	"sync"

	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/internal/options"
)

// Schedule orders the forward and backward passes of a training step's
// micro-batches on each stage.
type Schedule uint8

const (
	// GPipe runs the forward passes of all micro-batches, then all the
	// backward passes (Huang et al., 2019). A stage keeps the activations
	// of every micro-batch (m copies of its graph) unless WithRecompute.
	GPipe Schedule = iota
	// OneFOneB (PipeDream-flush) runs p-s-1 warm-up forwards on stage s of
	// p, then alternates one forward and one backward, then drains the
	// backwards. It has GPipe's bubble but keeps at most p-s micro-batches
	// in flight, so it builds min(m, p-s) graphs instead of m.
	OneFOneB
)

// String returns "gpipe" or "1f1b".
func (s Schedule) String() string {
	switch s {
	case GPipe:
		return "gpipe"
	case OneFOneB:
		return "1f1b"
	}
	return fmt.Sprintf("Schedule(%d)", uint8(s))
}

// ParseSchedule returns the Schedule named "gpipe" or "1f1b".
func ParseSchedule(s string) (Schedule, error) {
	switch s {
	case "gpipe":
		return GPipe, nil
	case "1f1b":
		return OneFOneB, nil
	}
	return 0, fmt.Errorf("pipeline: %w: schedule %q (want gpipe or 1f1b)", ErrInvalidArgument, s)
}

// DefaultTagBase is the first point-to-point tag a pipeline uses by
// default; it uses TagSpan tags from there.
const DefaultTagBase uint32 = 0x40000000

// TagSpan is the number of point-to-point tags a pipeline uses, from its
// tag base.
const TagSpan uint32 = 1 << 24

// Option configures New. Each option checks its value when New applies it,
// and New fails with the first refusal: an error wrapping ErrInvalidArgument
// that names the option. A nil Option is refused the same way. Options not
// given keep their documented defaults.
type Option func(*config) error

type config struct {
	micro     int
	schedule  Schedule
	recompute bool
	loss      LossFunc
	target    tensor.Shape
	ranks     []int
	tagBase   uint32
	buildLock sync.Locker
	noInfer   bool
	noTrain   bool
}

// buildMu is the default lock around graph construction: Gorgonia's graph
// building touches package-level state.
var buildMu sync.Mutex

func defaultConfig() config {
	return config{micro: 1, tagBase: DefaultTagBase, buildLock: &buildMu}
}

// newConfig applies opts, in order, to the defaults.
func newConfig(opts []Option) (config, error) {
	cfg := defaultConfig()
	if err := options.Apply(&cfg, opts, "pipeline", ErrInvalidArgument); err != nil {
		return config{}, err
	}
	return cfg, nil
}

// WithMicroBatches sets the number of micro-batches m a batch is split into
// (default 1). Every stage must use the same m.
func WithMicroBatches(m int) Option {
	return func(c *config) error {
		if m < 1 || m > 1<<16 {
			return fmt.Errorf("pipeline: %w: WithMicroBatches(%d): want 1..65536", ErrInvalidArgument, m)
		}
		c.micro = m
		return nil
	}
}

// WithSchedule sets the training schedule (default GPipe). Every stage must
// use the same one.
func WithSchedule(s Schedule) Option {
	return func(c *config) error {
		if s != GPipe && s != OneFOneB {
			return fmt.Errorf("pipeline: %w: WithSchedule(%v): want GPipe or OneFOneB", ErrInvalidArgument, s)
		}
		c.schedule = s
		return nil
	}
}

// WithRecompute makes a stage keep only the input of each micro-batch
// between its forward and its backward pass and recompute the forward
// inside the backward (GPipe's re-materialisation): one graph per stage
// instead of one per micro-batch in flight, for about a third more compute
// on every stage but the last (which runs each micro-batch's forward and
// backward back to back anyway). Stages may differ in this setting.
func WithRecompute(on bool) Option {
	return func(c *config) error {
		c.recompute = on
		return nil
	}
}

// WithLoss sets the loss of the last stage; other stages ignore it. The
// batch loss is the mean of the micro-batch losses, so with a loss that is
// a mean over the rows of its micro-batch, TrainStep's gradients are those
// of the loss over the whole batch.
func WithLoss(f LossFunc) Option {
	return func(c *config) error {
		if f == nil {
			return fmt.Errorf("pipeline: %w: WithLoss(nil)", ErrInvalidArgument)
		}
		c.loss = f
		return nil
	}
}

// WithTargetShape sets the shape of the last stage's target tensor (the
// default is its OutputShape).
func WithTargetShape(shape ...int) Option {
	return func(c *config) error {
		for _, d := range shape {
			if d < 1 {
				return fmt.Errorf("pipeline: %w: WithTargetShape(%v): dimensions must be positive", ErrInvalidArgument, shape)
			}
		}
		if len(shape) == 0 {
			return fmt.Errorf("pipeline: %w: WithTargetShape(): empty shape", ErrInvalidArgument)
		}
		c.target = tensor.Shape(slices.Clone(shape))
		return nil
	}
}

// WithRanks runs stage i on group rank ranks[i] (default: stage i on rank
// i, every rank of the group a stage). The ranks must be distinct and
// include the caller's; every stage must pass the same list. ranks is
// copied.
func WithRanks(ranks ...int) Option {
	return func(c *config) error {
		if len(ranks) == 0 {
			return fmt.Errorf("pipeline: %w: WithRanks(): no ranks", ErrInvalidArgument)
		}
		seen := make(map[int]bool, len(ranks))
		for _, r := range ranks {
			if r < 0 || seen[r] {
				return fmt.Errorf("pipeline: %w: WithRanks(%v): want distinct ranks >= 0", ErrInvalidArgument, ranks)
			}
			seen[r] = true
		}
		c.ranks = slices.Clone(ranks)
		return nil
	}
}

// WithTagBase sets the first of the TagSpan point-to-point tags the
// pipeline uses (default DefaultTagBase). Pipelines that share a group at
// the same time need disjoint ranges, as do other users of point-to-point
// messages on the group.
func WithTagBase(base uint32) Option {
	return func(c *config) error {
		if uint64(base)+uint64(TagSpan) > uint64(dist.TagReservedBase) {
			return fmt.Errorf("pipeline: %w: WithTagBase(%#x): tags up to %#x would reach the reserved range", ErrInvalidArgument,
				base, uint64(base)+uint64(TagSpan))
		}
		c.tagBase = base
		return nil
	}
}

// WithBuildLock sets the lock New holds while it builds graphs (default: a
// package-level mutex). Code that builds other Gorgonia graphs concurrently
// with New in the same process should share a lock with it.
func WithBuildLock(l sync.Locker) Option {
	return func(c *config) error {
		if l == nil {
			return fmt.Errorf("pipeline: %w: WithBuildLock(nil)", ErrInvalidArgument)
		}
		c.buildLock = l
		return nil
	}
}

// WithInference sets whether New builds the forward-only graph Infer uses
// (default true). Without it Infer fails with ErrInvalidArgument.
func WithInference(on bool) Option {
	return func(c *config) error {
		c.noInfer = !on
		return nil
	}
}

// WithTraining sets whether New builds the graphs TrainStep uses (default
// true). Without them TrainStep fails with ErrInvalidArgument.
func WithTraining(on bool) Option {
	return func(c *config) error {
		c.noTrain = !on
		return nil
	}
}
