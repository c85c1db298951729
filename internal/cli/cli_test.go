package cli

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestExitCode(t *testing.T) {
	errUsage := errors.New("prog: usage")
	var buf bytes.Buffer
	assert.Equal(t, 0, ExitCode("prog", errUsage, nil, &buf))
	assert.Equal(t, 0, ExitCode("prog", errUsage, flag.ErrHelp, &buf))
	assert.Equal(t, 2, ExitCode("prog", errUsage, fmt.Errorf("x: %w", errUsage), &buf))
	assert.Empty(t, buf.String())
	assert.Equal(t, 1, ExitCode("prog", errUsage, errors.New("boom"), &buf))
	assert.Equal(t, "prog: error: boom\n", buf.String())
}
