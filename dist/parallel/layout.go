package parallel

import (
	"context"
	"fmt"
	"sync"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/internal/options"
	"github.com/gdist/gdist/models/transformer"
	"github.com/gdist/gdist/train/checkpoint"
)

// ErrInvalidArgument is matched by the errors of bad arguments and
// options. It is the value every gdist package exports under this name.
var ErrInvalidArgument = dist.ErrInvalidArgument

// Layout is the shape of a 3-D parallel job: DP data-parallel replicas,
// each a pipeline of PP stages, each stage split over TP tensor-parallel
// members; DP*PP*TP is the world size. Ranks are laid out as Megatron-LM
// lays them: tensor-parallel members adjacent (rank = (dp*PP + pp)*TP +
// tp), so a stage's members share a host before anything else does.
type Layout struct {
	DP, PP, TP int
}

// String formats l as "dp=2 pp=2 tp=2".
func (l Layout) String() string { return fmt.Sprintf("dp=%d pp=%d tp=%d", l.DP, l.PP, l.TP) }

// Validate checks l against a world of world ranks and a model.
func (l Layout) Validate(world int, cfg transformer.Config) error {
	switch {
	case l.DP < 1 || l.PP < 1 || l.TP < 1:
		return fmt.Errorf("parallel: %v: every size must be at least 1: %w", l, ErrInvalidArgument)
	case l.DP*l.PP*l.TP != world:
		return fmt.Errorf("parallel: %v needs %d ranks, the job has %d: %w", l, l.DP*l.PP*l.TP, world, ErrInvalidArgument)
	case l.PP > cfg.NumLayers():
		return fmt.Errorf("parallel: %d pipeline stages for a model of %d layers: %w", l.PP, cfg.NumLayers(), ErrInvalidArgument)
	case l.PP > 1 && cfg.TiedHead:
		return fmt.Errorf("parallel: a tied head keeps layer 0 and layer %d in one stage: %w", cfg.HeadLayer(), ErrInvalidArgument)
	case cfg.Heads%l.TP != 0 || cfg.MLPHidden%l.TP != 0 || cfg.Vocab < l.TP:
		return fmt.Errorf("parallel: %d heads, MLP hidden %d and vocabulary %d do not split over %d tensor-parallel ranks: %w",
			cfg.Heads, cfg.MLPHidden, cfg.Vocab, l.TP, ErrInvalidArgument)
	}
	return nil
}

// Stages returns the layer range [from, to] of every pipeline stage of a
// model of numLayers layers: contiguous, earlier stages taking the extra
// layers.
func (l Layout) Stages(numLayers int) [][2]int {
	out := make([][2]int, l.PP)
	from := 0
	for s := range l.PP {
		n := numLayers/l.PP + btoi(s < numLayers%l.PP)
		out[s] = [2]int{from, from + n - 1}
		from += n
	}
	return out
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Groups are this rank's groups in a Layout: the mesh {dp, pp, tp} over the
// job's group, and its three lines through this rank.
type Groups struct {
	Mesh   *dist.Mesh
	Layout Layout
	// DP holds this rank's peers in the other replicas (same stage and
	// tensor-parallel member), PP the stages of this rank's pipeline (same
	// member), TP the members of this rank's stage.
	DP, PP, TP *dist.ProcessGroup
}

// NewGroups builds the mesh of l over pg: a collective over pg.
func NewGroups(ctx context.Context, pg *dist.ProcessGroup, l Layout) (*Groups, error) {
	if l.DP < 1 || l.PP < 1 || l.TP < 1 || l.DP*l.PP*l.TP != pg.WorldSize() {
		return nil, fmt.Errorf("parallel: %v on %d ranks: %w", l, pg.WorldSize(), ErrInvalidArgument)
	}
	m, err := dist.NewMesh(ctx, pg, dist.Dim{Name: "dp", Size: l.DP}, dist.Dim{Name: "pp", Size: l.PP}, dist.Dim{Name: "tp", Size: l.TP})
	if err != nil {
		return nil, fmt.Errorf("parallel: %w", err)
	}
	return &Groups{Mesh: m, Layout: l, DP: m.Group("dp"), PP: m.Group("pp"), TP: m.Group("tp")}, nil
}

// Close closes the mesh's groups (not the job's group).
func (g *Groups) Close() error { return g.Mesh.Close() }

// Option configures NewTrainer and NewGenerator. Each option checks its
// value when applied; the constructor fails with the first refusal, an
// error matching ErrInvalidArgument.
type Option func(*config) error

type config struct {
	micro   int
	lr      float64
	clip    float64
	weights []checkpoint.Named
	lock    sync.Locker
	groups  int
}

var buildMu sync.Mutex

// setup applies opts and checks cfg and l against the job pg: the common
// start of NewTrainer and NewGenerator.
func setup(pg *dist.ProcessGroup, cfg transformer.Config, l Layout, opts []Option) (config, error) {
	c, err := newConfig(opts)
	if err != nil {
		return c, err
	}
	if err := cfg.Validate(); err != nil {
		return c, err
	}
	return c, l.Validate(pg.WorldSize(), cfg)
}

func newConfig(opts []Option) (config, error) {
	c := config{micro: 1, lr: 3e-3, clip: 1, lock: &buildMu, groups: 0}
	if err := options.Apply(&c, opts, "parallel", ErrInvalidArgument); err != nil {
		return c, err
	}
	return c, nil
}

// WithMicroBatches splits each replica's batch into m micro-batches for
// the pipeline (default 1). Each replica's batch must be a multiple of m.
func WithMicroBatches(m int) Option {
	return func(c *config) error {
		if m < 1 {
			return fmt.Errorf("parallel: WithMicroBatches(%d): %w", m, ErrInvalidArgument)
		}
		c.micro = m
		return nil
	}
}

// WithAdam sets the learning rate and element-wise clip of the Adam solver
// every rank steps its parameters with (defaults 3e-3 and 1, those of
// transformer.NewTrainer, whose training a Trainer reproduces).
func WithAdam(lr, clip float64) Option {
	return func(c *config) error {
		if !(lr >= 0) || !(clip >= 0) {
			return fmt.Errorf("parallel: WithAdam(%v, %v): %w", lr, clip, ErrInvalidArgument)
		}
		c.lr, c.clip = lr, clip
		return nil
	}
}

// WithWeights starts from a whole model's parameters (a single-process
// checkpoint's tensors) instead of the seeded initialisation: each rank
// keeps its stage's layers, split as its tensor-parallel member holds them
// (sharding on load). ts is not retained.
func WithWeights(ts []checkpoint.Named) Option {
	return func(c *config) error {
		if len(ts) == 0 {
			return fmt.Errorf("parallel: WithWeights: no tensors: %w", ErrInvalidArgument)
		}
		c.weights = ts
		return nil
	}
}

// WithBuildLock builds graphs under l (default: this package's own lock).
// In-process tests that build graphs in several goroutines pass the lock
// their other graph construction uses.
func WithBuildLock(l sync.Locker) Option {
	return func(c *config) error {
		if l == nil {
			return fmt.Errorf("parallel: WithBuildLock(nil): %w", ErrInvalidArgument)
		}
		c.lock = l
		return nil
	}
}

// WithGroups sets how many groups of requests a Generator keeps in flight
// in its pipeline (default: the number of stages, so that every stage has
// work).
func WithGroups(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("parallel: WithGroups(%d): %w", n, ErrInvalidArgument)
		}
		c.groups = n
		return nil
	}
}
