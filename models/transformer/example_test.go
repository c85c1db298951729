package transformer_test

import (
	"fmt"

	"github.com/gdist/gdist/models/transformer"
)

func ExampleVocab() {
	v := transformer.NewVocab("hello world")
	ids, _ := v.Encode("hold")
	fmt.Println(v.Size(), ids, v.Decode(ids))
	// Output: 8 [3 5 4 1] hold
}

func ExampleParamNames() {
	cfg := transformer.Config{Vocab: 10, Ctx: 8, Dim: 8, Heads: 2, Layers: 2, MLPHidden: 16}
	// The parameters a pipeline stage holding only the output head loads.
	fmt.Println(transformer.ParamNames(cfg, cfg.HeadLayer(), cfg.HeadLayer()))
	l, _ := transformer.LayerOf("layer02.attn.wq")
	fmt.Println(l, cfg.NumLayers())
	// Output:
	// [layer03.ln.g layer03.ln.b layer03.head.w layer03.head.b]
	// 2 4
}

func ExampleSample() {
	logits := []float64{0.1, 2.5, -1, 2.4}
	fmt.Println(transformer.Sample(logits, 0, nil)) // greedy
	a := transformer.Sample(logits, 1.0, transformer.NewRNG(7))
	b := transformer.Sample(logits, 1.0, transformer.NewRNG(7))
	fmt.Println(a == b) // same seed, same choice
	// Output:
	// 1
	// true
}
