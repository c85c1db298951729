package pipeline

import (
	"testing"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/models/transformer"
)

// tinyConfig is a transformer small enough for exact comparisons: 2 blocks,
// so 4 pipeline layers (embedding, block, block, head).
var tinyConfig = transformer.Config{Vocab: 11, Ctx: 4, Dim: 8, Heads: 2, Layers: 2, MLPHidden: 16,
	Dtype: transformer.Float64, Seed: 3}

// tokens returns the input and target token ids of sequence seq of step
// `step`.
func tokens(cfg transformer.Config, step, seq int) (in, tgt []int) {
	for t := range cfg.Ctx {
		in = append(in, (7*seq+3*t+5*step+1)%cfg.Vocab)
		tgt = append(tgt, (5*seq+2*t+3*step+4)%cfg.Vocab)
	}
	return in, tgt
}

func transformerModel(cfg transformer.Config) testModel {
	return testModel{
		Layers: cfg.NumLayers(),
		Build: func(from, to, n int) Builder {
			return func(g *gorgonia.ExprGraph) (Stage, error) {
				return transformer.NewStage(g, cfg, from, to-1, n)
			}
		},
		Loss: transformer.CrossEntropy,
		Data: func(step, n int, out func(mb int, o *tensor.Dense) error) Data {
			ids := func(mb int, target bool) []int {
				var all []int
				for seq := mb * n; seq < (mb+1)*n; seq++ {
					in, tgt := tokens(cfg, step, seq)
					if target {
						in = tgt
					}
					all = append(all, in...)
				}
				return all
			}
			return Data{
				Input:  func(mb int, in *tensor.Dense) error { return transformer.FillOneHot(in, ids(mb, false)) },
				Target: func(mb int, t *tensor.Dense) error { return transformer.FillOneHot(t, ids(mb, true)) },
				Output: out,
			}
		},
	}
}

// *transformer.Stage is a Stage as it is.
var _ Stage = (*transformer.Stage)(nil)

func TestTransformerTrainMatchesSingleProcess(t *testing.T) {
	checkTraining(t, transformerModel(tinyConfig), 4, []int{2, 3, 4}, []int{1, 2, 4})
}

func TestTransformerInferMatchesSingleProcess(t *testing.T) {
	checkInfer(t, transformerModel(tinyConfig), 4, []int{2, 4}, []int{1, 4})
}
