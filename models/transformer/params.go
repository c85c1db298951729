package transformer

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"

	"gorgonia.org/tensor"
)

// LayerName returns the name prefix of layer l, "layer%02d" (for example
// "layer03"). Every parameter of layer l is named LayerName(l)+"."+suffix.
func LayerName(l int) string { return fmt.Sprintf("layer%02d", l) }

// LayerOf returns the layer index encoded in a parameter name such as
// "layer03.attn.wq", and false if name has no layer prefix.
func LayerOf(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, "layer")
	if !ok {
		return 0, false
	}
	digits, _, ok := strings.Cut(rest, ".")
	if !ok || digits == "" {
		return 0, false
	}
	l, err := strconv.Atoi(digits)
	if err != nil || l < 0 || LayerName(l) != "layer"+digits {
		return 0, false
	}
	return l, true
}

// initKind says how a parameter is initialised.
type initKind uint8

const (
	initNormal initKind = iota // N(0, std²)
	initZeros
	initOnes
)

// paramSpec describes one learnable tensor.
type paramSpec struct {
	name  string
	shape tensor.Shape
	init  initKind
	std   float64
}

// paramSpecs lists the parameters of layer l in their canonical order (see
// ParamNames).
func paramSpecs(c Config, l int) []paramSpec {
	p := LayerName(l) + "."
	d, v := c.Dim, c.Vocab
	const std = 0.02
	// GPT-2 scales the residual projections by 1/sqrt(2L).
	resStd := std / math.Sqrt(2*float64(max(c.Layers, 1)))
	switch {
	case l == 0:
		return []paramSpec{
			{p + "tok_emb", tensor.Shape{v, d}, initNormal, std},
			{p + "pos_emb", tensor.Shape{c.Ctx, d}, initNormal, std},
		}
	case l <= c.Layers:
		h := c.MLPHidden
		return []paramSpec{
			{p + "ln1.g", tensor.Shape{d}, initOnes, 0},
			{p + "ln1.b", tensor.Shape{d}, initZeros, 0},
			{p + "attn.wq", tensor.Shape{d, d}, initNormal, std},
			{p + "attn.wk", tensor.Shape{d, d}, initNormal, std},
			{p + "attn.wv", tensor.Shape{d, d}, initNormal, std},
			{p + "attn.wo", tensor.Shape{d, d}, initNormal, resStd},
			{p + "attn.bo", tensor.Shape{d}, initZeros, 0},
			{p + "ln2.g", tensor.Shape{d}, initOnes, 0},
			{p + "ln2.b", tensor.Shape{d}, initZeros, 0},
			{p + "mlp.w1", tensor.Shape{d, h}, initNormal, std},
			{p + "mlp.b1", tensor.Shape{h}, initZeros, 0},
			{p + "mlp.w2", tensor.Shape{h, d}, initNormal, resStd},
			{p + "mlp.b2", tensor.Shape{d}, initZeros, 0},
		}
	case l == c.Layers+1:
		specs := []paramSpec{
			{p + "ln.g", tensor.Shape{d}, initOnes, 0},
			{p + "ln.b", tensor.Shape{d}, initZeros, 0},
		}
		if !c.TiedHead {
			specs = append(specs, paramSpec{p + "head.w", tensor.Shape{d, v}, initNormal, std})
		}
		return append(specs, paramSpec{p + "head.b", tensor.Shape{v}, initZeros, 0})
	}
	return nil
}

// ParamNames returns the names of the parameters of layers from..to
// (inclusive) in canonical order, layer by layer. For layer prefix "layerNN.":
//
//	layer 0:     tok_emb [Vocab, Dim], pos_emb [Ctx, Dim]
//	layer 1..L:  ln1.g, ln1.b [Dim]; attn.wq, attn.wk, attn.wv, attn.wo [Dim, Dim];
//	             attn.bo [Dim]; ln2.g, ln2.b [Dim]; mlp.w1 [Dim, MLPHidden];
//	             mlp.b1 [MLPHidden]; mlp.w2 [MLPHidden, Dim]; mlp.b2 [Dim]
//	layer L+1:   ln.g, ln.b [Dim]; head.w [Dim, Vocab] (absent if TiedHead); head.b [Vocab]
//
// Weights multiply from the right (y = x·W). The caller owns the returned
// slice.
func ParamNames(c Config, from, to int) []string {
	var names []string
	for l := max(from, 0); l <= min(to, c.NumLayers()-1); l++ {
		for _, p := range paramSpecs(c, l) {
			names = append(names, p.name)
		}
	}
	return names
}

// initTensor returns the initial value of p for config c: a dense tensor of
// c.Dtype drawn from a PCG generator seeded with (c.Seed, FNV-64a(name)).
func initTensor(c Config, p paramSpec) *tensor.Dense {
	n := p.shape.TotalSize()
	vals := make([]float64, n)
	switch p.init {
	case initOnes:
		for i := range vals {
			vals[i] = 1
		}
	case initNormal:
		h := fnv.New64a()
		h.Write([]byte(p.name))
		rng := rand.New(rand.NewPCG(c.Seed, h.Sum64()))
		for i := range vals {
			vals[i] = rng.NormFloat64() * p.std
		}
	}
	var back any = vals
	if c.Dtype == Float32 {
		f := make([]float32, n)
		for i, x := range vals {
			f[i] = float32(x)
		}
		back = f
	}
	return tensor.New(tensor.WithShape(p.shape.Clone()...), tensor.WithBacking(back))
}

// ParamShape returns the shape of parameter name in the whole model of c
// (see ParamNames), and false if c has no such parameter.
func ParamShape(c Config, name string) (tensor.Shape, bool) {
	l, ok := LayerOf(name)
	if !ok {
		return nil, false
	}
	for _, p := range paramSpecs(c, l) {
		if p.name == name {
			return p.shape.Clone(), true
		}
	}
	return nil, false
}
