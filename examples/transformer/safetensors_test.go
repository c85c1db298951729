package main

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/models/transformer"
)

// TestConvertSafetensors: convert writes the checkpoint as safetensors and
// back, bitwise; generate reads the .safetensors file directly and, on one
// process, a 2-stage pipeline and a 2-stage cached pipeline, writes the
// checkpoint's text.
func TestConvertSafetensors(t *testing.T) {
	ckpt := tinyCheckpoint(t)
	dir := t.TempDir()
	st := filepath.Join(dir, "m.safetensors")
	back := filepath.Join(dir, "back.gdc")
	for _, args := range [][]string{{"-in", ckpt, "-out", st}, {"-in", st, "-out", back}} {
		var stdout, stderr bytes.Buffer
		require.NoError(t, run(context.Background(), append([]string{"convert"}, args...), &stdout, &stderr), stderr.String())
		assert.Contains(t, stdout.String(), "convert: "+args[1]+" -> "+args[3]+": ")
	}
	a, err := transformer.Load(ckpt)
	require.NoError(t, err)
	b, err := transformer.Load(back)
	require.NoError(t, err)
	assert.Equal(t, a.Config, b.Config)
	assert.Equal(t, a.Step, b.Step)
	require.Equal(t, len(a.Tensors), len(b.Tensors))
	for i := range a.Tensors {
		assert.Equal(t, a.Tensors[i].Name, b.Tensors[i].Name)
		assert.Equal(t, a.Tensors[i].Tensor.(*tensor.Dense).Data(), b.Tensors[i].Tensor.(*tensor.Dense).Data(), a.Tensors[i].Name)
	}

	base := genConfig{Ckpt: ckpt, Prompt: "Light is", N: 30, Temperature: 0.8, Seed: 4, NoCache: true}
	want := genOnRanks(t, 1, base).Text
	for _, tc := range []struct {
		n       int
		noCache bool
	}{{1, true}, {2, true}, {2, false}} {
		cfg := base
		cfg.Ckpt, cfg.NoCache = st, tc.noCache
		assert.Equal(t, want, genOnRanks(t, tc.n, cfg).Text, "%d ranks, no cache %v", tc.n, tc.noCache)
	}

	var stdout, stderr bytes.Buffer
	err = run(context.Background(), []string{"convert", "-in", ckpt, "-out", ckpt}, &stdout, &stderr)
	assert.ErrorIs(t, err, errUsage)
}
