package transformer

import (
	"errors"
	"fmt"

	"gorgonia.org/tensor"

	"github.com/gdist/gdist/internal/errs"
)

// Errors returned by this package. Match them with errors.Is.
var (
	// ErrInvalidArgument is matched by the errors of an invalid Config or
	// option. It is the value every gdist package exports under this name
	// (errs.ErrInvalidArgument).
	ErrInvalidArgument = errs.ErrInvalidArgument
	// ErrLayerRange means a stage's layer range is invalid for its config.
	ErrLayerRange = errors.New("transformer: invalid layer range")
	// ErrTiedSplit means a tied-head model was split so that the embedding
	// and the output head are in different stages.
	ErrTiedSplit = errors.New("transformer: tied head needs the embedding and the head in one stage")
	// ErrShape means a tensor, input or batch has the wrong shape or length.
	ErrShape = errors.New("transformer: shape mismatch")
	// ErrUnknownRune means text contains a rune that is not in the vocabulary.
	ErrUnknownRune = errors.New("transformer: rune not in vocabulary")
	// ErrToken means a token id is outside [0, vocab size).
	ErrToken = errors.New("transformer: token id out of range")
	// ErrEmptyPrompt means Generate was called without a prompt.
	ErrEmptyPrompt = errors.New("transformer: empty prompt")
	// ErrHook means a Hook returned a node that cannot stand for its
	// parameter (nil, another graph, another shape or dtype).
	ErrHook = errors.New("transformer: invalid hook result")
	// ErrFormat means a checkpoint does not hold a transformer model.
	ErrFormat = errors.New("transformer: not a transformer checkpoint")
)

// Dtype is the floating-point type of a model's parameters and activations.
// The zero value is Float32. It marshals to JSON as "float32" or "float64".
type Dtype uint8

// Supported element types.
const (
	Float32 Dtype = iota
	Float64
)

// Tensor returns the corresponding tensor.Dtype.
func (d Dtype) Tensor() tensor.Dtype {
	if d == Float64 {
		return tensor.Float64
	}
	return tensor.Float32
}

// String returns "float32" or "float64".
func (d Dtype) String() string {
	switch d {
	case Float32:
		return "float32"
	case Float64:
		return "float64"
	}
	return fmt.Sprintf("Dtype(%d)", uint8(d))
}

// MarshalText implements encoding.TextMarshaler.
func (d Dtype) MarshalText() ([]byte, error) {
	if d != Float32 && d != Float64 {
		return nil, fmt.Errorf("transformer: %w: dtype %d", ErrInvalidArgument, uint8(d))
	}
	return []byte(d.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Dtype) UnmarshalText(b []byte) error {
	switch string(b) {
	case "float32":
		*d = Float32
	case "float64":
		*d = Float64
	default:
		return fmt.Errorf("transformer: %w: dtype %q", ErrInvalidArgument, b)
	}
	return nil
}

// Config describes a decoder-only transformer. Its JSON form is stored in
// checkpoints.
type Config struct {
	// Vocab is the vocabulary size (number of distinct token ids).
	Vocab int `json:"vocab"`
	// Ctx is the block size: the sequence length every forward pass uses.
	Ctx int `json:"ctx"`
	// Dim is the width of the residual stream (embedding size).
	Dim int `json:"dim"`
	// Heads is the number of attention heads; it must divide Dim.
	Heads int `json:"heads"`
	// Layers is the number of transformer blocks.
	Layers int `json:"layers"`
	// MLPHidden is the width of each block's MLP hidden layer.
	MLPHidden int `json:"mlp_hidden"`
	// Dtype is the element type of parameters and activations.
	Dtype Dtype `json:"dtype"`
	// Seed determines the initial parameters. Each tensor is initialised
	// from its own generator seeded with (Seed, tensor name), so a stage
	// holding some layers gets exactly the values the full model has.
	Seed uint64 `json:"seed"`
	// TiedHead makes the output head reuse the token embedding (transposed)
	// instead of a separate matrix. A tied model can only be split so that
	// layer 0 and layer Layers+1 are in the same stage.
	TiedHead bool `json:"tied_head"`
}

// DefaultConfig returns the small configuration that learns visibly on a few
// hundred KB of English text in a few minutes on one or two CPU cores:
// Ctx 64, Dim 64, 4 heads, 2 layers, MLP 256, float32.
func DefaultConfig(vocab int) Config {
	return Config{Vocab: vocab, Ctx: 64, Dim: 64, Heads: 4, Layers: 2, MLPHidden: 256, Dtype: Float32, Seed: 1}
}

// Validate reports whether c describes a model this package can build. The
// error matches ErrInvalidArgument.
func (c Config) Validate() error {
	switch {
	case c.Vocab < 2:
		return fmt.Errorf("transformer: %w: vocab %d < 2", ErrInvalidArgument, c.Vocab)
	case c.Ctx < 2:
		return fmt.Errorf("transformer: %w: ctx %d < 2", ErrInvalidArgument, c.Ctx)
	case c.Dim < 2:
		return fmt.Errorf("transformer: %w: dim %d < 2", ErrInvalidArgument, c.Dim)
	case c.Heads < 1 || c.Dim%c.Heads != 0:
		return fmt.Errorf("transformer: %w: %d heads do not divide dim %d", ErrInvalidArgument, c.Heads, c.Dim)
	case c.Layers < 0:
		return fmt.Errorf("transformer: %w: layers %d < 0", ErrInvalidArgument, c.Layers)
	case c.MLPHidden < 1:
		return fmt.Errorf("transformer: %w: mlp hidden %d < 1", ErrInvalidArgument, c.MLPHidden)
	case c.Dtype != Float32 && c.Dtype != Float64:
		return fmt.Errorf("transformer: %w: dtype %d", ErrInvalidArgument, uint8(c.Dtype))
	}
	return nil
}

// NumLayers returns the number of pipeline layers, Layers+2: layer 0 is the
// embedding, layers 1..Layers are the transformer blocks and layer
// Layers+1 is the final layer norm and output head.
func (c Config) NumLayers() int { return c.Layers + 2 }

// HeadLayer returns the index of the output-head layer, Layers+1.
func (c Config) HeadLayer() int { return c.Layers + 1 }

// HeadDim returns Dim / Heads.
func (c Config) HeadDim() int { return c.Dim / c.Heads }

// NumParams returns the number of scalar parameters of the full model.
func (c Config) NumParams() int {
	n := 0
	for l := 0; l < c.NumLayers(); l++ {
		for _, p := range paramSpecs(c, l) {
			n += p.shape.TotalSize()
		}
	}
	return n
}
