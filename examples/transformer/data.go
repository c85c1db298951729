package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gdist/gdist/models/transformer"
)

// opticksRel is where the Go toolchain ships Newton's Opticks, relative to
// GOROOT.
var opticksRel = filepath.Join("src", "testdata", "Isaac.Newton-Opticks.txt")

// errNoText means the training text was not found.
var errNoText = errors.New("transformer: training text not found")

// defaultTextPath returns $GOROOT/src/testdata/Isaac.Newton-Opticks.txt,
// with GOROOT from the environment, else `go env GOROOT`, else the GOROOT
// this binary was built with.
func defaultTextPath() string {
	root := os.Getenv("GOROOT")
	if root == "" {
		if out, err := goEnvGOROOT(); err == nil {
			root = out
		}
	}
	if root == "" {
		root = runtime.GOROOT() //nolint:staticcheck // last resort: where the toolchain that built us lives
	}
	return filepath.Join(root, opticksRel)
}

// goEnvGOROOT runs `go env GOROOT` (bounded in time).
func goEnvGOROOT() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "env", "GOROOT").Output()
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
}

// loadText reads the training text at path (the default when empty). A
// missing file is an error matching errNoText that names the path and the
// -text flag.
func loadText(path string) (string, string, error) {
	if path == "" {
		path = defaultTextPath()
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", path, fmt.Errorf("%w: %s does not exist (pass a UTF-8 text file with -text)", errNoText, path)
	}
	if err != nil {
		return "", path, fmt.Errorf("transformer: reading the training text: %w", err)
	}
	if !utf8.Valid(b) {
		return "", path, fmt.Errorf("transformer: %s is not valid UTF-8", path)
	}
	return string(b), path, nil
}

// corpus is the tokenised text, split into a training head and a held-out
// validation tail.
type corpus struct {
	Vocab      *transformer.Vocab
	Train, Val []int
}

// newCorpus tokenises text and holds out its last valFrac for validation.
// Both parts must hold more than ctx tokens.
func newCorpus(text string, valFrac float64, ctx int) (*corpus, error) {
	if !(valFrac > 0 && valFrac < 1) {
		return nil, fmt.Errorf("transformer: validation fraction %g not in (0, 1)", valFrac)
	}
	vocab := transformer.NewVocab(text)
	ids, err := vocab.Encode(text)
	if err != nil {
		return nil, err
	}
	nVal := int(float64(len(ids)) * valFrac)
	c := &corpus{Vocab: vocab, Train: ids[:len(ids)-nVal], Val: ids[len(ids)-nVal:]}
	if len(c.Train) <= ctx || len(c.Val) <= ctx {
		return nil, fmt.Errorf("transformer: %d training and %d validation tokens: each part needs more than the context of %d",
			len(c.Train), len(c.Val), ctx)
	}
	return c, nil
}
