package transformer

import (
	"context"
	"fmt"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/train/checkpoint"
)

// Predictor runs a full model forward on one sequence at a time, for
// generation; it implements Runner. It is not safe for concurrent use.
type Predictor struct {
	stage  *Stage
	input  *gorgonia.Node
	logits *gorgonia.Node
	vm     gorgonia.VM
	ids    []int
}

var _ Runner = (*Predictor)(nil)

// NewPredictor builds a batch-1 forward graph for cfg. If weights is nil the
// parameters keep their seeded initialisation; otherwise they are copied
// from weights (see Stage.SetWeights).
func NewPredictor(cfg Config, weights []checkpoint.Named) (*Predictor, error) {
	buildMu.Lock()
	defer buildMu.Unlock()
	g := gorgonia.NewGraph()
	st, err := NewStage(g, cfg, 0, cfg.HeadLayer(), 1)
	if err != nil {
		return nil, err
	}
	if weights != nil {
		if err := st.SetWeights(weights); err != nil {
			return nil, err
		}
	}
	p := &Predictor{stage: st, input: st.NewInput("input"), ids: make([]int, cfg.Ctx)}
	if p.logits, err = st.Forward(p.input); err != nil {
		return nil, err
	}
	p.vm = gorgonia.NewTapeMachine(g)
	return p, nil
}

// Stage returns the predictor's stage (to read or set its weights).
func (p *Predictor) Stage() *Stage { return p.stage }

// BlockSize returns the model's Ctx.
func (p *Predictor) BlockSize() int { return p.stage.cfg.Ctx }

// SetWeights copies weights into the model (see Stage.SetWeights).
func (p *Predictor) SetWeights(ts []checkpoint.Named) error { return p.stage.SetWeights(ts) }

// Forward runs the model on ids (1 <= len(ids) <= Ctx) and returns the
// logits of every position, len(ids) rows of Vocab values. ids are placed at
// positions 0..len(ids)-1 and the rest of the block is padded; causal
// attention makes the padding invisible to the returned rows. The caller
// owns the returned slice.
func (p *Predictor) Forward(ctx context.Context, ids []int) ([]float64, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("transformer: forward: %w", err)
	}
	if len(ids) == 0 || len(ids) > len(p.ids) {
		return nil, fmt.Errorf("%w: %d tokens for block size %d", ErrShape, len(ids), len(p.ids))
	}
	clear(p.ids)
	copy(p.ids, ids)
	if err := FillOneHot(p.input.Value().(*tensor.Dense), p.ids); err != nil {
		return nil, err
	}
	defer p.vm.Reset()
	if err := p.vm.RunAll(); err != nil {
		return nil, fmt.Errorf("transformer: forward: %w", err)
	}
	all, err := Float64s(p.logits)
	if err != nil {
		return nil, err
	}
	return all[:len(ids)*p.stage.cfg.Vocab], nil
}

// Logits returns the logits following window (1 <= len(window) <= Ctx).
// The caller owns the returned slice.
func (p *Predictor) Logits(ctx context.Context, window []int) ([]float64, error) {
	all, err := p.Forward(ctx, window)
	if err != nil {
		return nil, err
	}
	v := p.stage.cfg.Vocab
	return all[len(all)-v:], nil
}

// Close releases the predictor's machine.
func (p *Predictor) Close() error { return p.vm.Close() }
