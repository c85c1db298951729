package transformer

import (
	"fmt"
	"io"

	"github.com/gdist/gdist/train/checkpoint"
)

// FormatName identifies transformer checkpoints in the checkpoint config.
const FormatName = "gdist.transformer"

// Checkpoint is a model on disk: configuration, vocabulary, training step
// and named parameters (names as in ParamNames).
type Checkpoint struct {
	Config Config
	// Vocab is the tokenizer; nil if the model was trained on raw ids.
	Vocab *Vocab
	// Step is the number of training steps taken (informational).
	Step int64
	// Tensors are the parameters. After Load or LoadLayers they are
	// *tensor.Dense values owned by the caller.
	Tensors []checkpoint.Named
}

// ckptHeader is the JSON stored as the checkpoint config.
type ckptHeader struct {
	Format string `json:"format"`
	Model  Config `json:"model"`
	Vocab  *Vocab `json:"vocab,omitempty"`
	Step   int64  `json:"step"`
}

func (ck *Checkpoint) header() (ckptHeader, error) {
	if err := ck.Config.Validate(); err != nil {
		return ckptHeader{}, err
	}
	if ck.Vocab != nil && ck.Vocab.Size() != ck.Config.Vocab {
		return ckptHeader{}, fmt.Errorf("transformer: %w: vocabulary of %d runes for config vocab %d", ErrInvalidArgument, ck.Vocab.Size(), ck.Config.Vocab)
	}
	return ckptHeader{Format: FormatName, Model: ck.Config, Vocab: ck.Vocab, Step: ck.Step}, nil
}

// Write encodes ck to w in the train/checkpoint format.
func Write(w io.Writer, ck *Checkpoint) error {
	h, err := ck.header()
	if err != nil {
		return err
	}
	return checkpoint.Write(w, h, ck.Tensors)
}

// Save writes ck to path atomically (see checkpoint.Save).
func Save(path string, ck *Checkpoint) error {
	h, err := ck.header()
	if err != nil {
		return err
	}
	return checkpoint.Save(path, h, ck.Tensors)
}

// Load reads a whole model checkpoint and checks that it holds every
// parameter of its config (else an error matching
// checkpoint.ErrMissingTensor).
func Load(path string) (*Checkpoint, error) {
	f, err := checkpoint.Load(path)
	if err != nil {
		return nil, err
	}
	return fromFile(f, 0, -1)
}

// LoadLayers reads the configuration and only the parameters of layers
// from..to (inclusive) of a model checkpoint, for a pipeline stage: other
// tensors are not read. Layer indices are as in NewStage; to == -1 means the
// last layer. It checks that every parameter of those layers is present.
func LoadLayers(path string, from, to int) (*Checkpoint, error) {
	f, err := checkpoint.LoadSubset(path, func(name string) bool {
		l, ok := LayerOf(name)
		return ok && l >= from && (to == -1 || l <= to)
	})
	if err != nil {
		return nil, err
	}
	return fromFile(f, from, to)
}

// LoadConfig reads only the header of a model checkpoint — configuration,
// vocabulary (nil if the model was saved without one) and training step —
// and no tensor data, for instance so that a pipeline rank can learn the
// model's layers before choosing and loading its own (LoadLayers). A file
// that is not a transformer checkpoint is an error matching ErrFormat; a
// corrupt header matches checkpoint.ErrCorrupt.
func LoadConfig(path string) (cfg Config, vocab *Vocab, step int64, err error) {
	f, err := checkpoint.LoadSubset(path, func(string) bool { return false })
	if err != nil {
		return Config{}, nil, 0, err
	}
	h, err := decodeHeader(f)
	if err != nil {
		return Config{}, nil, 0, err
	}
	return h.Model, h.Vocab, h.Step, nil
}

func decodeHeader(f *checkpoint.File) (ckptHeader, error) {
	var h ckptHeader
	if err := f.Config(&h); err != nil {
		return h, fmt.Errorf("%w: %w", ErrFormat, err)
	}
	if h.Format != FormatName {
		return h, fmt.Errorf("%w: format %q", ErrFormat, h.Format)
	}
	if err := h.Model.Validate(); err != nil {
		return h, err
	}
	if h.Vocab != nil && h.Vocab.Size() != h.Model.Vocab {
		return h, fmt.Errorf("transformer: %w: vocabulary of %d runes for config vocab %d", ErrInvalidArgument, h.Vocab.Size(), h.Model.Vocab)
	}
	return h, nil
}

func fromFile(f *checkpoint.File, from, to int) (*Checkpoint, error) {
	h, err := decodeHeader(f)
	if err != nil {
		return nil, err
	}
	cfg := h.Model
	if to == -1 {
		to = cfg.HeadLayer()
	}
	if from < 0 || to < from || to > cfg.HeadLayer() {
		return nil, fmt.Errorf("%w: [%d, %d] with %d layers", ErrLayerRange, from, to, cfg.NumLayers())
	}
	ck := &Checkpoint{Config: cfg, Vocab: h.Vocab, Step: h.Step, Tensors: f.Tensors()}
	for _, name := range ParamNames(cfg, from, to) {
		if _, err := f.Tensor(name); err != nil {
			return nil, err
		}
	}
	return ck, nil
}
