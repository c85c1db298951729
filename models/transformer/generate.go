package transformer

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// Runner computes next-token logits. Predictor implements it for a full
// model in one process; a pipeline can implement it by running its stages.
type Runner interface {
	// BlockSize returns the longest window Logits accepts (the model's Ctx).
	BlockSize() int
	// Logits returns the logits (length Vocab) of the token that follows
	// window, 1 <= len(window) <= BlockSize(). The caller owns the returned
	// slice; window is not retained.
	Logits(ctx context.Context, window []int) ([]float64, error)
}

// NewRNG returns the generator Generate uses for a seed: PCG seeded with
// (seed, 0x9E3779B97F4A7C15). Two processes calling Sample with the same
// logits on generators from the same seed pick the same tokens.
func NewRNG(seed uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, 0x9E3779B97F4A7C15))
}

// Sample picks a token id from logits. With temperature <= 0 (or a nil rng)
// it returns the index of the largest logit (the lowest such index on ties)
// and consumes no randomness. Otherwise it draws one rng.Float64() and
// samples from softmax(logits / temperature). logits must not be empty; it
// is not modified.
func Sample(logits []float64, temperature float64, rng *rand.Rand) int {
	best := 0
	for i, l := range logits {
		if l > logits[best] {
			best = i
		}
	}
	if temperature <= 0 || rng == nil {
		return best
	}
	m := logits[best]
	probs := make([]float64, len(logits))
	var sum float64
	for i, l := range logits {
		p := math.Exp((l - m) / temperature)
		probs[i] = p
		sum += p
	}
	u := rng.Float64() * sum
	var acc float64
	for i, p := range probs {
		acc += p
		if u < acc {
			return i
		}
	}
	return best // u landed on the rounding gap at the very top
}

// Generate extends prompt by n tokens: at each step it runs r on the last
// r.BlockSize() tokens, picks the next token with Sample (greedy if
// temperature <= 0, else sampled with NewRNG(seed)) and appends it. It
// returns the n new tokens (the caller owns the slice); prompt is not
// modified. It checks ctx before every step.
func Generate(ctx context.Context, r Runner, prompt []int, n int, temperature float64, seed uint64) ([]int, error) {
	if len(prompt) == 0 {
		return nil, ErrEmptyPrompt
	}
	rng := NewRNG(seed)
	tokens := slices.Clone(prompt)
	bs := r.BlockSize()
	for range n {
		if err := ctx.Err(); err != nil {
			return tokens[len(prompt):], fmt.Errorf("transformer: generate: %w", err)
		}
		window := tokens[max(0, len(tokens)-bs):]
		logits, err := r.Logits(ctx, window)
		if err != nil {
			return tokens[len(prompt):], fmt.Errorf("transformer: generate: %w", err)
		}
		tokens = append(tokens, Sample(logits, temperature, rng))
	}
	return tokens[len(prompt):], nil
}
