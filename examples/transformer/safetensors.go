package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/gdist/gdist/models/transformer"
)

// isSafetensors reports whether path names a safetensors file: by its
// extension, .safetensors.
func isSafetensors(path string) bool { return strings.HasSuffix(path, ".safetensors") }

// saveModel writes ck to path, as safetensors if the name says so
// (transformer.SaveSafetensors), else as a gdist checkpoint, creating the
// directory.
func saveModel(path string, ck *transformer.Checkpoint) error {
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("transformer: %w", err)
		}
	}
	if isSafetensors(path) {
		return transformer.SaveSafetensors(path, ck)
	}
	return transformer.Save(path, ck)
}

// loadModel reads a whole model from a gdist checkpoint or a safetensors
// file (heads: the number of attention heads, for a safetensors file that
// does not record its configuration).
func loadModel(path string, heads int) (*transformer.Checkpoint, error) {
	if isSafetensors(path) {
		return transformer.LoadSafetensors(path, heads)
	}
	return transformer.Load(path)
}

// loadConfig reads a model's configuration, vocabulary and step: from a
// gdist checkpoint's header alone, or from a safetensors file.
func loadConfig(path string, heads int) (transformer.Config, *transformer.Vocab, int64, error) {
	if isSafetensors(path) {
		ck, err := transformer.LoadSafetensors(path, heads)
		if err != nil {
			return transformer.Config{}, nil, 0, err
		}
		return ck.Config, ck.Vocab, ck.Step, nil
	}
	return transformer.LoadConfig(path)
}

// loadLayers reads the tensors of layers from..to of a model: only those
// from a gdist checkpoint; a safetensors file is read whole and the rest
// dropped.
func loadLayers(path string, from, to, heads int) (*transformer.Checkpoint, error) {
	if !isSafetensors(path) {
		return transformer.LoadLayers(path, from, to)
	}
	ck, err := transformer.LoadSafetensors(path, heads)
	if err != nil {
		return nil, err
	}
	mine := ck.Tensors[:0]
	for _, t := range ck.Tensors {
		if l, ok := transformer.LayerOf(t.Name); ok && l >= from && l <= to {
			mine = append(mine, t)
		}
	}
	ck.Tensors = mine
	return ck, nil
}

// runConvert is the convert command.
func runConvert(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("convert", flag.ContinueOnError)
	fs.SetOutput(stderr)
	in := fs.String("in", defaultCkpt, "model to read: a gdist checkpoint, or a .safetensors file")
	out := fs.String("out", "", "model to write: a .safetensors file, or a gdist checkpoint")
	heads := fs.Int("heads", 0, "attention heads of a .safetensors model that does not record its configuration (a GPT-2-like file from elsewhere)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: transformer convert -in FILE -out FILE [-heads N]

Converts a model between gdist's checkpoint format and safetensors, the
format torch and Hugging Face share, the kind of each file told by its
extension (.safetensors, else a gdist checkpoint). Parameters are named as
Hugging Face's GPT-2 names them (see models/transformer's documentation);
the configuration and vocabulary travel in the file's metadata.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if *out == "" || *in == *out {
		return usageError(fs, stderr, "-out must name a file other than -in")
	}
	ck, err := loadModel(*in, *heads)
	if err != nil {
		if errors.Is(err, transformer.ErrFormat) && isSafetensors(*in) && *heads == 0 {
			return fmt.Errorf("%w (give -heads for a file from elsewhere)", err)
		}
		return err
	}
	if err := saveModel(*out, ck); err != nil {
		return err
	}
	c := ck.Config
	fmt.Fprintf(stdout, "convert: %s -> %s: %d parameters (vocabulary %d, context %d, width %d, %d heads, %d blocks, MLP %d, %s), step %d\n",
		*in, *out, c.NumParams(), c.Vocab, c.Ctx, c.Dim, c.Heads, c.Layers, c.MLPHidden, c.Dtype, ck.Step)
	return nil
}
